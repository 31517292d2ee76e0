"""Shared task options and artifact helpers."""

from __future__ import annotations

import re

from prefect import get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE

from fedcore.progress import GrowthProgress, ProgressCallback

DATA_LOCAL = {"persist_result": False, "cache_policy": NO_CACHE}
"""Options for tasks whose inputs or outputs hold raw data or live connections: never persisted or cached."""


def artifact_key(*parts: str) -> str:
    """A valid Prefect artifact key (lowercase letters, digits and dashes) from free text."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")[:100]


def progress_reporter(description: str, depth_limit: int) -> tuple[ProgressCallback, object]:
    """A `training-progress` artifact and the callback that moves it as levels and tree batches complete
    (and logs each level); returns (callback, artifact id)."""
    artifact = create_progress_artifact(0.0, key="training-progress", description=description)
    logger = get_run_logger()

    def report(p: GrowthProgress) -> None:
        if p.n_batches:  # the plan, announced once when the trees do not all fit one batch
            logger.info("growing %d trees in %d batches (memory budgets, or tree_batch_size)", p.n_trees, p.n_batches)
        if p.depth < 0:
            share = p.trees_done / p.n_trees
        else:
            share = (p.trees_done + p.batch_trees * min(p.depth + 1, depth_limit) / depth_limit) / p.n_trees
        update_progress_artifact(artifact, progress=round(100 * min(share, 1.0), 1))
        if p.depth >= 0:
            logger.info("trees %d-%d: level %d, %d open nodes", p.trees_done, p.trees_done + p.batch_trees - 1,
                        p.depth, p.open_nodes)

    return report, artifact
