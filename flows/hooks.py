"""Flow hooks shared by the master flows."""

from __future__ import annotations

from prefect.artifacts import create_markdown_artifact


def write_failure_artifact(flow, flow_run, state) -> None:
    """On failure, a markdown artifact saying which step failed and why (no model version was registered)."""
    message = state.message or "the run failed"
    create_markdown_artifact(
        f"# {flow.name} failed\n\n{message}\n\nNo model version was registered by this run; earlier versions "
        "are untouched.", key="failure", description=f"{flow.name} run {flow_run.name} failed")
