"""Criteria kernels (fedcore/trees/criteria.py) against their textbook definitions.

Computed from the raw weighted samples of a node rather than from the sufficient statistics the kernels read,
and against the node impurities scikit-learn reports for the same samples. Squared error's term leaves out
the sum of w y^2 (the same on both sides of a split: `squares` adds it back for the comparison).
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.trees.criteria import (
    CRITERIA,
    ENTROPY,
    GINI,
    SQUARED_ERROR,
    impurity_term,
    leaf_value,
    min_gain,
    n_stats,
    stats_weight,
)
from tests.trees.references import reference_term

CLASSIFICATION = [GINI, ENTROPY]


def class_stats(y: np.ndarray, w: np.ndarray, n_classes: int) -> np.ndarray:
    """Class-weight vector of weighted samples, by a plain loop."""
    out = np.zeros(n_classes)
    for label, weight in zip(y.tolist(), w.tolist(), strict=True):
        out[int(label)] += weight
    return out


def moment_stats(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(sum w, sum w*y) of weighted samples, by a plain loop."""
    out = np.zeros(2)
    for value, weight in zip(y.tolist(), w.tolist(), strict=True):
        out += (weight, weight * value)
    return out


def squares(y: np.ndarray, w: np.ndarray, criterion: int) -> float:
    """What squared error's term leaves out, sum w*y^2 (0 for the class criteria)."""
    return float(np.sum(w * y * y)) if criterion == SQUARED_ERROR else 0.0


def term_tolerance(y: np.ndarray, w: np.ndarray, criterion: int) -> float:
    """Absolute tolerance for a node term.

    The kernel subtracts quantities as large as W (classes) or sum w*y^2 (squared error) and each carries a
    few ulps of rounding, so the error scales with them, not with the (possibly tiny) term; 1e-12 of that
    scale leaves a wide margin over ~100 ulps.
    """
    spread = 1.0 + float(np.max(y * y, initial=0.0)) if criterion == SQUARED_ERROR else 1.0
    return 1e-12 * max(float(np.sum(w)) * spread, 1.0)


