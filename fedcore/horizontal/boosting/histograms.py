"""A party's per node, feature and bin sums of (count, g, h), in fixed point.

Dense over every feature's slots (values and the missing slot): a masked vector must have the same shape at
every party, and a sparse one would tell the master which bins a party holds. Integer sums: the blocks of
work (nodes over threads) write disjoint outputs, so the result depends on no thread count.
"""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(cache=True, parallel=True)
def node_histograms(order: np.ndarray, starts: np.ndarray, ends: np.ndarray, node_slot: np.ndarray,
                    codes: np.ndarray, qgh: np.ndarray, width: int) -> np.ndarray:
    """Per open node, feature and slot: the rows' count and fixed-point g and h, (A, F, width, 3) int64.

    Node p's rows are order[starts[p]:ends[p]], in tree slot node_slot[p]; `qgh` is (slots, rows, 2).
    """
    n_open = starts.shape[0]
    n_features = codes.shape[1]
    out = np.zeros((n_open, n_features, width, 3), dtype=np.int64)
    for p in nb.prange(n_open):
        slot = node_slot[p]
        for j in range(starts[p], ends[p]):
            row = order[j]
            g = qgh[slot, row, 0]
            h = qgh[slot, row, 1]
            for f in range(n_features):
                b = codes[row, f]
                out[p, f, b, 0] += 1
                out[p, f, b, 1] += g
                out[p, f, b, 2] += h
    return out
