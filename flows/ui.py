"""What the Prefect UI shows of a master run at a glance: its name and final message.

The name is after the model and version (`retrain retail-response v0003`, `predict retail-response
v0002`) and the final state's message says which version and how good, so a list of runs answers "which
version, how good" without opening one.
"""

from __future__ import annotations

from collections.abc import Callable

from prefect import get_run_logger
from prefect.runtime import flow_run
from prefect.states import Completed, State

from fedcore.config import load_config
from fedcore.drift import drift_note


def run_name(kind: str) -> Callable[[], str]:
    """A `flow_run_name` for a master flow: `<kind> <model>`, plus the version asked for when there is one.

    For example `predict retail-response production`; the flow renames the run once the version is known.
    """

    def name() -> str:
        parameters = flow_run.parameters
        model = parameters.get("model_name") or _configured_model(parameters.get("config_path"))
        return " ".join(str(part) for part in (kind, model, parameters.get("version")) if part)

    return name


def _configured_model(config_path: str | None) -> str | None:
    """The config's model name, or None when it cannot be read (the flow then reports why)."""
    try:
        return load_config(config_path).model_name if config_path else None
    except Exception:  # noqa: BLE001 - naming must not be where a bad config fails
        return None


def name_run(name: str) -> None:
    """Rename the current flow run (nothing outside one).

    The name is for people: failing to set it is logged, never raised.
    """
    run_id = flow_run.id
    if run_id is None:
        return
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run(run_id, name=name)
    except Exception as error:  # noqa: BLE001 - an unreachable API must not fail a trained run
        get_run_logger().warning("could not name this flow run %r: %s", name, error)


def headline_metric(metrics: dict[str, float], metric: str) -> str:
    """`accuracy 0.7533`: the promotion metric (the first metric when that one is missing)."""
    if metric not in metrics:
        if not metrics:
            return "no metrics"
        metric = next(iter(metrics))
    return f"{metric} {metrics[metric]:.4f}"


def retrain_outcome(model_name: str, version: str, metrics: dict[str, float], metric: str, promoted: bool,
                    production: dict | None) -> str:
    """The retrain run's final message.

    It gives the version, headline metric (against production's) and whether the version went to
    production.
    """
    line = f"{model_name} {version}: {headline_metric(metrics, metric)} on held-out rows"
    previous = (production or {}).get("metrics", {})
    if production is not None and metric in metrics and metric in previous:
        line += f" (production {production.get('version', 'before')}: {previous[metric]:.4f})"
    return line + ("; promoted to production" if promoted else "; NOT promoted, production unchanged")


def predict_outcome(model_name: str, version: str, prediction: dict) -> str:
    """The batch-predict run's final message: version, predictions, files, drifted features.

    How many predictions went where, their files, and the features an institution found drifted
    (`fedcore.drift`).
    """
    if "requester" in prediction:
        line = f"{model_name} {version}: {prediction['rows']} rows predicted for {prediction['requester']}"
    else:
        where = ", ".join(f"{name} {count}" for name, count in prediction["counts"].items())
        line = f"{model_name} {version}: {prediction['rows']} rows predicted locally ({where})"
    paths = prediction.get("paths") or {}
    line = f"{line}, written {_written_at(paths)}" if paths else line
    return line + drift_note(prediction.get("drift") or {})


def _written_at(paths: dict[str, str]) -> str:
    """`at bank to /srv/bank/predictions/m-v0002-<time>.parquet, at ...`: each institution's file.

    The paths as the institutions reported them: each is on that institution's own host.
    """
    return ", ".join(f"at {name} to {path}" for name, path in paths.items())


def prediction_files(summary: dict) -> list[str]:
    """Lines saying where a flow's batch predictions went, for the CLI (none when it predicted nothing)."""
    prediction = summary.get("prediction") or {}
    lines = []
    for name, path in (prediction.get("paths") or {}).items():
        rows = prediction["rows"] if prediction.get("requester") else prediction["counts"].get(name, 0)
        lines.append(f"fedforest: {rows} predictions of {summary.get('model')} {summary.get('version')} "
                     f"written at {name} to {path}")
    return lines


def finished(message: str, summary: dict) -> State:
    """The flow's Completed state with `message` (shown in the UI's run list).

    Calling the flow still returns `summary`.
    """
    return Completed(message=message, data=summary)
