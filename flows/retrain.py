"""The scheduled retrain pipeline (master side): start agents, validate, align, train, evaluate,
register, promote when not worse than production, then batch predict.

    retrain(config_path="federation.yaml", agents="deployments" | "local" | "running")

"deployments" starts each institution's agent flow on its own work pool (production); "local" starts
agents as processes on this machine (the embedded demo); "running" expects them up already.
"""

from __future__ import annotations

from prefect import flow

from fedcore.config import load_config
from fedcore.vertical.session import VerticalSession
from flows.hooks import write_failure_artifact
from flows.session import agent_session
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
    settings = config.training
    model_name = model_name or config.model_name
    with agent_session(config, agents) as (transport, validation):
        session = VerticalSession(transport, config.params, holdout_fraction=settings.holdout,
                                  min_overlap=settings.min_overlap)
        alignment = align_ids(session)
        training = train_forest(session)
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
