"""What crosses the wire, asserted on recorded transcripts with payload bytes (DESIGN: "What crosses the
wire"), and the round count of a fit (DESIGN principle 1: rounds grow with depth, never with nodes)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedcore.horizontal import FederatedExtraTreesClassifier, FederatedExtraTreesRegressor, PPDERTClassifier
from fedcore.horizontal.ppdert import ppdert_candidates
from fedcore.protocol.messages import Message
from fedcore.transport.base import MASTER
from tests.horizontal.common import continuous_bits, horizontal_table, raw_values_in, split_rows

NUMERIC = [f"num{i}" for i in range(8)]


def _declared_ranges(table):
    """Generous integer bounds, as a data contract would declare them (not the data's own min/max)."""
    return {c: (math.floor(table[c].min()) - 1.0, math.ceil(table[c].max()) + 1.0) for c in [*NUMERIC, "int0", "flag"]}


@pytest.fixture(scope="module")
def ppdert_run():
    table = horizontal_table(seed=4)
    parties = split_rows(table, 3, seed=1)
    model = PPDERTClassifier(5, max_depth=6, feature_ranges=_declared_ranges(table), random_state=2,
                             record_payloads=True).fit(parties, label="target")
    return table, parties, model


@pytest.fixture(scope="module")
def fet_run():
    table = horizontal_table(seed=4)
    parties = split_rows(table, 3, seed=1)
    model = FederatedExtraTreesClassifier(5, max_depth=6, random_state=2, record_payloads=True).fit(
        parties, label="target")
    return table, parties, model


def _to_master(transcript):
    return [e for e in transcript if e.receiver == MASTER]


def test_ppdert_no_raw_value_or_label_crosses(ppdert_run) -> None:
    _, parties, model = ppdert_run
    raw = continuous_bits(parties, NUMERIC)
    assert len(raw) > 4000
    for entry in model.transcript_:
        assert raw_values_in(entry.payload, raw) == 0, (entry.sender, entry.receiver, entry.kind)
        assert b"class_" not in entry.payload, entry.kind  # label values
        assert b"num1" not in entry.payload and b"cat_str" not in entry.payload  # column names


def test_search_for_raw_values_finds_them_where_they_are(fet_run) -> None:
    """The same search finds raw values in FET's min/max replies (so the PPD-ERT test can fail)."""
    _, parties, model = fet_run
    raw = continuous_bits(parties, NUMERIC)
    found = sum(raw_values_in(e.payload, raw) for e in model.transcript_ if e.kind == "fet_ranges_reply")
    assert found > 100


def test_ppdert_master_receives_only_uniform_masked_vectors(ppdert_run) -> None:
    _, _, model = ppdert_run
    masked = []
    kinds = set()
    for entry in _to_master(model.transcript_):
        message = Message.from_bytes(entry.payload)
        kinds.add(message.kind)
        if message.kind == "ppdert_masked_counts":
            assert set(message.arrays) == {"masked"}
            assert message.arrays["masked"].dtype == np.uint64
            masked.append(message.arrays["masked"])
        else:
            assert message.kind in ("hello_reply", "ack")
            assert set(message.arrays) <= {"public_key"}
    assert kinds == {"hello_reply", "ppdert_masked_counts", "ack"}
    values = np.concatenate(masked)
    assert len(values) > 5_000
    # uniform modulo 2**64: no small numbers (plain counts would all be < 2**32), each bit set half the time
    assert (values < np.uint64(1 << 32)).sum() == 0
    bits = (values[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    assert np.all(np.abs(bits.mean(axis=0) - 0.5) < 0.03)


def _level0_counts(frame, schema, low, high, seed, trees, k):
    """A party's plain level-0 branch counts, recomputed from its data: what must never cross."""
    X = schema.encode(frame)
    y = schema.encode_labels(frame["target"])
    features, thresholds = ppdert_candidates(seed, np.asarray(trees), 0, low, high, k)
    C = schema.n_classes
    out = np.zeros((len(trees), k, 2, C), np.int64)
    for a in range(len(trees)):
        for j in range(k):
            right = ~(X[:, features[a, j]] <= thresholds[a, j])
            out[a, j] = np.stack([np.bincount(y[~right], minlength=C), np.bincount(y[right], minlength=C)])
    return out.reshape(-1)


def test_ppdert_no_party_count_vector_crosses(ppdert_run) -> None:
    table, parties, model = ppdert_run
    master = model.master_
    per_party = [_level0_counts(f, model.schema_, master.low, master.high, 2, range(5), master.k) for f in parties]
    # the reconstruction is right: the pooled vector is exactly what a single party sends in plain
    single = PPDERTClassifier(5, max_depth=6, feature_ranges=_declared_ranges(table), random_state=2,
                              record_payloads=True).fit([table], label="target")
    plain = [Message.from_bytes(e.payload) for e in single.transcript_ if e.kind == "ppdert_plain_counts"]
    np.testing.assert_array_equal(plain[0].arrays["counts"], np.sum(per_party, axis=0))
    assert plain[0].header == {"plain": True}
    for vector in per_party:
        assert vector.sum() > 0
        window = vector[:6]
        for encoding in (window.astype("<i8").tobytes(), window.astype("<u8").tobytes(),
                         window.astype("<f8").tobytes(), window.astype("<i4").tobytes()):
            for entry in model.transcript_:
                assert encoding not in entry.payload, entry.kind


def test_fet_plain_master_receives_min_max_and_counts(fet_run) -> None:
    _, parties, model = fet_run
    k = model.master_.k
    C = model.schema_.n_classes
    seen = set()
    for entry in _to_master(model.transcript_):
        message = Message.from_bytes(entry.payload)
        seen.add(message.kind)
        if message.kind == "fet_ranges_reply":
            assert set(message.arrays) == {"min", "max"}
            assert message.arrays["min"].dtype == np.float64 and message.arrays["min"].shape[1] == k
        elif message.kind == "fet_counts":
            counts = message.arrays["counts"]
            assert set(message.arrays) == {"counts"} and counts.dtype == np.int64
            assert counts.shape[1:] == (k, 2, C)
        elif message.kind == "hello_reply":
            assert message.arrays == {} and set(message.header) == {"n_rows"}
        else:
            assert message.kind == "ack"
        assert b"class_" not in entry.payload
    assert seen == {"hello_reply", "fet_ranges_reply", "fet_counts", "ack"}
    # the first level's min/max are the party's own local min/max of the candidates
    first = [e for e in model.transcript_ if e.kind == "fet_ranges"][0]
    features = Message.from_bytes(first.payload).arrays["features"]
    reply = Message.from_bytes([e for e in model.transcript_ if e.kind == "fet_ranges_reply"
                                and e.sender == "party0"][0].payload)
    X = model.schema_.encode(parties[0])
    np.testing.assert_array_equal(reply.arrays["min"], np.nanmin(X[:, features], axis=0))
    np.testing.assert_array_equal(reply.arrays["max"], np.nanmax(X[:, features], axis=0))
    to_parties = {e.kind for e in model.transcript_ if e.sender == MASTER}
    assert to_parties == {"hello", "fet_ranges", "fet_stats", "model"}


def test_fet_noisy_modes_send_only_their_statistics() -> None:
    table = horizontal_table(seed=4)
    parties = split_rows(table, 2)
    gdp = FederatedExtraTreesClassifier(3, max_depth=3, privacy="gdp", record_payloads=True).fit(parties, "target")
    ldp = FederatedExtraTreesClassifier(3, max_depth=3, privacy="ldp", record_payloads=True).fit(parties, "target")
    gdp_kinds = {e.kind for e in _to_master(gdp.transcript_)}
    ldp_kinds = {e.kind for e in _to_master(ldp.transcript_)}
    assert gdp_kinds == {"hello_reply", "fet_ranges_reply", "fet_noisy_counts", "ack"}
    assert ldp_kinds == {"hello_reply", "fet_ranges_reply", "fet_bit_sums", "ack"}
    for entry in _to_master(gdp.transcript_):
        if entry.kind == "fet_noisy_counts":
            counts = Message.from_bytes(entry.payload).arrays["counts"]
            assert counts.dtype == np.float64 and np.any(counts != np.round(counts))  # noised, not integers
    for entry in _to_master(ldp.transcript_):
        if entry.kind == "fet_bit_sums":
            arrays = Message.from_bytes(entry.payload).arrays
            assert set(arrays) == {"bit_sums", "sizes"}
            assert arrays["bit_sums"].shape[-1] == 32


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
def test_ppdert_rounds_are_one_per_level(n_parties: int) -> None:
    table = horizontal_table(seed=5)
    model = PPDERTClassifier(10, max_depth=5, allow_data_ranges=True).fit(split_rows(table, n_parties), "target")
    assert model.master_.levels == 5
    assert model.communication_["rounds"] == 2 + 5  # hello (keys), one per level (keys relayed in the first), model
    by_kind = model.communication_["by_kind"]
    assert by_kind["ppdert_level"]["count"] == 5 * n_parties


def test_fet_regression_targets_never_reach_the_master() -> None:
    table = horizontal_table(seed=9, task="regression")
    parties = split_rows(table, 3)
    model = FederatedExtraTreesRegressor(4, max_depth=5, record_payloads=True).fit(parties, label="target")
    targets = continuous_bits(parties, ["target"])
    assert len(targets) == len(table)
    for entry in _to_master(model.transcript_):
        assert raw_values_in(entry.payload, targets) == 0, entry.kind
    hello = [Message.from_bytes(e.payload) for e in model.transcript_ if e.kind == "hello_reply"]
    # only a power-of-two bound on |y| (for the exact fixed-point scale) and the row count
    assert all(set(m.header) == {"n_rows", "y_exponent"} for m in hello)
    assert max(m.header["y_exponent"] for m in hello) == int(np.frexp(np.abs(table["target"]).max())[1])
