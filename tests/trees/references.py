"""Brute-force references shared by the kernel tests of tests/trees/."""

from __future__ import annotations

import numpy as np

from fedcore.trees.criteria import GINI, SQUARED_ERROR


def reference_term(y: np.ndarray, w: np.ndarray, criterion: int, n_classes: int = 0) -> float:
    """Weight times impurity of weighted samples, by definition.

    Gini 1 - sum p^2, entropy -sum p log2 p (bits, as scikit-learn), squared error the weighted mean of (y -
    mean)^2 (two passes, no sum-of-squares shortcut). Class labels are the codes 0 .. n_classes - 1.
    """
    total = float(np.sum(w))
    if total <= 0:
        return 0.0
    if criterion == SQUARED_ERROR:
        mean = float(np.sum(w * y)) / total
        return float(np.sum(w * (y - mean) ** 2))
    p = np.bincount(np.asarray(y).astype(np.int64), weights=w, minlength=n_classes) / total
    if criterion == GINI:
        return total * (1.0 - float(np.sum(p * p)))
    p = p[p > 0]
    return total * float(-np.sum(p * np.log2(p)))
