"""Horizontal transcripts beyond the mode table of tests/test_wire_invariants.py.

That table asserts DESIGN's "What crosses the wire" for every mode. Here: FET's min/max are exactly the
party's local extremes, regression targets never reach the master, and the round count of a fit (DESIGN
principle 1: rounds grow with depth, never with nodes).
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.horizontal import FederatedExtraTreesClassifier, FederatedExtraTreesRegressor, PPDERTClassifier
from fedcore.protocol.messages import Message
from fedcore.transport.base import MASTER
from tests.horizontal.common import horizontal_table, split_rows
from tests.wire import continuous_bits, raw_values_in


@pytest.fixture(scope="module")
def fet_run():
    table = horizontal_table(seed=4)
    parties = split_rows(table, 3, seed=1)
    model = FederatedExtraTreesClassifier(5, max_depth=6, random_state=2, record_payloads=True).fit(
        parties, label="target")
    return table, parties, model


def _to_master(transcript):
    return [e for e in transcript if e.receiver == MASTER]


def test_fet_min_max_are_the_partys_local_extremes_and_counts_have_the_candidates_shape(fet_run) -> None:
    _, parties, model = fet_run
    k = model.master_.k
    C = model.schema_.n_classes
    for entry in _to_master(model.transcript_):
        message = Message.from_bytes(entry.payload)
        if message.kind == "fet_ranges_reply":
            assert message.arrays["min"].dtype == np.float64 and message.arrays["min"].shape[1] == k
        elif message.kind == "fet_counts":
            counts = message.arrays["counts"]  # integers in the narrowest type holding the party's rows
            assert counts.dtype == np.uint16 and counts.shape[1:] == (k, 2, C)
    # the first level's min/max are the party's own local min/max of the candidates
    first = [e for e in model.transcript_ if e.kind == "fet_ranges"][0]
    features = Message.from_bytes(first.payload).arrays["features"]
    reply = Message.from_bytes([e for e in model.transcript_ if e.kind == "fet_ranges_reply"
                                and e.sender == "party0"][0].payload)
    X = model.schema_.encode(parties[0])
    np.testing.assert_array_equal(reply.arrays["min"], np.nanmin(X[:, features], axis=0))
    np.testing.assert_array_equal(reply.arrays["max"], np.nanmax(X[:, features], axis=0))


# -- rounds --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("depth", [2, 4])
def test_fet_rounds_grow_with_depth_not_nodes(depth: int) -> None:
    table = horizontal_table(seed=5)
    runs = {}
    for n_estimators, n_rows in ((1, 300), (8, 600)):
        model = FederatedExtraTreesClassifier(n_estimators, max_depth=depth, random_state=1).fit(
            split_rows(table.iloc[:n_rows], 3), label="target")
        runs[n_estimators] = model
        assert model.master_.levels == depth
        assert model.communication_["rounds"] == 2 + 2 * depth  # hello, (ranges + stats) per level, model
    assert runs[8].model_.n_nodes > 4 * runs[1].model_.n_nodes
    batched = FederatedExtraTreesRegressor(8, max_depth=depth, tree_batch_size=3).fit(
        split_rows(horizontal_table(seed=5, task="regression"), 2), label="target")
    assert batched.communication_["rounds"] == 2 + 2 * depth * 3  # three batches


@pytest.mark.parametrize("n_parties", [1, 3])
def test_ppdert_domain_rounds_are_one_per_level(n_parties: int) -> None:
    table = horizontal_table(seed=5)
    model = PPDERTClassifier(10, max_depth=5, allow_data_ranges=True, thresholds="domain").fit(
        split_rows(table, n_parties), "target")
    assert model.master_.levels == 5
    # hello (keys), one per level (keys relayed in the first), model
    assert model.communication_["rounds"] == 2 + 5
    by_kind = model.communication_["by_kind"]
    assert by_kind["ppdert_level"]["count"] == 5 * n_parties
    assert "ppdert_cells" not in by_kind


@pytest.mark.parametrize("n_parties", [1, 3])
def test_ppdert_histogram_rounds_are_two_per_level(n_parties: int) -> None:
    table = horizontal_table(seed=5)
    model = PPDERTClassifier(10, max_depth=5, allow_data_ranges=True).fit(split_rows(table, n_parties),
                                                                          "target")
    assert model.master_.levels == 5
    assert model.communication_["rounds"] == 2 + 2 * 5  # hello, (cells + counts) per level, model
    by_kind = model.communication_["by_kind"]
    assert by_kind["ppdert_cells"]["count"] == by_kind["ppdert_counts"]["count"] == 5 * n_parties
    assert "ppdert_level" not in by_kind


def test_fet_regression_targets_never_reach_the_master() -> None:
    table = horizontal_table(seed=9, task="regression")
    parties = split_rows(table, 3)
    model = FederatedExtraTreesRegressor(4, max_depth=5, record_payloads=True).fit(parties, label="target")
    targets = continuous_bits(parties, ["target"])
    assert len(targets) == len(table)
    for entry in _to_master(model.transcript_):
        assert raw_values_in(entry.payload, targets) == 0, entry.kind
    hello = [Message.from_bytes(e.payload) for e in model.transcript_ if e.kind == "hello_reply"]
    # only a power-of-two bound on |y| (for the exact fixed-point scale), the row count and the party's
    # memory budget (bytes of its machine, for the batch plan)
    assert all(set(m.header) == {"n_rows", "y_exponent", "memory_budget"} for m in hello)
    assert max(m.header["y_exponent"] for m in hello) == int(np.frexp(np.abs(table["target"]).max())[1])
