"""Alignment, training and evaluation steps of a vertical session, each visible in the Prefect UI."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact, update_progress_artifact

from fedcore.vertical.session import VerticalSession
from tasks.common import DATA_LOCAL, progress_reporter


@task(**DATA_LOCAL)
def align_ids(session: VerticalSession) -> dict:
    """Intersect the institutions' keyed ID hashes; table artifact of per-institution counts and overlap."""
    plan = session.align()
    create_table_artifact(plan.overlap_table(), key="id-overlap",
                          description=f"{plan.n_common} rows are held by every institution")
    get_run_logger().info("ID overlap: %d rows (%s)", plan.n_common, dict(plan.counts))
    return {"overlap": plan.n_common, "counts": dict(plan.counts), "train_rows": session.facts.train_rows,
            "holdout_rows": session.facts.holdout_rows}


@task(**DATA_LOCAL)
def train_forest(session: VerticalSession, checkpoints: Path | None = None, run_id: str | None = None) -> dict:
    """Grow the forest; a progress artifact moves as levels and tree batches complete. With `checkpoints`
    and `run_id`, completed tree batches are checkpointed, and an interrupted run resumes."""
    report, artifact = progress_reporter("Federated Forest growth")
    logger = get_run_logger()
    session.master.progress = report
    session.train(checkpoints, run_id)
    update_progress_artifact(artifact, progress=100.0)
    f = session.facts
    if f.resumed_batches:
        logger.info("resumed run %s: %d tree batches taken from checkpoints", run_id, f.resumed_batches)
    return {"seconds": f.seconds, "rounds": f.rounds, "bytes": f.bytes, "owned_nodes": f.owned_nodes,
            "nodes": int(session.master.structure.n_nodes), "resumed_batches": f.resumed_batches}


@task(**DATA_LOCAL)
def evaluate_model(session: VerticalSession) -> dict[str, float]:
    """Held-out metrics, computed at the label holder from the master's one-round predictions."""
    metrics = session.evaluate()
    get_run_logger().info("held-out metrics: %s", metrics)
    return metrics
