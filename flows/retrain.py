"""The scheduled retrain pipeline (master side): start agents, validate, align (vertical) or agree the
schema (horizontal), train, evaluate, register, promote when not worse than production, then batch
predict (vertical: for the requester; horizontal: every institution locally).

    retrain(config_path="federation.yaml", agents="deployments" | "local" | "running")

"deployments" starts each institution's agent flow on its own work pool (production); "local" starts
agents as processes on this machine (the embedded demo); "running" expects them up already.
"""

from __future__ import annotations

import uuid

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from fedcore.checkpoints import CHECKPOINTS
from fedcore.config import FederationConfig, load_config
from fedcore.errors import PartyUnavailable
from fedcore.horizontal.session import HorizontalSession
from fedcore.vertical.session import VerticalSession
from flows.hooks import write_failure_artifact
from flows.session import agent_session
from tasks.horizontal import (
    agree_schema,
    build_horizontal_manifest,
    evaluate_horizontal,
    predict_locally,
    train_extra_trees,
)
from tasks.prediction import predict_batch
from tasks.registry import (
    build_manifest,
    previous_production,
    promote_if_not_worse,
    publish_model_card,
    register_model,
)
from tasks.training import align_ids, evaluate_model, train_forest


@flow(name="retrain", on_failure=[write_failure_artifact], log_prints=True)
def retrain(config_path: str, agents: str = "deployments", model_name: str | None = None,
            predict: bool = True) -> dict:
    """Train a new model version for the federation in `config_path`; returns a JSON-ready summary."""
    config = load_config(config_path)
    model_name = model_name or config.model_name
    if config.setting == "horizontal":
        return retrain_horizontal(config, agents, model_name, predict)
    return retrain_vertical(config, agents, model_name, predict)


def retrain_vertical(config: FederationConfig, agents: str, model_name: str, predict: bool) -> dict:
    """Federated Forest with crash recovery: when an institution is lost mid-session (its process died,
    the network failed), the session starts again (`training.resume_attempts` times) and training
    resumes from the last tree batch the master and every institution checkpointed."""
    run_id = str(flow_run.id or uuid.uuid4())  # stable across attempts: checkpoints are found again
    attempts = config.training.resume_attempts + 1
    for attempt in range(1, attempts + 1):
        reached = []  # set once every agent answered: losing one after that is what resuming is for
        try:
            return vertical_session(config, agents, model_name, predict, run_id, reached)
        except PartyUnavailable as exc:
            if not reached or attempt == attempts:
                raise
            get_run_logger().warning("%s; starting attempt %d of %d, resuming from the last checkpoint",
                                     exc, attempt + 1, attempts)
    raise AssertionError("unreachable")


def vertical_session(config: FederationConfig, agents: str, model_name: str, predict: bool, run_id: str,
                     reached: list) -> dict:
    """One attempt: align IDs, train (checkpointed), evaluate at the label holder, register, promote,
    predict for the requester."""
    settings = config.training
    with agent_session(config, agents) as (transport, validation):
        reached.append(True)
        session = VerticalSession(transport, config.params, holdout_fraction=settings.holdout,
                                  min_overlap=settings.min_overlap, alignment=config.alignment)
        alignment = align_ids(session)
        training = train_forest(session, config.master_registry / CHECKPOINTS, run_id)
        metrics = evaluate_model(session)
        manifest = build_manifest(config, session, metrics, validation, alignment, training)
        production = previous_production(config, model_name)
        version = register_model(config, session, model_name, manifest)
        promoted = promote_if_not_worse(config, model_name, version, metrics, production,
                                        config.promotion_metric, settings.promote_margin)
        requester = config.prediction_requester
        prediction = None
        if predict and all(i.predict_data for i in config.institutions):
            prediction = predict_batch(session, requester, f"{model_name}-{version}")
        publish_model_card(model_name, version, manifest, production, promoted, prediction)
        session.close()
    return {"model": model_name, "version": version, "promoted": promoted, "metrics": metrics,
            "validation": validation, "alignment": alignment, "training": training, "prediction": prediction}


def retrain_horizontal(config: FederationConfig, agents: str, model_name: str, predict: bool) -> dict:
    """Federated Extra-Trees or PPD-ERT: agree the schema from the contracts, train, evaluate at every
    institution, register the complete model everywhere, promote, predict locally at each institution."""
    settings = config.training
    with agent_session(config, agents) as (transport, validation):
        session = HorizontalSession(transport, config.params, algorithm=config.algorithm, privacy=config.privacy,
                                    holdout_fraction=settings.holdout)
        agreement = agree_schema(session)
        training = train_extra_trees(session)
        metrics = evaluate_horizontal(session)
        manifest = build_horizontal_manifest(config, session, metrics, validation, training)
        production = previous_production(config, model_name)
        version = register_model(config, session, model_name, manifest)
        promoted = promote_if_not_worse(config, model_name, version, metrics, production,
                                        config.promotion_metric, settings.promote_margin)
        prediction = predict_locally(session, f"{model_name}-{version}") if predict else None
        publish_model_card(model_name, version, manifest, production, promoted, prediction)
        session.close()
    return {"model": model_name, "version": version, "promoted": promoted, "metrics": metrics,
            "validation": validation, "agreement": agreement, "training": training, "prediction": prediction,
            "privacy": manifest["privacy"]}
