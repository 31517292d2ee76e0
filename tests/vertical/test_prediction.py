"""One-round prediction (leaf-set intersection) equals node-by-node routing, in any batch size.

It costs one round per row batch.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedcore.data.split import split_vertical
from fedcore.trees.predictor import intersect_leaf_sets
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


def test_intersection_is_the_leaf_reached_with_all_columns(fitted) -> None:
    """Paper Alg. 3-4: each party's leaf sets intersect in exactly the full-information leaf.

    That is the leaf a full-information traversal reaches, checked against a plain Python walk over all
    parties' splits.
    """
    model, test_parties, _ = fitted
    s = model.master_.structure
    for party, frame in zip(model.parties_, test_parties, strict=True):
        party.set_prediction_data(frame)
    leaf_offsets, leaf_nodes, _ = s.leaves()
    sets = [p.handle(_predict_leaves_request(len(test_parties[0]))).arrays["sets"] for p in model.parties_]
    combined = np.bitwise_and.reduce(np.stack(sets), axis=0)
    slots = intersect_leaf_sets(combined[None], leaf_offsets, len(test_parties[0]))
    expected = _walk_all(model, test_parties)
    np.testing.assert_array_equal(leaf_nodes[leaf_offsets[:-1][None, :] + slots], expected)


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