def random_node(rng: np.random.Generator, n: int, criterion: int,
                n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` weighted samples (bootstrap-like integer weights 1..4): class codes or real targets."""
    w = rng.integers(1, 5, n).astype(np.float64)
    if criterion == SQUARED_ERROR:
        return rng.normal(3.0, 2.0, n), w
    return rng.integers(0, n_classes, n).astype(np.float64), w


def node_stats(y: np.ndarray, w: np.ndarray, criterion: int, n_classes: int) -> np.ndarray:
    """Sufficient statistics of a node in the kernels' layout."""
    return moment_stats(y, w) if criterion == SQUARED_ERROR else class_stats(y, w, n_classes)


@pytest.mark.parametrize("criterion", [GINI, ENTROPY, SQUARED_ERROR])
@pytest.mark.parametrize("n", [1, 2, 3, 7, 40, 300])
@pytest.mark.parametrize("n_classes", [1, 2, 5])
def test_impurity_term_and_weight_match_definitions(criterion: int, n: int, n_classes: int) -> None:
    rng = np.random.default_rng(1000 * criterion + 10 * n + n_classes)
    for _ in range(20):
        y, w = random_node(rng, n, criterion, n_classes)
        stats = node_stats(y, w, criterion, n_classes)
        assert stats_weight(stats, criterion) == np.sum(w)  # integer weights: exact
        got = impurity_term(stats, criterion) + squares(y, w, criterion)
        assert got == pytest.approx(reference_term(y, w, criterion, n_classes),
                                    abs=term_tolerance(y, w, criterion))


@pytest.mark.parametrize("criterion", CLASSIFICATION)
@pytest.mark.parametrize("counts", [[5.0], [0.0, 7.0, 0.0], [3.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
def test_pure_class_node_has_exactly_zero_term(criterion: int, counts: list[float]) -> None:
    """One class only: n - n^2/n and n log2 n - n log2 n are exact, so a pure node contributes 0.0."""
    assert impurity_term(np.array(counts), criterion) == 0.0


@pytest.mark.parametrize("criterion", CLASSIFICATION)
def test_uniform_classes_reach_the_maximum(criterion: int) -> None:
    """Equal weights over C classes: gini (1 - 1/C) per unit weight, entropy log2 C bits."""
    for c in (2, 3, 4, 8):
        stats = np.full(c, 6.0)
        expected = 6.0 * c * ((1.0 - 1.0 / c) if criterion == GINI else np.log2(c))
        assert impurity_term(stats, criterion) == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("criterion", [GINI, ENTROPY, SQUARED_ERROR])
def test_empty_node(criterion: int) -> None:
    """No weight: term 0 (not NaN), weight 0, leaf value 0."""
    stats = np.zeros(n_stats(criterion, 3))
    assert impurity_term(stats, criterion) == 0.0
    assert stats_weight(stats, criterion) == 0.0
    np.testing.assert_array_equal(leaf_value(stats, criterion),
                                  np.zeros(1 if criterion == SQUARED_ERROR else 3))


def test_squared_error_weight_is_the_first_statistic_only() -> None:
    """(w, wy): the weight is stats[0], not the sum of the vector."""
    stats = moment_stats(np.array([2.0, -1.0, 4.0]), np.array([1.0, 3.0, 2.0]))
    assert stats_weight(stats, SQUARED_ERROR) == 6.0


def test_split_gain_equals_weighted_impurity_decrease() -> None:
    """Parent term - children terms = W * (impurity decrease scikit-learn computes), for any partition."""
    rng = np.random.default_rng(5)
    for criterion in (GINI, ENTROPY, SQUARED_ERROR):
        y, w = random_node(rng, 60, criterion, 3)
        left = rng.random(60) < 0.4
        stats = [node_stats(y[m], w[m], criterion, 3) for m in (np.ones(60, bool), left, ~left)]
        gain = (impurity_term(stats[0], criterion) - impurity_term(stats[1], criterion)
                - impurity_term(stats[2], criterion))
        W = np.sum(w)
        imp = [reference_term(y[m], w[m], criterion, 3) / np.sum(w[m])
               for m in (np.ones(60, bool), left, ~left)]
        decrease = imp[0] - np.sum(w[left]) / W * imp[1] - np.sum(w[~left]) / W * imp[2]
        # both sides are differences of O(W * scale) quantities: compare at that scale
        assert gain == pytest.approx(W * decrease, abs=1e-11 * W * (1 + np.max(y * y)))


@pytest.mark.parametrize("kind", ["gini", "entropy", "squared_error"])
def test_node_impurities_match_scikit_learn(kind: str) -> None:
    """scikit-learn's tree_.impurity of every node, times its weight, equals impurity_term.

    Its weight is its weighted sample count; the node's statistics are gathered here from the training samples
    that reach it (decision_path).
    """
    from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

    rng = np.random.default_rng(7)
    X = rng.normal(size=(400, 4))
    w = rng.integers(1, 4, 400).astype(np.float64)
    criterion = CRITERIA[kind]
    if criterion == SQUARED_ERROR:
        y = X[:, 0] * 2 + rng.normal(size=400)
        model = DecisionTreeRegressor(criterion=kind, max_depth=4, random_state=0).fit(X, y, sample_weight=w)
    else:
        y = (X[:, 0] + 0.5 * X[:, 1] > rng.normal(size=400)).astype(np.float64) + (X[:, 2] > 1)
        model = DecisionTreeClassifier(criterion=kind, max_depth=4, random_state=0).fit(X, y, sample_weight=w)
    paths = model.decision_path(X).toarray().astype(bool)
    t = model.tree_
    assert t.node_count > 7
    for node in range(t.node_count):
        reach = paths[:, node]
        stats = node_stats(y[reach], w[reach], criterion, 3)
        weight = stats_weight(stats, criterion)
        assert weight == t.weighted_n_node_samples[node]
        # scikit-learn sums in its own order (and in float64 for squared error): compare at the term scale
        term = impurity_term(stats, criterion) + squares(y[reach], w[reach], criterion)
        assert term / weight == pytest.approx(t.impurity[node],
                                                                         rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("criterion", CLASSIFICATION)
def test_leaf_value_is_class_shares(criterion: int) -> None:
    rng = np.random.default_rng(11)
    stats = rng.integers(0, 5, (4, 6, 3)).astype(np.float64)
    stats[0, 0] = 0.0
    got = leaf_value(stats, criterion)
    assert got.shape == stats.shape
    for index in np.ndindex(stats.shape[:-1]):
        total = stats[index].sum()
        expected = stats[index] / total if total > 0 else np.zeros(3)
        np.testing.assert_array_equal(got[index], expected)  # one division per entry: exact


def test_leaf_value_is_weighted_mean() -> None:
    rng = np.random.default_rng(12)
    nodes = [random_node(rng, n, SQUARED_ERROR, 0) for n in (1, 5, 30)]
    stats = np.stack([moment_stats(y, w) for y, w in nodes] + [np.zeros(2)])
    got = leaf_value(stats, SQUARED_ERROR)
    assert got.shape == (4, 1)
    for k, (y, w) in enumerate(nodes):
        assert got[k, 0] == pytest.approx(np.average(y, weights=w), rel=1e-13)
    assert got[3, 0] == 0.0


def test_min_gain_scales_with_weight_from_one() -> None:
    weight = np.array([0.0, 0.5, 1.0, 10.0, 1e6])
    np.testing.assert_array_equal(min_gain(weight), 1e-12 * np.array([1.0, 1.0, 1.0, 10.0, 1e6]))


def test_criterion_codes_and_statistic_lengths() -> None:
    assert CRITERIA == {"gini": GINI, "entropy": ENTROPY, "log_loss": ENTROPY, "squared_error": SQUARED_ERROR}
    assert n_stats(SQUARED_ERROR, 7) == 2 and n_stats(GINI, 7) == 7 and n_stats(ENTROPY, 2) == 2
