"""Split criteria over sufficient statistics: class counts (gini, entropy) or (w, wy, wy^2) (squared error).

A node's *term* is its weighted impurity times its weight; a split's gain is parent term minus the
children's terms, the same quantity scikit-learn compares (divided by the tree's total weight, it is the
`min_impurity_decrease` of scikit-learn).
"""

from __future__ import annotations

import numba as nb
import numpy as np

GINI = 0
ENTROPY = 1
SQUARED_ERROR = 2

CRITERIA = {"gini": GINI, "entropy": ENTROPY, "log_loss": ENTROPY, "squared_error": SQUARED_ERROR}


@nb.njit(cache=True, inline="always")
def stats_weight(stats: np.ndarray, criterion: int) -> float:
    """Total weight carried by one statistics vector."""
    if criterion == SQUARED_ERROR:
        return stats[0]
    total = 0.0
    for k in range(stats.shape[0]):
        total += stats[k]
    return total


@nb.njit(cache=True, inline="always")
def impurity_term(stats: np.ndarray, criterion: int) -> float:
    """Weight times impurity of a node with these statistics."""
    if criterion == SQUARED_ERROR:
        w = stats[0]
        if w <= 0.0:
            return 0.0
        return stats[2] - stats[1] * stats[1] / w
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


def n_stats(criterion: int, n_classes: int) -> int:
    """Length of the statistics vector for a criterion."""
    return 3 if criterion == SQUARED_ERROR else n_classes


def leaf_value(stats: np.ndarray, criterion: int) -> np.ndarray:
    """Leaf prediction from node statistics: class probabilities, or the weighted mean (as a 1-vector)."""
    stats = np.asarray(stats, dtype=np.float64)
    if criterion == SQUARED_ERROR:
        w = np.where(stats[..., 0] > 0, stats[..., 0], 1.0)
        return (stats[..., 1] / w)[..., None]
    total = stats.sum(axis=-1, keepdims=True)
    return stats / np.where(total > 0, total, 1.0)


def min_gain(weight: np.ndarray) -> np.ndarray:
    """Smallest gain that counts as an improvement: guards against rounding noise on pure nodes."""
    return 1e-12 * np.maximum(weight, 1.0)
