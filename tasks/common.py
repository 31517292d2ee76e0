"""Shared task options and artifact helpers."""

from __future__ import annotations

import logging
import re
from typing import TypedDict, cast
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE, CachePolicy

from fedcore.progress import PROGRESS_LOGGER, GrowthProgress, ProgressCallback, progress_lines


class TaskOptions(TypedDict, total=False):
    """Keyword options of `prefect.task`, typed so `@task(**options)` checks."""

    persist_result: bool
    cache_policy: CachePolicy


DATA_LOCAL: TaskOptions = {"persist_result": False, "cache_policy": NO_CACHE}
"""Options for tasks whose inputs or outputs hold raw data or live connections: never persisted or cached."""

NOT_PERSISTED: TaskOptions = {"persist_result": False, "cache_policy": NO_CACHE}
"""Options for the master flows' other tasks (promoting, the model card): never persisted or cached either.

The flows persist only the summary they return (`flows.RETURNED_SUMMARY`); a task without its own setting
would inherit theirs."""


def artifact_key(*parts: str) -> str:
    """A valid Prefect artifact key (lowercase letters, digits and dashes) from free text."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")[:100]


def progress_reporter(description: str) -> tuple[ProgressCallback, UUID]:
    """A `training-progress` artifact and the callback that moves it; returns (callback, artifact id).

    The callback moves it as levels and tree batches complete (finished trees plus the current batch's
    estimated share, see `fedcore.progress.GrowthTracker`), and logs plain progress lines, rate-limited
    (the first, one per finished batch, else at most one every 10 s), to the run logger and to the
    `fedforest.progress` logger (silent unless a command shows it, `fedcore.progress.echo_progress`).
    """
    # a UUID when called from sync code (Prefect's async_dispatch types it as UUID or a coroutine)
    artifact = cast(UUID, create_progress_artifact(0.0, key="training-progress", description=description))
    run_logger, plain = get_run_logger(), logging.getLogger(PROGRESS_LOGGER)

    def write(line: str) -> None:
        run_logger.info("training progress: %s", line)
        plain.info("training progress: %s", line)

    lines = progress_lines(write)

    def report(p: GrowthProgress) -> None:
        lines(p)
        update_progress_artifact(artifact, progress=round(100 * lines.tracker.fraction, 1))

    return report, artifact
