"""Steps of a horizontal session (Federated Extra-Trees or PPD-ERT), each visible in the Prefect UI."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact, update_progress_artifact

from fedcore.config import FederationConfig
from fedcore.horizontal.session import HorizontalSession
from tasks.common import DATA_LOCAL, progress_reporter
from tasks.registry import code_version


@task(**DATA_LOCAL)
def agree_schema(session: HorizontalSession) -> dict:
    """Check that the institutions' contracts agree and set every institution up; table artifact of the
    training and held-out rows each keeps at home."""
    schema = session.agree_schema()
    rows = [{"institution": name, "training rows": r["train_rows"], "held-out rows": r["holdout_rows"]}
            for name, r in session.rows.items()]
    create_table_artifact(rows, key="institution-rows",
                          description=f"{schema.n_features} agreed feature columns, label {schema.label!r}")
    get_run_logger().info("schema agreed: %d features; rows %s", schema.n_features,
                          {name: r["train_rows"] for name, r in session.rows.items()})
    return {"features": schema.n_features, "rows": session.rows}


@task(**DATA_LOCAL)
def train_extra_trees(session: HorizontalSession, checkpoints: Path | None = None, run_id: str | None = None) -> dict:
    """Grow the forest; a progress artifact moves as tree batches and levels complete. With `checkpoints`
    and `run_id`, completed tree batches are checkpointed, and an interrupted run resumes."""
    report, artifact = progress_reporter(f"{session.algorithm} ({session.privacy['mode']}) growth")
    session.progress = report
    session.train(checkpoints, run_id)
    update_progress_artifact(artifact, progress=100.0)
    if session.facts["resumed_batches"]:
        get_run_logger().info("resumed run %s: %d tree batches taken from checkpoints", run_id,
                              session.facts["resumed_batches"])
    return dict(session.facts)


@task(**DATA_LOCAL)
def evaluate_horizontal(session: HorizontalSession) -> dict[str, float]:
    """Metrics over every institution's held-out rows, from aggregates each computes at home."""
    metrics = session.evaluate()
    get_run_logger().info("held-out metrics: %s", metrics)
    return metrics


def build_horizontal_manifest(config: FederationConfig, session: HorizontalSession, metrics: dict,
                              validation: dict, training: dict) -> dict:
    """The master's manifest for a horizontal version (docs/design.md, Model artifacts)."""
    report = privacy_summary(session)
    return {
        "algorithm": session.algorithm, "setting": config.setting, "task": session.params.task,
        "params": session.params.to_dict(), "privacy": report,
        "schema": session.schema.to_dict(), "parties": session.manifest_parties(), "metrics": metrics,
        "training": {"rows": training["train_rows"], "holdout_rows": training["holdout_rows"],
                     "seconds": training["seconds"], "rounds": training["rounds"], "bytes": training["bytes"],
                     "nodes": training["nodes"]},
        "lineage": {"federation": config.federation, "contracts": validation, "code_version": code_version()},
    }


def privacy_summary(session: HorizontalSession) -> dict:
    """What the master saw and, for the DP modes, the budget the master can vouch for."""
    mode = session.privacy["mode"]
    out = {"mode": mode}
    if mode == "gdp":
        out["epsilon_per_query"] = session.privacy["epsilon"]
        out["note"] = "each institution adds the noise and keeps its own budget accounting"
    if mode == "ldp":
        from fedcore.privacy.ldp import LabelLDP

        out["epsilon"] = LabelLDP(**(session.privacy.get("ldp") or {})).epsilon()
    if mode == "secagg":
        out["note"] = "the master received only masked sums of branch counts"
    return out


@task(**DATA_LOCAL)
def predict_locally(session: HorizontalSession, file_stem: str) -> dict:
    """Every institution predicts its own new rows; the predictions never leave it."""
    result = session.predict_locally(file_stem)
    create_table_artifact([{"institution": name, "predicted rows": count} for name, count in result["counts"].items()],
                          key="batch-prediction",
                          description=f"{result['rows']} rows predicted locally in {result['seconds']:.1f} s")
    get_run_logger().info("%d rows predicted locally (%s)", result["rows"], result["counts"])
    return result
