"""Batch prediction: predictions land, with IDs, only at the institution that asked for them."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact

from fedcore.config import FederationConfig
from fedcore.vertical.session import VerticalSession
from tasks.common import DATA_LOCAL
from tasks.registry import master_registry


@task(**DATA_LOCAL)
def predict_batch(session: VerticalSession, requester: str, file_stem: str) -> dict:
    """Align the institutions' new rows, predict them (one round per row batch), deliver to `requester`."""
    result = session.batch_predict(requester, file_stem)
    create_table_artifact([{"institution": name, "new rows": count, "predicted": result["rows"]}
                           for name, count in result["counts"].items()], key="batch-prediction",
                          description=f"{result['rows']} predictions delivered to {requester} in "
                                      f"{result['seconds']:.1f} s")
    get_run_logger().info("%d predictions written at %s", result["rows"], requester)
    return {k: v for k, v in result.items() if k != "path"}


@task(**DATA_LOCAL)
def load_registered_model(config: FederationConfig, session: VerticalSession, model_name: str, ref: str) -> str:
    """Load a registered version (signature verified) at the master and every institution; returns the version."""
    version = session.load_model(master_registry(config), model_name, ref)
    get_run_logger().info("loaded %s %s (%s) at the master and %s", model_name, version, ref,
                          ", ".join(session.institutions))
    return version
