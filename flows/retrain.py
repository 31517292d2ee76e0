"""The scheduled retrain pipeline (master side).

It starts agents, validates, aligns (vertical) or agrees the schema (horizontal), trains, evaluates,
registers, promotes when not worse than production, then batch predicts (vertical: for the requester;
horizontal: every institution locally).

    retrain(config_path="federation.yaml", agents="deployments" | "local" | "running")

"deployments" starts each institution's agent flow on its own work pool (production); "local" starts
agents as processes on this machine (the embedded demo); "running" expects them up already.

Training (vertical and horizontal) is checkpointed under a run id: by default the Prefect flow-run id,
which a retry of the same flow run keeps, so a retried run resumes after a crash of the master or of an
agent. A new flow run resumes a crashed one when given its run id (`run_id=` or `fedforest retrain
--run-id`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import partial

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.states import State

from fedcore.checkpoints import CHECKPOINTS
from fedcore.config import FederationConfig, load_config
from fedcore.errors import PartyUnavailable
from fedcore.models.card import build_manifest
from fedcore.names import check_name
from fedcore.open_session import open_session
from flows import RETURNED_SUMMARY
from flows.federation_lock import holding_federation
from flows.hooks import write_failure_artifact
from flows.session import agent_session
from flows.ui import finished, name_run, retrain_outcome, run_name
from tasks.agents import name_agent_runs
from tasks.registry import (
    master_registry,
    previous_production,
    promote_if_not_worse,
    publish_model_card,
    publish_pictures,
    register_model,
)
from tasks.session import evaluate, prepare, train
from tasks.session import predict as predict_task


@flow(name="retrain", flow_run_name=run_name("retrain"), on_failure=[write_failure_artifact],
      log_prints=True, **RETURNED_SUMMARY)
def retrain(config_path: str, agents: str = "deployments", model_name: str | None = None,
            predict: bool = True, run_id: str | None = None) -> State:
    """Train a new model version for the federation in `config_path`; calling it returns a JSON-ready summary.

    The run is named `retrain <model> <version>` once the version is registered, and its final state's
    message gives the version and headline metric. The summary is persisted as the run's result (JSON), so
    `run_deployment(...).state.result()` returns it too. While another run of the same federation has
    its agents, this one waits (`flows.federation_lock`).

    `run_id` names the run's training checkpoints; default: this flow run's id. Pass the run id
    of a run that crashed (it is logged at its start) to resume it in a new flow run.
    """
    config = load_config(config_path)
    master_registry(config)  # no signing key: fail before any agent starts, not after training
    # the model name becomes a folder: checked before any training
    model_name = check_name(model_name or config.model_name, "model name")
    with holding_federation(config.federation):  # one run of a federation at a time: they share its ports
        summary = resuming(config, partial(session_attempt, config, agents, model_name, predict), run_id)
    return finished(retrain_outcome(model_name, summary["version"], summary["metrics"],
                                    config.promotion_metric, summary["promoted"], summary["production"]),
                    summary)


def resuming(config: FederationConfig, attempt: Callable[[str, list], dict],
             run_id: str | None = None) -> dict:
    """Run `attempt(run_id, reached)` (one session) with crash recovery, in either setting.

    When an institution is lost mid-session (its process died, the network failed), the session starts again
    (`training.resume_attempts` times) with the same run id, and training resumes from the last tree batch
    the master and every institution checkpointed. `attempt` appends to `reached` once every agent answered:
    an agent that never came up is not retried. `run_id`: default, this flow run's id.
    """
    if run_id is not None:
        check_name(run_id, "run id")
    run_id = str(run_id or flow_run.id or uuid.uuid4())  # stable across attempts: checkpoints are found again
    get_run_logger().info("training run id %s (pass run_id=%r to resume its checkpoints in a new flow run)",
                          run_id, run_id)
    attempts = config.training.resume_attempts + 1
    for number in range(1, attempts + 1):
        reached: list[bool] = []  # set once every agent answered: losing one then is what resuming is for
        try:
            return attempt(run_id, reached)
        except PartyUnavailable as exc:
            if not reached or number == attempts:
                raise
            get_run_logger().warning("%s; starting attempt %d of %d, resuming from the last checkpoint",
                                     exc, number + 1, attempts)
    raise AssertionError("unreachable")


def session_attempt(config: FederationConfig, agents: str, model_name: str, predict: bool, run_id: str,
                    reached: list) -> dict:
    """One session attempt, in either setting, from preparation to prediction.

    It prepares (aligns IDs, or agrees the schema), trains (checkpointed), evaluates, registers everywhere,
    promotes, and predicts (for the requester, or at every institution).
    """
    settings = config.training
    agent_runs: dict[str, str] = {}  # agents started as deployments: renamed once the version is known
    with agent_session(config, agents, f"retrain {model_name}", agent_runs) as (transport, validation):
        reached.append(True)
        session = open_session(config, transport)
        preparation = prepare(session)
        training = train(session, config.master_registry / CHECKPOINTS, run_id)
        metrics = evaluate(session)
        manifest = build_manifest(session, config.federation, metrics, validation)
        production = previous_production(config, model_name)
        version = register_model(config, session, model_name, manifest)
        name_run(f"retrain {model_name} {version}")
        name_agent_runs(agent_runs, f"retrain {model_name} {version}")
        promoted = promote_if_not_worse(config, model_name, version, metrics, production,
                                        config.promotion_metric, settings.promote_margin)
        prediction = None
        if predict and _has_new_rows(config):
            prediction = predict_task(session, config.prediction_requester)
        publish_model_card(model_name, version, manifest, production, promoted, prediction)
        publish_pictures(config, model_name, version)
        session.close()
    summary = {"model": model_name, "version": version, "promoted": promoted, "metrics": metrics,
               "production": _version_of(production), "validation": validation, "preparation": preparation,
               "training": training, "prediction": prediction}
    for entry in ("privacy", "boosting"):  # DP modes' ledgers; boosting's rounds, loss and early stopping
        if entry in manifest:
            summary[entry] = manifest[entry]
    return summary


def _has_new_rows(config: FederationConfig) -> bool:
    """Whether the run can batch predict.

    Vertically every institution needs new rows to align; horizontally each predicts whatever new rows it
    has.
    """
    return config.setting == "horizontal" or all(i.predict_data for i in config.institutions)


def _version_of(production: dict | None) -> dict | None:
    """The production version a run compared against: its version and metrics (None: there was none)."""
    if production is None:
        return None
    return {"version": production.get("version"), "metrics": production.get("metrics", {})}
