"""Prediction kernels: one-round leaf sets (Federated Forest Alg. 3-4) and their intersection.

Also the node-by-node routing used for comparison.

One-round: a party walks each tree with its own tests on nodes it owns and both branches elsewhere; the
rows that reach a leaf form that leaf's set (packed bits, one 64-bit word per 64 rows). The master ANDs
the parties' sets; each row survives in exactly one leaf per tree.
"""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(cache=True, inline="always")
def goes_left(x, threshold, missing_left, is_cat, cat_bits_row):
    """The test of one owned node on one value (categoricals are vocabulary codes stored as floats)."""
    if np.isnan(x):
        return missing_left
    if is_cat:
        code = np.int64(x)
        return (cat_bits_row[code >> 6] >> np.uint64(code & 63)) & np.uint64(1) == 1
    return x <= threshold


class ThresholdIndex:
    """Per numeric feature, the sorted distinct thresholds a party's nodes use, and each node's position.

    With it, "x <= threshold" for a whole batch of rows is a precomputed prefix bitmap (rows whose value
    is at most the k-th threshold), so walking a tree costs a few word operations per node.
    """

    def __init__(self, feature: np.ndarray, threshold: np.ndarray, is_cat: np.ndarray,
                 n_columns: int) -> None:
        """Index the distinct thresholds of the numeric nodes a party owns (feature >= 0), per column."""
        numeric_owned = (feature >= 0) & ~is_cat
        self.thresholds: list[np.ndarray] = []
        self.base = np.zeros(n_columns + 1, dtype=np.int64)
        self.node_row = np.full(len(feature), -1, dtype=np.int64)
        for f in range(n_columns):
            nodes = np.flatnonzero(numeric_owned & (feature == f))
            values = np.unique(threshold[nodes])
            self.thresholds.append(values)
            self.base[f + 1] = self.base[f] + len(values)
            self.node_row[nodes] = self.base[f] + np.searchsorted(values, threshold[nodes])
        self.flat = np.concatenate(self.thresholds) if self.thresholds else np.zeros(0)

    def bitmaps(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(prefix bitmaps, one row per (feature, threshold); missing-value bitmaps, one row per feature)."""
        # rank of each value among the feature's thresholds: x <= thresholds[j] exactly for j >= rank
        ranks = np.empty(X.shape, dtype=np.int64, order="F")
        for f, values in enumerate(self.thresholds):
            ranks[:, f] = np.searchsorted(values, X[:, f], side="left") if len(values) else 0
        return _threshold_bitmaps(X, ranks, self.base)


@nb.njit(cache=True, parallel=True)
def _threshold_bitmaps(X, ranks, base):
    n_rows, n_cols = X.shape
    n_words = (n_rows + 63) // 64
    prefix = np.zeros((base[-1], n_words), np.uint64)
    missing = np.zeros((n_cols, n_words), np.uint64)
    for f in nb.prange(n_cols):
        a, b = base[f], base[f + 1]
        for r in range(n_rows):
            bit = np.uint64(1) << np.uint64(r & 63)
            if np.isnan(X[r, f]):
                missing[f, r >> 6] |= bit
            elif ranks[r, f] < b - a:
                prefix[a + ranks[r, f], r >> 6] |= bit
        for k in range(a + 1, b):
            for w in range(n_words):
                prefix[k, w] |= prefix[k - 1, w]
    return prefix, missing


@nb.njit(cache=True, parallel=True)
def leaf_row_sets(X, prefix, missing, node_row, tree_offsets, left, right, feature, missing_left, is_cat,
                  cat_bits, leaf_offsets, leaf_slot):
    """Packed row sets of every leaf of every tree, as reachable through this party's partial trees.

    Numeric owned nodes read their decision from the prefix bitmaps (`node_row`); categorical ones test
    row by row. Returns (n_leaves_total, n_words) uint64.
    """
    n_rows = X.shape[0]
    n_words = (n_rows + 63) // 64
    n_trees = tree_offsets.shape[0] - 1
    out = np.zeros((leaf_offsets[-1], n_words), np.uint64)
    full = np.uint64(0xFFFFFFFFFFFFFFFF)
    for t in nb.prange(n_trees):
        a = tree_offsets[t]
        n_nodes = tree_offsets[t + 1] - a
        visited = np.zeros((n_nodes, n_words), np.uint64)
        for w in range(n_words):
            visited[0, w] = full
        tail = n_rows - (n_words - 1) * 64
        if tail < 64:
            visited[0, n_words - 1] = (np.uint64(1) << np.uint64(tail)) - np.uint64(1)
        for n in range(n_nodes):
            g = a + n
            if left[g] < 0:
                out[leaf_offsets[t] + leaf_slot[g], :] = visited[n, :]
                continue
            lc, rc = left[g], right[g]
            f = feature[g]
            if f < 0:
                visited[lc, :] = visited[n, :]
                visited[rc, :] = visited[n, :]
                continue
            _send_rows_down(X, prefix, missing, visited, n, lc, rc, f, node_row[g],
                            missing_left[g], is_cat[g], cat_bits[g])
    return out


@nb.njit(cache=True)
def _send_rows_down(X, prefix, missing, visited, n, lc, rc, f, pr, missing_left, is_cat, cat_bits):
    """Split the rows that reach node n between its children lc and rc, on this party's test of feature f.

    A numeric node reads its decision from prefix bitmap row `pr`; a categorical one (pr < 0) tests row by
    row.
    """
    for w in range(visited.shape[1]):
        v = visited[n, w]
        if v == 0:
            continue
        if pr >= 0:
            d = prefix[pr, w]
            if missing_left:
                d |= missing[f, w]
        else:
            d = _left_bits(X, v, w, f, missing_left, is_cat, cat_bits)
        visited[lc, w] = v & d
        visited[rc, w] = v & ~d


@nb.njit(cache=True)
def _left_bits(X, v, w, f, missing_left, is_cat, cat_bits):
    """Of the rows in word w set in `v`, those the node's test on X[:, f] sends left, as a word."""
    d = np.uint64(0)
    base = w * 64
    for bit in range(64):
        if (v >> np.uint64(bit)) & np.uint64(1):
            if goes_left(X[base + bit, f], 0.0, missing_left, is_cat, cat_bits):
                d |= np.uint64(1) << np.uint64(bit)
    return d


@nb.njit(cache=True, parallel=True)
def intersect_leaf_sets(sets, leaf_offsets, n_rows):
    """AND the parties' leaf sets (sets: (n_parties, n_leaves, n_words)).

    Return each row's leaf slot per tree ((n_rows, n_trees) int32), -1 where no leaf survived (inconsistent
    inputs).
    """
    n_trees = leaf_offsets.shape[0] - 1
    n_words = sets.shape[2]
    out = np.full((n_rows, n_trees), -1, np.int32)
    for t in nb.prange(n_trees):
        for leaf in range(leaf_offsets[t], leaf_offsets[t + 1]):
            for w in range(n_words):
                v = sets[0, leaf, w]
                for p in range(1, sets.shape[0]):
                    v &= sets[p, leaf, w]
                while v != 0:
                    low = v & (~v + np.uint64(1))
                    bit = np.int64(np.log2(np.float64(low)))
                    out[w * 64 + bit, t] = leaf - leaf_offsets[t]
                    v ^= low
    return out


@nb.njit(cache=True, parallel=True)
def route_step(X, rows, nodes, feature, threshold, missing_left, is_cat, cat_bits):
    """Node-by-node prediction step at an owner: 1 where row rows[i] goes left at node nodes[i]."""
    out = np.zeros(rows.shape[0], np.uint8)
    for i in nb.prange(rows.shape[0]):
        g = nodes[i]
        if goes_left(X[rows[i], feature[g]], threshold[g], missing_left[g], is_cat[g], cat_bits[g]):
            out[i] = 1
    return out


def encode_columns(frame, column_names: list[str], column_categories: list[list[str] | None]) -> np.ndarray:
    """A party's raw columns as the float64 matrix the kernels read.

    Numbers as they are, categories as their vocabulary codes, missing and unknown categories as NaN.
    """
    import pandas as pd

    from fedcore.data.binning import category_strings

    X = np.empty((len(frame), len(column_names)), dtype=np.float64, order="F")
    for j, (name, categories) in enumerate(zip(column_names, column_categories, strict=True)):
        series = frame[name]
        if categories is None:
            X[:, j] = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        else:
            # unknown and missing values are not in the vocabulary: -1 (pd.Categorical would warn, then raise)
            strings = category_strings(series)  # a Series: pandas takes it, pandas-stubs want an Index
            codes = pd.Index(categories).get_indexer(strings).astype(np.float64)  # type: ignore[arg-type]
            codes[codes < 0] = np.nan
            X[:, j] = codes
    return X
