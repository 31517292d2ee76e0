"""Batch prediction with an already registered model version (master side), without training:

    batch_predict(config_path="federation.yaml", version="production", agents="running")

Agents are started or reached as in `flows.retrain`; each institution checks its data contract, loads its
own partial model of the version, and the predictions land, with IDs, only at the requester. In the
horizontal setting every institution loads the complete model and predicts its own new rows at home.
"""

from __future__ import annotations

from prefect import flow

from fedcore.config import load_config
from fedcore.horizontal.session import HorizontalSession
from fedcore.vertical.session import VerticalSession
from flows.hooks import write_failure_artifact
from flows.session import agent_session
from tasks.horizontal import predict_locally
from tasks.prediction import load_registered_model, predict_batch
from tasks.registry import master_registry


@flow(name="batch-predict", on_failure=[write_failure_artifact], log_prints=True)
def batch_predict(config_path: str, model_name: str | None = None, version: str = "production",
                  requester: str | None = None, agents: str = "running") -> dict:
    """Predict the institutions' new rows with a registered version; returns a JSON-ready summary."""
    config = load_config(config_path)
    model_name = model_name or config.model_name
    requester = requester or config.prediction_requester
    names = [i.name for i in config.institutions]
    if requester not in names:
        raise ValueError(f"requester {requester!r} is not an institution of {config.federation!r} ({names})")
    master_registry(config).resolve(model_name, version)  # a missing version fails before any agent starts
    with agent_session(config, agents) as (transport, validation):
        if config.setting == "horizontal":
            session = HorizontalSession(transport, config.params, algorithm=config.algorithm, privacy=config.privacy)
            resolved = load_registered_model(config, session, model_name, version)
            prediction = predict_locally(session, f"{model_name}-{resolved}")
        else:
            session = VerticalSession(transport, config.params, alignment=config.alignment)
            resolved = load_registered_model(config, session, model_name, version)
            prediction = predict_batch(session, requester, f"{model_name}-{resolved}")
        session.close()
    return {"model": model_name, "version": resolved, "ref": version, "validation": validation,
            "prediction": prediction}
