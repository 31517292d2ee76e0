"""The master session's steps as Prefect tasks, the same in both settings.

Each is visible, timed and logged in the Prefect UI, with its table or progress artifact. The work is in
`fedcore.session.MasterSession`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact, update_progress_artifact

from fedcore.algorithms import read_algorithm
from fedcore.config import FederationConfig
from fedcore.drift import drift_note
from fedcore.session import MasterSession
from tasks.common import DATA_LOCAL, progress_reporter
from tasks.registry import master_registry


@task(**DATA_LOCAL)
def prepare(session: MasterSession) -> dict[str, Any]:
    """Agree with the institutions which rows or columns train; a table artifact of counts per institution.

    Rows in the vertical setting (ID alignment), columns in the horizontal one (the schema).
    """
    preparation = session.prepare()
    create_table_artifact(preparation.table, key=preparation.artifact_key,
                          description=preparation.description)
    get_run_logger().info("%s: %s", preparation.description, preparation.facts)
    return preparation.facts


@task(**DATA_LOCAL)
def train(session: MasterSession, checkpoints: Path | None = None,
          run_id: str | None = None) -> dict[str, Any]:
    """Grow the forest; a progress artifact moves as levels and tree batches complete.

    With `checkpoints` and `run_id`, completed tree batches are checkpointed, and an interrupted run resumes.
    """
    title = read_algorithm(session.algorithm, session.setting).title
    report, artifact = progress_reporter(f"{title} ({session.privacy_mode}) growth")
    session.progress = report
    facts = session.train(checkpoints, run_id)
    update_progress_artifact(artifact, progress=100.0)
    if facts.resumed_batches:
        get_run_logger().info("resumed run %s: %d tree batches taken from checkpoints", run_id,
                              facts.resumed_batches)
    return facts.to_dict()


@task(**DATA_LOCAL)
def evaluate(session: MasterSession) -> dict[str, float]:
    """Held-out metrics, scored where the labels are (the label holder, or every institution at home)."""
    metrics = session.evaluate()
    get_run_logger().info("held-out metrics: %s", metrics)
    return metrics


@task(**DATA_LOCAL)
def predict(session: MasterSession, requester: str | None = None,
            until: datetime | None = None) -> dict[str, Any]:
    """Predict the institutions' new rows; a table artifact of the rows and the file per institution.

    The predictions are delivered to `requester` only (vertical), or kept by each institution (horizontal);
    the files are where each institution reported writing them, on its own host. `until` ends a batch an
    institution's query selects by time (`:until`); default: the flow run's scheduled start time.
    """
    from prefect.runtime import flow_run

    if until is None:  # a datetime subclass (pendulum's): as the standard library's, in UTC
        until = datetime.fromisoformat(flow_run.scheduled_start_time.isoformat()).astimezone(UTC)
    # the flow run's id: a sink replaces the rows a retried attempt of this run delivered
    result = session.predict(requester, run_id=flow_run.id, until=until)
    where = f"delivered to {requester}" if result.requester else "predicted locally"
    column = "new rows" if result.requester else "predicted rows"
    files = result.paths
    create_table_artifact([{"institution": name, column: count, "predictions file": files.get(name, "")}
                           for name, count in result.counts.items()],
                          key="batch-prediction",
                          description=f"{result.rows} rows {where} in {result.seconds:.1f} s")
    get_run_logger().info("%d rows %s (%s); written %s", result.rows, where, result.counts,
                          ", ".join(f"at {name} to {path}" for name, path in files.items()) or "nowhere")
    if result.drift:  # each institution's drifted features only: the other scores stayed there
        rows = [{"institution": name, "feature": feature, "psi": psi}
                for name, features in result.drift.items() for feature, psi in features.items()]
        create_table_artifact(rows, key="batch-drift",
                              description="features whose batch drifted from the training rows (PSI)")
        get_run_logger().warning("batch drifted from the training rows%s", drift_note(result.drift))
    return result.to_dict()


@task(**DATA_LOCAL)
def load_registered_model(config: FederationConfig, session: MasterSession, model_name: str, ref: str) -> str:
    """Load a registered version (signature verified) at the master and every institution; returns it."""
    version = session.load_model(master_registry(config), model_name, ref)
    get_run_logger().info("loaded %s %s (%s) at the master and %s", model_name, version, ref,
                          ", ".join(session.institutions))
    return version
