"""Training progress (issue #15, point 7).

Plain, complete, rate-limited lines when stderr is not a terminal (or TERM=dumb), the one-line bar on a
terminal, and progress that moves within a tree batch.
"""

from __future__ import annotations

import io
import logging

import pytest

from fedcore.data.split import split_vertical
from fedcore.horizontal.estimators import FederatedExtraTreesClassifier
from fedcore.progress import (
    PROGRESS_LOGGER,
    GrowthProgress,
    GrowthTracker,
    ProgressBar,
    ProgressLines,
    echo_progress,
    end_line,
    log_progress,
    progress_bar,
)
from fedcore.vertical.estimators import FederatedForestClassifier
from tests.conftest import mixed_table
from tests.horizontal.common import horizontal_table, split_rows


class Clock:
    """An injected clock: the tests move time by hand (no sleeps)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def one_batch(n_trees: int = 100, max_depth: int = 6) -> list[GrowthProgress]:
    """The reports of one batch of all `n_trees` trees.

    Every level, then the batch done. Rows settle in leaves as the levels go (400 rows per tree at the root).
    """
    rows = [40000.0, 39000.0, 36000.0, 30000.0, 20000.0, 8000.0, 0.0]
    nodes = [n_trees * 2 ** d for d in range(max_depth + 1)]
    levels = [GrowthProgress(0, n_trees, n_trees, d, nodes[d], max_depth=max_depth, rows_open=rows[d],
                             rows_next=rows[d + 1], nodes_next=nodes[d + 1] if rows[d + 1] else 0)
              for d in range(max_depth)]
    return [*levels, GrowthProgress(n_trees, n_trees, 0, -1, 0)]


@pytest.fixture(autouse=True)
def _terminal_kind(monkeypatch) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")


def test_not_a_terminal_gets_whole_plain_lines_without_control_codes() -> None:
    stream, clock = io.StringIO(), Clock()
    report = progress_bar(stream, interval=0, clock=clock)
    assert isinstance(report, ProgressLines)
    for p in one_batch():
        clock.now += 3.5
        report(p)
    text = stream.getvalue()
    assert "\r" not in text and "\x1b" not in text
    assert text.endswith("\n")
    lines = text.splitlines()
    assert len(lines) == 7  # every report (interval 0): 6 levels and the finished batch
    for line in lines:
        assert line.startswith("fedforest: ") and "trees " in line and "batch 1/1" in line
        assert line.endswith(" s")  # the elapsed time
    assert "trees 0/100 | batch 1/1 (100 trees): level 2/6, 400 open nodes" in lines[2]
    assert lines[2].endswith("| 10.5 s")
    assert lines[-1] == "fedforest: 100% | trees 100/100 | batch 1/1 done (deepest level 5) | 24.5 s"


def test_term_dumb_gets_plain_lines_even_on_a_terminal(monkeypatch) -> None:
    monkeypatch.setenv("TERM", "dumb")
    stream = Terminal()
    report = progress_bar(stream)
    for p in one_batch():
        report(p)
    assert "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()
    assert stream.getvalue().endswith("trees 100/100 | batch 1/1 done (deepest level 5) | 0.0 s\n")


def test_plain_lines_are_rate_limited_with_the_first_and_every_finished_batch() -> None:
    written: list[tuple[float, str]] = []
    clock = Clock()
    report = ProgressLines(lambda line: written.append((clock.now, line)), interval=10.0, clock=clock)
    report(GrowthProgress(0, 40, 0, -1, 0, n_batches=2))  # the plan: the first line
    times = []
    for batch in (0, 20):
        for depth in range(8):
            clock.now += 3.0
            times.append(clock.now)
            report(GrowthProgress(batch, 40, 20, depth, 20 * 2 ** depth, max_depth=8, rows_open=1000.0,
                                  rows_next=900.0, nodes_next=40 * 2 ** depth))
        report(GrowthProgress(batch + 20, 40, 0, -1, 0))  # each finished batch is written
    stamps = [t - 100.0 for t, _ in written]
    # the plan at 0; levels at 3..24 (batch 1) and 27..48 (batch 2): one line 10 s after the last one
    assert stamps == [0.0, 12.0, 24.0, 24.0, 36.0, 48.0, 48.0]
    lines = [line for _, line in written]
    assert lines[0] == "0% | trees 0/40 in 2 batches | growth planned | 0.0 s"
    assert "batch 1/2 done" in lines[3] and "batch 2/2 (20 trees): level 3/8" in lines[4]
    assert lines[-1].startswith("100% | trees 40/40 in 2 batches | batch 2/2 done (deepest level 7)")
    for _, line in written:
        assert "\n" not in line and "\r" not in line and "\x1b" not in line


def test_the_bar_moves_within_a_single_batch_level_by_level() -> None:
    tracker = GrowthTracker(Clock())
    completed, labels = [], []
    for p in one_batch()[:-1]:
        tracker.update(p)
        completed.append(tracker.trees_completed)
        labels.append(tracker.describe())
    assert 0 < completed[0] and all(a < b for a, b in zip(completed, completed[1:], strict=False))
    assert completed[-2] < 100 and completed[-1] == 100  # all rows settled after the last level
    assert "level 0/6" in labels[0] and "level 5/6" in labels[-1] and "trees 0/100 |" in labels[-1]


def test_within_batch_progress_without_a_depth_limit_and_without_rows() -> None:
    unlimited = GrowthTracker(Clock())
    shares = []
    for depth, (rows, next_rows) in enumerate([(1000, 990), (990, 950), (950, 700), (700, 200), (200, 0)]):
        unlimited.update(GrowthProgress(0, 10, 10, depth, 10 * 2 ** depth, rows_open=rows,
                                        rows_next=next_rows, nodes_next=20 * 2 ** depth))
        shares.append(unlimited.share)
    assert all(a < b for a, b in zip(shares, shares[1:], strict=False)) and shares[-1] == 1.0
    assert "level 4 (no depth limit)" in unlimited.describe()
    depth_only = GrowthTracker(Clock())  # an older reporter: the depth against the limit
    depth_only.update(GrowthProgress(0, 10, 10, 1, 20, max_depth=3))
    assert depth_only.trees_completed == 5.0


@pytest.mark.parametrize("engine", ["vertical", "horizontal"])
def test_a_real_single_batch_fit_reports_work_within_the_batch(engine, monkeypatch) -> None:
    clock = Clock()
    seen: list[float] = []
    lines = ProgressLines(lambda line: None, interval=0, clock=clock)

    def report(p: GrowthProgress) -> None:
        lines(p)
        if p.depth >= 0:
            assert p.max_depth == 4 and p.rows_open and p.rows_open > 0 and p.rows_next is not None
            seen.append(lines.tracker.trees_completed)

    # the estimators' display, replaced by a recorder
    monkeypatch.setattr("fedcore.simulated_fit.progress_bar", lambda: report)
    if engine == "vertical":
        parties = split_vertical(mixed_table(n_rows=300, seed=5), 2, label="target", seed=1, label_party=0)
        FederatedForestClassifier(n_estimators=4, max_depth=4, random_state=2,
                                  progress=True).fit(parties, "target")
    else:
        FederatedExtraTreesClassifier(4, max_depth=4, progress=True).fit(
            split_rows(horizontal_table(seed=8, n_rows=300), 2), "target")
    assert len(seen) >= 3  # one batch of 4 trees, several levels: the bar moves before the batch ends
    assert 0 < seen[0] < seen[1] < 4
    assert all(a <= b for a, b in zip(seen, seen[1:], strict=False)) and seen[-1] == 4.0
    assert lines.tracker.describe().startswith("100% | trees 4/4 | batch 1/1 done")


def test_a_terminal_keeps_the_one_line_bar(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    stream = Terminal()
    report = progress_bar(stream, clock=Clock())
    assert isinstance(report, ProgressBar)
    for p in one_batch()[:3]:
        report(p)
    text = stream.getvalue()
    assert text.count("\r") == 3 and text.count("\x1b[K") == 3 and "\n" not in text
    last = text.rsplit("\r", 1)[1]
    assert last.startswith("[") and "trees 0/100 | batch 1/1 (100 trees): level 2/6" in last
    filled = last[1:31].count("#")
    assert 0 < filled < 30  # the bar moved within the one batch
    end_line(stream)
    assert stream.getvalue().endswith("\n")
    plain = io.StringIO()
    end_line(plain)  # plain lines are complete already: no blank line
    assert plain.getvalue() == ""


def test_log_progress_writes_plain_rate_limited_lines(caplog) -> None:
    clock = Clock()
    logger = logging.getLogger("tests.progress")
    report = log_progress(logger, interval=5.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="tests.progress"):
        for p in one_batch():
            clock.now += 2.0
            report(p)
    messages = [r.getMessage() for r in caplog.records if r.name == "tests.progress"]
    assert len(messages) == 3  # levels at +2 s (the first), +8 s (5 s later); the finished batch at +14 s
    assert messages[0].startswith("training progress: ") and "level 0/6" in messages[0]
    assert "level 3/6" in messages[1]
    assert messages[-1].endswith("batch 1/1 done (deepest level 5) | 14.0 s")
    assert all("\r" not in m and "\x1b" not in m and "\n" not in m for m in messages)


def test_echo_progress_shows_the_progress_logger_as_plain_text() -> None:
    stream = io.StringIO()
    handler = echo_progress(stream)
    try:
        logging.getLogger(PROGRESS_LOGGER).info("training progress: %s", "50% | trees 5/10")
    finally:
        logging.getLogger(PROGRESS_LOGGER).removeHandler(handler)
    assert stream.getvalue() == "training progress: 50% | trees 5/10\n"
