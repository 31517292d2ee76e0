"""One-round prediction (the owners' split sets, routed by the master) equals node-by-node routing.

It costs one round per row batch.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedcore.data.split import split_vertical
from fedcore.trees.predictor import route_by_split_sets
from fedcore.vertical.estimators import FederatedForestClassifier, FederatedForestRegressor
from tests.conftest import mixed_table


@pytest.fixture(scope="module")
def fitted():
    table = mixed_table(n_rows=700, seed=11, n_classes=3)
    train, test = table.iloc[:500], table.iloc[500:]
    parties = split_vertical(train, 3, label="target", seed=2)
    columns = [[c for c in p.columns if c != "target"] for p in parties]
    model = FederatedForestClassifier(n_estimators=12, max_depth=7,
                                      random_state=1).fit(parties, label="target")
    return model, [test[c] for c in columns], test["target"].to_numpy()


def test_one_round_equals_node_by_node(fitted) -> None:
    model, test_parties, _ = fitted
    np.testing.assert_array_equal(model.predict_proba(test_parties, method="one-round"),
                                  model.predict_proba(test_parties, method="node-by-node"))


@pytest.mark.parametrize("batch_rows", [1, 63, 64, 65, 1000])
def test_batch_size_does_not_change_predictions(fitted, batch_rows: int) -> None:
    model, test_parties, _ = fitted
    expected = model.predict_proba(test_parties)
    model.predict_batch_rows = batch_rows
    try:
        rounds_before = model.transport_.stats.rounds
        got = model.predict_proba(test_parties)
        assert model.transport_.stats.rounds - rounds_before == math.ceil(200 / batch_rows)
    finally:
        model.predict_batch_rows = 8192
    np.testing.assert_array_equal(expected, got)


def test_node_by_node_needs_one_round_per_level(fitted) -> None:
    model, test_parties, _ = fitted
    before = model.transport_.stats.rounds
    model.predict_proba(test_parties, method="node-by-node")
    assert model.transport_.stats.rounds - before == model.master_.structure.max_depth()


def test_one_round_routing_is_the_leaf_reached_with_all_columns(fitted) -> None:
    """Paper Alg. 3-4: one round of every party's split sets routes each row to the full-information leaf.

    That is the leaf a full-information traversal reaches, checked against a plain Python walk over all
    parties' splits.
    """
    model, test_parties, _ = fitted
    s = model.master_.structure
    for party, frame in zip(model.parties_, test_parties, strict=True):
        party.set_prediction_data(frame)
    n_rows = len(test_parties[0])
    set_row, sets = np.full(s.n_nodes, -1, np.int64), []
    for index, party in enumerate(model.parties_):
        owned = np.flatnonzero((s.left >= 0) & (s.owner == index))
        set_row[owned] = sum(len(part) for part in sets) + np.arange(len(owned))
        sets.append(party.handle(_predict_leaves_request(n_rows)).arrays["left"])
    got = route_by_split_sets(np.concatenate(sets), set_row, s.tree_offsets(), s.left, s.right, n_rows)
    np.testing.assert_array_equal(got, _walk_all(model, test_parties))


def _predict_leaves_request(n_rows: int):
    from fedcore.protocol.messages import Message

    return Message("predict_leaves", {"start": 0, "stop": n_rows})


def _walk_all(model, test_parties) -> np.ndarray:
    s = model.master_.structure
    offsets = s.tree_offsets()
    out = np.empty((len(test_parties[0]), s.n_trees), dtype=np.int64)
    for t in range(s.n_trees):
        for r in range(len(test_parties[0])):
            g = offsets[t]
            while s.left[g] != -1:
                party = model.parties_[s.owner[g]]
                m = party.model
                x = party._prediction.X[r, m.feature[g]]
                if np.isnan(x):
                    left = m.missing_left[g]
                elif m.is_categorical[g]:
                    code = int(x)
                    left = bool((int(m.cat_bits[g][code >> 6]) >> (code & 63)) & 1)
                else:
                    left = x <= m.threshold[g]
                g = offsets[t] + (s.left[g] if left else s.right[g])
            out[r, t] = g
    return out


def test_regressor_predicts_close_to_target() -> None:
    table = mixed_table(n_rows=900, seed=12, task="regression")
    train, test = table.iloc[:700], table.iloc[700:]
    parties = split_vertical(train, 2, label="target", seed=0)
    columns = [[c for c in p.columns if c != "target"] for p in parties]
    model = FederatedForestRegressor(n_estimators=30, random_state=0).fit(parties, label="target")
    pred = model.predict([test[c] for c in columns])
    y = test["target"].to_numpy()
    r2 = 1 - np.sum((pred - y) ** 2) / np.sum((y - y.mean()) ** 2)
    assert r2 > 0.6
    np.testing.assert_array_equal(pred, model.predict([test[c] for c in columns], method="node-by-node"))


def test_classifier_learns_the_signal(fitted) -> None:
    model, test_parties, y = fitted
    assert (model.predict(test_parties) == y).mean() > 0.6  # 3 balanced classes: chance is 0.33
    assert set(model.classes_) == {"class_0", "class_1", "class_2"}


def test_split_sets_of_another_shape_are_refused_by_party(fitted, monkeypatch) -> None:
    """A party answering for other nodes or rows than its model's is out of sync: refused, naming it."""
    from fedcore.errors import ProtocolError
    from fedcore.protocol.messages import Message

    model, test_parties, _ = fitted
    honest = model.transport_.exchange
    name = model.parties_[1].name

    def one_set_short(messages):
        replies = honest(messages)
        left = replies[name].arrays["left"]
        replies[name] = Message("split_sets", {}, {"left": left[1:]})
        return replies

    monkeypatch.setattr(model.transport_, "exchange", one_set_short)
    owned = int(np.sum((model.master_.structure.left >= 0) & (model.master_.structure.owner == 1)))
    with pytest.raises(ProtocolError) as refused:
        model.predict_proba(test_parties, method="one-round")
    assert str(refused.value) == (f"party {name!r} answered split sets of shape ({owned - 1}, 4) (uint64) "
                                  f"for the {owned} nodes it owns and 200 rows, expected ({owned}, 4) "
                                  "uint64: models out of sync")
