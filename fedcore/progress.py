"""Training progress shared by every engine: what the masters report as tree batches and levels grow, and
the one-line stderr bar the simulation estimators show."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class GrowthProgress:
    """Where training stands: finished trees, and the level being grown in the current tree batch
    (depth -1 once a batch is done)."""

    trees_done: int
    n_trees: int
    batch_trees: int
    depth: int
    open_nodes: int
    n_batches: int = 0  # set on the report announcing the plan (0: not announced)


ProgressCallback = Callable[[GrowthProgress], None]


def progress_bar() -> ProgressCallback:
    """A one-line stderr progress bar: finished trees, and the level the current batch is growing."""
    started = time.perf_counter()
    plan: dict[str, int] = {}

    def report(p: GrowthProgress) -> None:
        width = 30
        filled = int(width * p.trees_done / max(p.n_trees, 1))
        if p.n_batches:
            plan["batches"] = p.n_batches
        line = f"[{'#' * filled}{'.' * (width - filled)}] trees {p.trees_done}/{p.n_trees}"
        if plan:
            line += f" in {plan['batches']} batches"
        if p.depth >= 0:
            line += f" | growing {p.batch_trees} trees: level {p.depth}, {p.open_nodes} open nodes"
        sys.stderr.write(f"\r{line}  {time.perf_counter() - started:6.1f}s\033[K")
        sys.stderr.flush()

    return report
