"""The master's split choice from the summed histograms: the one criterion's scan, per node over features.

Each (node, feature) histogram is scanned by the same prefix scan the vertical parties run
(`fedcore.trees.splitting._scan`) on gradient statistics: XGBoost's gain, min_child_weight on H. A cut at bin
b sends bins 0..b left and the rest, missing values included, right (the horizontal model's rule: NaN goes
right). Ties keep the lowest feature, then the lowest bin; features a tree did not sample are skipped.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from fedcore.trees.criteria import GRADIENT, impurity_term
from fedcore.trees.splitting import _scan


@nb.njit(cache=True, parallel=True)
def best_bins(hist: np.ndarray, totals: np.ndarray, n_bins: np.ndarray, allowed: np.ndarray,
              reg_lambda: float, min_leaf: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per open node: the best gain (-inf when none), its feature and bin (-1 when none).

    `hist` (A, F, width, 3) float64 (count, G, H); `totals` (A, 3) each node's statistics; `n_bins` (F,) the
    bins of each feature; `allowed` (A, F) the features the node's tree sampled.
    """
    n_nodes, n_features, width, n_stats = hist.shape
    gain = np.full(n_nodes, -np.inf)
    feature = np.full(n_nodes, -1, dtype=np.int64)
    cut = np.full(n_nodes, -1, dtype=np.int64)
    ordered = np.arange(width)
    for a in nb.prange(n_nodes):
        cum = np.zeros(n_stats)
        lbuf = np.zeros(n_stats)
        rbuf = np.zeros(n_stats)
        missing = np.zeros(n_stats)
        parent = impurity_term(totals[a], GRADIENT, reg_lambda)
        best = -np.inf
        for f in range(n_features):
            if not allowed[a, f]:
                continue
            found, t, _ = _scan(hist[a, f], ordered, n_bins[f], totals[a], missing, False, parent, GRADIENT,
                                reg_lambda, min_leaf, best, cum, lbuf, rbuf)
            if t >= 0:
                best = found
                feature[a] = f
                cut[a] = t
        gain[a] = best
    return gain, feature, cut
