r"""Training progress shared by every engine.

What the masters report as tree batches and levels grow, and how it is shown.

The masters' growth loop (`fedcore.trees.grower.LevelwiseGrower`) reports a `GrowthProgress` after every
level of a tree batch and after every finished batch. A `GrowthTracker` turns those reports into how far
training is, including within a batch (all trees often grow in one batch, so counting finished trees
alone sits at 0 until the very end): the node work of a batch is estimated from the rows (node weights)
in its open nodes level by level, against the depth limit.

Displays:

* `progress_bar()`: the one-line bar (`\r`, erase to end of line) when stderr is a terminal; plain,
  complete, rate-limited lines when it is not (redirected to a file or pipe, or TERM=dumb);
* `log_progress(logger)`: the same plain lines, rate-limited, through a `logging.Logger` (Prefect's run
  logger for flows and tasks);
* `progress_lines(write)`: the plain, rate-limited lines to any writer (the two above use it).

Plain lines are written for the first report, for every finished batch (the last of which ends
training), and otherwise at most once every `interval` seconds.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

PROGRESS_LOGGER = "fedforest.progress"
"""A plain Python logger that `tasks.common.progress_reporter` also sends its progress lines to. Silent
unless a program enables it (`echo_progress`), e.g. a demo that quiets Prefect's own logging."""

DEFAULT_INTERVAL = 10.0
"""Seconds between two plain progress lines (besides the first line and every finished batch)."""


@dataclass
class GrowthProgress:
    """Where training stands.

    Finished trees, and the level being grown in the current tree batch (depth -1 once a batch is done, or on
    the report announcing the plan).

    The level facts after `n_batches` let a display estimate how far the current batch is: the depth
    limit (0: none), the rows (node weights, bootstrap draws counted) in the level's open nodes, the rows
    still in open nodes after the level, and how many nodes are open at the next level. They default to
    "not reported"; a display then falls back to the depth alone.
    """

    trees_done: int
    n_trees: int
    batch_trees: int
    depth: int
    open_nodes: int
    n_batches: int = 0  # set on the report announcing the plan (0: not announced)
    max_depth: int = 0  # the trees' depth limit (0: no limit, or not reported)
    rows_open: float | None = None  # rows (node weight) in this level's open nodes
    rows_next: float | None = None  # of those, the rows in nodes that stay open after this level
    nodes_next: int | None = None  # open nodes of the next level


ProgressCallback = Callable[[GrowthProgress], None]


class GrowthTracker:
    """Training progress from a stream of `GrowthProgress` reports.

    The plan, the current batch, the share of its work done, and the elapsed time.

    The share of a batch is work done / (work done + work left), where the work of a level is the rows
    in its open nodes (every party reads each of them once per level), and the work left is the rows still
    open times the levels they may still take: at most the depth limit minus the level, and about
    1.5 log2 of the rows per open node (nodes halve until they are too small to split). It never goes
    back within a batch.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        """Nothing reported yet; `clock` times the run."""
        self.clock = clock
        self.started = clock()
        self.n_batches = 1
        self.batch_index = 0  # 0-based index of the current (or just finished) batch
        self.batch_start = -1  # first tree of the current batch (-1: none yet)
        self.batch_trees = 0
        self.share = 0.0  # of the current batch's work
        self.deepest = -1  # deepest level reported in the current batch
        self._work = 0.0
        self.last: GrowthProgress | None = None

    def update(self, p: GrowthProgress) -> None:
        """Take one report: note a new batch or level and the share of the batch's work done."""
        self.last = p
        if p.n_batches:
            self.n_batches = p.n_batches
        if p.depth < 0:
            if not p.n_batches and p.trees_done >= p.n_trees:
                self.batch_index = self.n_batches - 1
            return
        if p.trees_done != self.batch_start or (p.depth == 0 and self.deepest >= 0):  # a new batch
            self.batch_start, self.batch_trees = p.trees_done, p.batch_trees
            self.share, self.deepest, self._work = 0.0, -1, 0.0
            last_batch = p.trees_done + p.batch_trees >= p.n_trees
            self.batch_index = self.n_batches - 1 if last_batch else p.trees_done // max(p.batch_trees, 1)
        self.deepest = max(self.deepest, p.depth)
        self.share = max(self.share, min(self._level_share(p), 1.0))

    def _level_share(self, p: GrowthProgress) -> float:
        limit = p.max_depth
        if p.rows_open is None or p.rows_next is None:
            return (p.depth + 1) / (limit + 1) if limit else 0.0
        self._work += max(p.rows_open, 0.0)
        rows_next = max(p.rows_next, 0.0)
        levels_left = float(limit - p.depth) if limit else math.inf
        if p.nodes_next and rows_next > 0:
            per_node = rows_next / p.nodes_next
            levels_left = min(levels_left, 1.5 * math.log2(max(per_node, 1.0)) + 1.0)
        elif math.isinf(levels_left):
            levels_left = 1.0
        left = rows_next * max(levels_left, 0.0)
        return self._work / (self._work + left) if self._work + left > 0 else 1.0

    @property
    def elapsed(self) -> float:
        """Seconds since the tracker was made."""
        return self.clock() - self.started

    @property
    def trees_completed(self) -> float:
        """Finished trees plus the current batch's share of its trees."""
        p = self.last
        if p is None:
            return 0.0
        if p.depth < 0:
            return float(p.trees_done)
        return p.trees_done + self.share * p.batch_trees

    @property
    def fraction(self) -> float:
        """Of all training (0 to 1)."""
        p = self.last
        return min(self.trees_completed / p.n_trees, 1.0) if p is not None and p.n_trees else 0.0

    def describe(self) -> str:
        """The last report as one line of plain text."""
        p = self.last
        if p is None:
            return ""
        head = f"{100 * self.fraction:.0f}% | trees {p.trees_done}/{p.n_trees}"
        if self.n_batches > 1:
            head += f" in {self.n_batches} batches"
        batch = f"batch {self.batch_index + 1}/{self.n_batches}"
        if p.depth >= 0:
            level = f"level {p.depth}/{p.max_depth}" if p.max_depth else f"level {p.depth} (no depth limit)"
            body = (f"{batch} ({p.batch_trees} trees): {level}, {p.open_nodes} open nodes, "
                    f"~{100 * self.share:.0f}% of the batch")
        elif p.n_batches:
            body = "growth planned"
        else:
            body = f"{batch} done" + (f" (deepest level {self.deepest})" if self.deepest >= 0 else "")
        return f"{head} | {body} | {self.elapsed:.1f} s"


