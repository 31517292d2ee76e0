"""A party on Dask logs each tree batch's levels: workers, blocks, levels, p50/p95 seconds (issue #29)."""

from __future__ import annotations

import logging
import re

from fedcore.data.split import split_vertical
from fedcore.horizontal import FederatedExtraTreesClassifier
from fedcore.vertical.estimators import FederatedForestClassifier
from tests.conftest import mixed_table
from tests.horizontal.common import horizontal_table, split_rows

LINE = re.compile(r"party '(?P<who>[\w-]+)' on Dask \(3 worker\(s\), (?P<blocks>\d+) blocks\): tree batch "
                  r"(?P<batch>\d+) of (?P<levels>\d+) levels in [\d.]+ s; a level p50 [\d.]+ s, p95 [\d.]+ s")


def _logged(caplog) -> list[re.Match]:
    lines = [r.getMessage() for r in caplog.records if r.name == "fedcore.compute.level_clock"]
    matches = [LINE.fullmatch(line) for line in lines]
    assert lines and all(matches), lines
    return [m for m in matches if m is not None]


def test_each_horizontal_party_logs_its_tree_batches_levels(three_workers, caplog) -> None:
    table = horizontal_table(seed=1)
    model = FederatedExtraTreesClassifier(n_estimators=4, max_depth=5, random_state=3, tree_batch_size=2,
                                          compute=three_workers, block_rows=40)
    with caplog.at_level(logging.INFO, logger="fedcore.compute.level_clock"):
        model.fit(split_rows(table, 3, seed=3), label="target")
    by_party: dict[str, list[re.Match]] = {}
    for match in _logged(caplog):
        by_party.setdefault(match["who"], []).append(match)
    assert len(by_party) == 3
    for matches in by_party.values():  # two batches of two trees, each at most 6 levels (depth 5)
        assert [int(m["batch"]) for m in matches] == [1, 2]
        assert all(1 <= int(m["levels"]) <= 6 and int(m["blocks"]) >= 2 for m in matches)


def test_each_vertical_party_logs_its_tree_batches_levels(three_workers, caplog) -> None:
    parties = split_vertical(mixed_table(seed=1), 3, label="target", seed=7, label_party=0)
    model = FederatedForestClassifier(n_estimators=4, max_depth=6, random_state=3, compute=three_workers,
                                      block_rows=45)
    with caplog.at_level(logging.INFO, logger="fedcore.compute.level_clock"):
        model.fit(parties, label="target")
    matches = _logged(caplog)
    assert {m["who"] for m in matches} == {member.name for member in model.parties_}
    assert all(int(m["blocks"]) >= 2 for m in matches)
    batches = [int(m["batch"]) for m in matches]
    assert batches.count(1) == 3 and all(1 <= int(m["levels"]) <= 7 for m in matches)  # one line per party
