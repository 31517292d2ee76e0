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
    """The batch-predict run's final message: version and where how many predictions went."""
    if "requester" in prediction:
        return f"{model_name} {version}: {prediction['rows']} rows predicted for {prediction['requester']}"
    where = ", ".join(f"{name} {count}" for name, count in prediction["counts"].items())
    return f"{model_name} {version}: {prediction['rows']} rows predicted locally ({where})"


def finished(message: str, summary: dict) -> State:
    """The flow's Completed state with `message` (shown in the UI's run list).

    Calling the flow still returns `summary`.
    """
    return Completed(message=message, data=summary)
