"""Batch prediction with an already registered model version (master side), without training.

    batch_predict(config_path="federation.yaml", version="production", agents="running")

Agents are started or reached as in `flows.retrain`; each institution checks its data contract, loads its
own partial model of the version, and the predictions land, with IDs, only at the requester. In the
horizontal setting every institution loads the complete model and predicts its own new rows at home.
"""

from __future__ import annotations

from datetime import datetime

from prefect import flow
from prefect.states import State

from fedcore.config import load_config
from fedcore.open_session import open_session
from flows import RETURNED_SUMMARY
from flows.federation_lock import holding_federation
from flows.hooks import write_failure_artifact
from flows.session import agent_session
from flows.ui import finished, name_run, predict_outcome, run_name
from tasks.registry import master_registry
from tasks.session import load_registered_model, predict


@flow(name="batch-predict", flow_run_name=run_name("predict"), on_failure=[write_failure_artifact],
      log_prints=True, **RETURNED_SUMMARY)
def batch_predict(config_path: str, model_name: str | None = None, version: str = "production",
                  requester: str | None = None, agents: str = "running",
                  until: datetime | None = None) -> State:
    """Predict the institutions' new rows with a registered version; calling it returns a JSON-ready summary.

    `until` ends the batch an institution's `predict_data` query selects by time (`:until`; the agent
    tracks `:since`, `fedcore.agents.batches`); default: this run's scheduled start time, so a scheduled
    run reads the rows up to its schedule and a retry reads the same ones.

    The run is named `predict <model> <version>`; its final state's message says where how many predictions
    went. The summary is persisted as the run's result (JSON), and the run waits while another run of the
    same federation has its agents, as `retrain` does.
    """
    config = load_config(config_path)
    model_name = model_name or config.model_name
    requester = requester or config.prediction_requester
    names = [i.name for i in config.institutions]
    if requester not in names:
        raise ValueError(f"requester {requester!r} is not an institution of {config.federation!r} ({names})")
    if until is not None and until.tzinfo is None:  # from the UI or a deployment: every agent would refuse it
        raise ValueError(f"until {until.isoformat()} has no time zone: give one, e.g. "
                         f"{until.isoformat()}+00:00 for UTC")
    # a missing version fails before any agent starts
    purpose = f"predict {model_name} {master_registry(config).resolve(model_name, version)}"
    name_run(purpose)  # and its agent runs `<institution>: predict <model> <version>`
    # one run of a federation at a time: they share its agents' ports
    with (holding_federation(config.federation),
          agent_session(config, agents, purpose) as (transport, validation)):
        session = open_session(config, transport)
        resolved = load_registered_model(config, session, model_name, version)
        prediction = predict(session, requester, until)
        session.close()
    summary = {"model": model_name, "version": resolved, "ref": version, "validation": validation,
               "prediction": prediction}
    return finished(predict_outcome(model_name, resolved, prediction), summary)