class ProgressLines:
    """A progress callback writing plain lines (no newline, no control codes) through `write`.

    The first report, every finished batch, and otherwise at most one line every `interval` seconds.
    """

    def __init__(self, write: Callable[[str], None], interval: float = DEFAULT_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Write progress lines through `write`, rate-limited to one per `interval` seconds of `clock`."""
        self.write, self.interval, self.clock = write, interval, clock
        self.tracker = GrowthTracker(clock)
        self.last_written: float | None = None

    def __call__(self, p: GrowthProgress) -> None:
        """Take a report; write a line if it is the first, a batch's end, or `interval` has passed."""
        self.tracker.update(p)
        now = self.clock()
        if self.last_written is None or p.depth < 0 or now - self.last_written >= self.interval:
            self.write(self.tracker.describe())
            self.last_written = now


def progress_lines(write: Callable[[str], None], interval: float = DEFAULT_INTERVAL,
                   clock: Callable[[], float] = time.monotonic) -> ProgressLines:
    """Plain, rate-limited progress lines through `write` (see `ProgressLines`)."""
    return ProgressLines(write, interval, clock)


def log_progress(logger: logging.Logger | logging.LoggerAdapter, interval: float = DEFAULT_INTERVAL,
                 clock: Callable[[], float] = time.monotonic, level: int = logging.INFO) -> ProgressLines:
    """A callback logging plain, rate-limited progress lines to `logger` (e.g. Prefect's run logger)."""
    return progress_lines(lambda line: logger.log(level, "training progress: %s", line), interval, clock)


def uses_bar(stream: TextIO | None = None) -> bool:
    """Whether `stream` (default stderr) gets the one-line bar: a terminal that is not TERM=dumb."""
    stream = sys.stderr if stream is None else stream
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        tty = False
    return tty and os.environ.get("TERM", "") != "dumb"


class ProgressBar:
    r"""The one-line terminal bar: redrawn in place (`\r`, erase to end of line) on every report."""

    width = 30

    def __init__(self, stream: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
        """Draw the bar on `stream`."""
        self.stream = stream
        self.tracker = GrowthTracker(clock)

    def __call__(self, p: GrowthProgress) -> None:
        """Take a report and redraw the bar, cut to the terminal's width."""
        self.tracker.update(p)
        filled = int(self.width * self.tracker.fraction)
        line = f"[{'#' * filled}{'.' * (self.width - filled)}] {self.tracker.describe()}"
        columns = shutil.get_terminal_size().columns  # a longer line would wrap, and \r redraw only its end
        self.stream.write(f"\r{line[:max(columns - 1, 40)]}\033[K")
        self.stream.flush()


def progress_bar(stream: TextIO | None = None, interval: float = DEFAULT_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> ProgressBar | ProgressLines:
    """Progress on `stream` (default stderr).

    The one-line bar on a terminal (finished trees plus the current batch's share, and the level it is
    growing); plain, complete lines, rate-limited (see `ProgressLines`) and prefixed "fedforest: ", otherwise.
    """
    out = sys.stderr if stream is None else stream
    if uses_bar(out):
        return ProgressBar(out, clock)

    def write(line: str) -> None:
        out.write(f"fedforest: {line}\n")
        out.flush()

    return ProgressLines(write, interval, clock)


def end_line(stream: TextIO | None = None) -> None:
    """End the bar's line after training (a newline on a terminal; plain lines are complete already)."""
    out = sys.stderr if stream is None else stream
    if uses_bar(out):
        out.write("\n")
        out.flush()


def echo_progress(stream: TextIO | None = None) -> logging.Handler:
    """Show the `PROGRESS_LOGGER` lines on `stream` (default stderr) as plain text; returns the handler.

    Whatever the logging setup (e.g. a command that quiets Prefect's log lines). Remove the handler to stop.
    """
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger(PROGRESS_LOGGER)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return handler
