"""Exact TreeSHAP contributions of horizontal forests: Shapley values by brute force, and additivity."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from fedcore.horizontal.contributions import contributions
from fedcore.horizontal.estimators import FederatedExtraTreesClassifier, FederatedExtraTreesRegressor
from fedcore.horizontal.model import HorizontalForest

N_FEATURES = 5


def _table(n_rows: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_rows, N_FEATURES))
    frame = pd.DataFrame(x, columns=[f"x{j}" for j in range(N_FEATURES)])
    frame.loc[::11, "x1"] = np.nan  # missing values go right, in the explanation as in prediction
    frame["target"] = 2 * x[:, 0] - x[:, 1] * (x[:, 2] > 0) + 0.3 * rng.normal(size=n_rows)
    frame["label"] = np.where(frame["target"] > 0.5, "high", np.where(frame["target"] < -0.5, "low", "mid"))
    return frame


def _parties(frame: pd.DataFrame, label: str) -> dict[str, pd.DataFrame]:
    drop = "label" if label == "target" else "target"
    rows = frame.drop(columns=[drop])
    return {"north": rows.iloc[::2].reset_index(drop=True), "south": rows.iloc[1::2].reset_index(drop=True)}


@pytest.fixture(scope="module")
def regressor() -> FederatedExtraTreesRegressor:
    return FederatedExtraTreesRegressor(n_estimators=4, max_depth=4, random_state=2).fit(
        _parties(_table(400, 1), "target"), label="target")


@pytest.fixture(scope="module")
def classifier() -> FederatedExtraTreesClassifier:
    return FederatedExtraTreesClassifier(n_estimators=4, max_depth=4, random_state=2).fit(
        _parties(_table(400, 1), "label"), label="label")


def _conditional_expectation(forest: HorizontalForest, tree: int, x: np.ndarray,
                             known: set[int]) -> np.ndarray:
    """The tree's output knowing x on the features in `known`: follow x there, else both children by share."""
    start = forest.tree_offsets()[tree]

    def expect(node: int) -> np.ndarray:
        row = start + node
        feature = int(forest.feature[row])
        if feature < 0:
            return forest.value[row]
        left, right = int(forest.left[row]), int(forest.right[row])
        if feature in known:
            return expect(left if x[feature] <= forest.threshold[row] else right)
        cover_left, cover_right = forest.weight[start + left], forest.weight[start + right]
        total = cover_left + cover_right
        return cover_left / total * expect(left) + cover_right / total * expect(right)

    return expect(0)


def _shapley_by_subsets(forest: HorizontalForest, x: np.ndarray) -> np.ndarray:
    """Shapley values by their definition: every subset of the other features, weighted |S|!(M-|S|-1)!/M!."""
    m = len(x)
    phi = np.zeros((m, forest.value.shape[1]))
    for tree in range(forest.n_trees):
        for i in range(m):
            others = [f for f in range(m) if f != i]
            for size in range(m):
                weight = math.factorial(size) * math.factorial(m - size - 1) / math.factorial(m)
                for subset in itertools.combinations(others, size):
                    with_i = _conditional_expectation(forest, tree, x, {*subset, i})
                    without = _conditional_expectation(forest, tree, x, set(subset))
                    phi[i] += weight * (with_i - without)
    return phi / forest.n_trees


@pytest.mark.parametrize("model_name", ["regressor", "classifier"])
def test_contributions_are_the_shapley_values(model_name, request) -> None:
    model = request.getfixturevalue(model_name)
    held_out = _table(12, 5)
    X = model.schema_.encode(held_out.drop(columns=["target", "label"]))
    phi, _ = contributions(model.model_, X)
    for r in range(len(X)):
        np.testing.assert_allclose(phi[r], _shapley_by_subsets(model.model_, X[r]), rtol=0, atol=1e-12)


def test_contributions_add_up_to_the_prediction(regressor, classifier) -> None:
    rows = _table(200, 9).drop(columns=["target", "label"])
    explained = regressor.predict_contributions(rows)
    assert explained.shape == (200, N_FEATURES + 1)
    np.testing.assert_allclose(explained.sum(axis=1), regressor.predict(rows), rtol=0, atol=1e-12)
    assert np.ptp(explained[:, -1]) == 0  # the expected value, the same for every row

    explained = classifier.predict_contributions(rows)
    assert explained.shape == (200, len(classifier.classes_), N_FEATURES + 1)
    np.testing.assert_allclose(explained.sum(axis=2), classifier.predict_proba(rows), rtol=0, atol=1e-12)


def test_a_feature_no_split_uses_contributes_nothing(regressor) -> None:
    forest = regressor.model_
    used = set(forest.feature[forest.feature >= 0].tolist())
    unused = [f for f in range(N_FEATURES) if f not in used]
    rows = _table(50, 3).drop(columns=["target", "label"])
    explained = regressor.predict_contributions(rows)
    assert used and np.all(explained[:, unused] == 0.0)
    assert np.abs(explained[:, sorted(used)]).sum() > 0
