"""Split criteria over sufficient statistics: class counts, (w, wy) or boosting's (count, G, H).

Class counts for gini and entropy, (w, wy) for squared error, (count, G, H) for gradient statistics
(sums of gradients and hessians).

A node's *term* is its weighted impurity times its weight; a split's gain is parent term minus the
children's terms, the same quantity scikit-learn compares (divided by the tree's total weight, it is the
`min_impurity_decrease` of scikit-learn). Squared error's term is -(wy)^2 / w: its weighted variance
minus the sum of w y^2, which is the same on both sides of any split, so no gain needs it (and the sums of
(w, wy) are exact over targets on their grid, `fedcore.trees.fixed_gradients.fixed_targets`, where a sum of
w y^2 would not be). With gradient statistics the term is -G^2 / (2 (H + lambda)), so the
gain is XGBoost's (G_L^2/(H_L+lambda) + G_R^2/(H_R+lambda) - G^2/(H+lambda)) / 2 (gamma is the master's
threshold on it), a node's weight for `min_leaf` is H (XGBoost's min_child_weight) and its leaf value is
-G / (H + lambda). The criteria know no loss: the label holder turns (y, margin) into (g, h)
(`fedcore.trees.losses`).
"""

from __future__ import annotations

import numba as nb
import numpy as np

GINI = 0
ENTROPY = 1
SQUARED_ERROR = 2
GRADIENT = 3

CRITERIA = {"gini": GINI, "entropy": ENTROPY, "log_loss": ENTROPY, "squared_error": SQUARED_ERROR}
"""The criteria a forest grows with (by the names scikit-learn gives them)."""
STATISTICS = {**CRITERIA, "gradient": GRADIENT}
"""Every statistics code a party accepts: the forests' criteria and boosting's gradient statistics."""
VALUE_STATISTICS = (SQUARED_ERROR, GRADIENT)
"""Codes whose statistics are (weight, value sums), not class counts: squared error's (w, wy), gradient's
(count, G, H)."""


@nb.njit(cache=True, nogil=True, inline="always")
def stats_weight(stats: np.ndarray, criterion: int) -> float:
    """Total weight carried by one statistics vector (gradient statistics: the hessian sum H)."""
    if criterion == SQUARED_ERROR:
        return stats[0]
    if criterion == GRADIENT:
        return stats[2]
    total = 0.0
    for k in range(stats.shape[0]):
        total += stats[k]
    return total


@nb.njit(cache=True, nogil=True, inline="always")
def impurity_term(stats: np.ndarray, criterion: int, reg_lambda: float = 0.0) -> float:
    """Weight times impurity of a node with these statistics (`reg_lambda`: gradient statistics' L2 term)."""
    if criterion == GRADIENT:
        return _gradient_term(stats, reg_lambda)
    if criterion == SQUARED_ERROR:
        w = stats[0]
        if w <= 0.0:
            return 0.0
        return -(stats[1] * stats[1] / w)
    n = 0.0
    for k in range(stats.shape[0]):
        n += stats[k]
    if n <= 0.0:
        return 0.0
    if criterion == GINI:
        s = 0.0
        for k in range(stats.shape[0]):
            s += stats[k] * stats[k]
        return n - s / n
    s = 0.0
    for k in range(stats.shape[0]):
        c = stats[k]
        if c > 0.0:
            s += c * np.log2(c)
    return n * np.log2(n) - s


@nb.njit(cache=True, nogil=True, inline="always")
def _gradient_term(stats: np.ndarray, reg_lambda: float) -> float:
    """-G^2 / (2 (H + lambda)): XGBoost's structure score of a node, negated (0 where H + lambda <= 0)."""
    denominator = stats[2] + reg_lambda
    if denominator <= 0.0:
        return 0.0
    return -(stats[1] * stats[1] / denominator) * 0.5


def n_stats(criterion: int, n_classes: int) -> int:
    """Length of the statistics vector for a criterion."""
    if criterion == SQUARED_ERROR:
        return 2
    return 3 if criterion == GRADIENT else n_classes


def node_count(stats: np.ndarray, criterion: int) -> np.ndarray:
    """The (bootstrap-weighted) rows of nodes with these statistics (last axis: the statistics)."""
    stats = np.asarray(stats, dtype=np.float64)
    return stats[..., 0] if criterion in VALUE_STATISTICS else stats.sum(axis=-1)


def leaf_value(stats: np.ndarray, criterion: int, reg_lambda: float = 0.0,
               learning_rate: float = 1.0) -> np.ndarray:
    """Leaf prediction from node statistics: class probabilities, or the weighted mean (as a 1-vector).

    Gradient statistics: the leaf weight -G / (H + lambda) times the learning rate (as a 1-vector; 0 where
    H + lambda is not positive), what a boosting round adds to the margins of the leaf's rows.
    """
    stats = np.asarray(stats, dtype=np.float64)
    if criterion == GRADIENT:
        denominator = stats[..., 2] + reg_lambda
        safe = np.where(denominator > 0, denominator, 1.0)
        return (learning_rate * np.where(denominator > 0, -stats[..., 1] / safe, 0.0))[..., None]
    if criterion == SQUARED_ERROR:
        w = np.where(stats[..., 0] > 0, stats[..., 0], 1.0)
        return (stats[..., 1] / w)[..., None]
    total = stats.sum(axis=-1, keepdims=True)
    return stats / np.where(total > 0, total, 1.0)


def min_gain(weight: np.ndarray) -> np.ndarray:
    """Smallest gain that counts as an improvement: guards against rounding noise on pure nodes."""
    return 1e-12 * np.maximum(weight, 1.0)
