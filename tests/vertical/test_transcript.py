"""What crosses the wire in plain vertical Federated Forest, asserted on recorded transcripts
(DESIGN.md, "What crosses the wire"), and round counts that grow with depth only."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.data.split import split_vertical
from fedcore.protocol.messages import Message
from fedcore.vertical.estimators import FederatedForestClassifier
from tests.conftest import mixed_table

TO_MASTER = {"setup_reply", "labels", "ack", "local_best", "partition_bits", "leaf_sets"}
TO_PARTIES = {"setup", "export_labels", "configure", "begin_batch", "find_splits", "apply_splits", "finalize",
              "predict_leaves"}


@pytest.fixture(scope="module")
def recorded():
    table = mixed_table(n_rows=400, seed=21, n_classes=3)
    train, test = table.iloc[:300], table.iloc[300:]
    parties = split_vertical(train, 3, label="target", seed=5)
    columns = [[c for c in p.columns if c != "target"] for p in parties]
    model = FederatedForestClassifier(n_estimators=6, max_depth=5, record_payloads=True).fit(parties, label="target")
    model.predict([test[c] for c in columns])
    return model, table


def _payloads(model, receiver=None, sender=None):
    return [e for e in model.transport_.transcript
            if (receiver is None or e.receiver == receiver) and (sender is None or e.sender == sender)]


def test_message_kinds_per_direction(recorded) -> None:
    model, _ = recorded
    assert {e.kind for e in _payloads(model, receiver="master")} == TO_MASTER
    assert {e.kind for e in _payloads(model, sender="master")} == TO_PARTIES


def test_no_raw_value_name_or_label_crosses(recorded) -> None:
    model, table = recorded
    blobs = [e.payload for e in model.transport_.transcript]
    numeric = table.select_dtypes("number").drop(columns=["int0"])
    needles = {f"value {v!r}": np.float64(v).tobytes() for v in numeric.stack().dropna().to_numpy()[::7]}
    needles.update({f"column {c!r}": c.encode() for c in table.columns if c != "target"})
    needles.update({f"category {c!r}": c.encode() for c in ("crimson", "emerald", "azure", "onyx")})
    needles.update({f"label {c!r}": c.encode() for c in ("class_0", "class_1", "class_2")})
    for party in model.parties_:
        m = party.model
        for threshold in m.threshold[np.isfinite(m.threshold)]:
            if float(threshold * 2).is_integer():
                continue  # thresholds of the integer column (k + 0.5) coincide with ordinary counts and gains
            needles[f"threshold {threshold!r} of {party.name}"] = np.float64(threshold).tobytes()
    leaked = [name for name, needle in needles.items() if any(needle in blob for blob in blobs)]
    assert leaked == []


def test_master_receives_only_gains_ranks_stats_and_bits(recorded) -> None:
    model, _ = recorded
    allowed = {"setup_reply": {"feature_ids"}, "labels": {"y"}, "ack": set(), "local_best": {"gain", "rank", "stats"},
               "partition_bits": {"bits"}, "leaf_sets": {"sets"}}
    for entry in _payloads(model, receiver="master"):
        assert set(Message.from_bytes(entry.payload).arrays) <= allowed[entry.kind], entry.kind
    stats_senders = {e.sender for e in _payloads(model, receiver="master")
                     if e.kind == "local_best" and "stats" in Message.from_bytes(e.payload).arrays}
    assert stats_senders == {model.label_holder_.name}


def test_parties_receive_only_other_owners_bitmaps(recorded) -> None:
    model, _ = recorded
    for index, party in enumerate(model.parties_):
        for entry in _payloads(model, receiver=party.name):
            arrays = Message.from_bytes(entry.payload).arrays
            assert f"bits_{index}" not in arrays
            if entry.kind == "find_splits":
                assert set(arrays) <= {"feat_ptr", "feat_global", "feat_rank", "split_mask", "split_owner"} | {
                    f"bits_{q}" for q in range(3) if q != index}


@pytest.mark.parametrize("n_estimators,n_rows", [(3, 300), (12, 300), (3, 900)])
def test_training_rounds_grow_with_depth_only(n_estimators: int, n_rows: int) -> None:
    depth = 4
    table = mixed_table(n_rows=n_rows, seed=22, n_classes=2)
    parties = split_vertical(table, 2, label="target", seed=0)
    model = FederatedForestClassifier(n_estimators=n_estimators, max_depth=depth).fit(parties, label="target")
    assert model.master_.structure.max_depth() == depth
    # setup, labels, configure, finalize + per batch: begin, (find + apply) per split level, final find
    assert model.communication_["rounds"] == 4 + (1 + 2 * depth + 1)


def test_tree_batches_add_rounds_per_batch() -> None:
    table = mixed_table(n_rows=300, seed=23, n_classes=2)
    parties = split_vertical(table, 2, label="target", seed=0)
    model = FederatedForestClassifier(n_estimators=6, max_depth=3, tree_batch_size=2).fit(parties, label="target")
    assert model.communication_["rounds"] == 4 + 3 * (1 + 2 * 3 + 1)
