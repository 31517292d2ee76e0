"""Batch prediction: predictions land, with IDs, only at the institution that asked for them."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact

from fedcore.vertical.session import VerticalSession
from tasks.common import DATA_LOCAL


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
