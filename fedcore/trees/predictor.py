"""Prediction kernels: one-round prediction (Federated Forest Alg. 3-4) and node-by-node routing.

One-round, as the paper: a party walks each tree with its own tests on nodes it owns and both branches
elsewhere; the rows that reach a leaf form that leaf's set, and the master's AND of the parties' sets leaves
each row in exactly one leaf per tree. Here a party sends instead, per node it owns, the rows that reach the
node through its own splits and go left there (`own_split_sets`; packed bits, one 64-bit word per 64 rows),
and the master routes each row from the root by the owners' bits (`route_by_split_sets`). The two answers
say the same: the master, which knows the structure and owners, computes a party's leaf sets from its split
sets (a child of an owned node is reached by the node's reached rows going that way) and its split sets from
its leaf sets (a node's rows going left are those of the leaves under its left child). The split sets are
one bit per owned node and row, against one per leaf and row at every party: with 3 parties about a third
of the bytes.
"""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(cache=True, nogil=True, inline="always")
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


@nb.njit(cache=True, nogil=True, parallel=True)
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


@nb.njit(cache=True, nogil=True, parallel=True)
def own_split_sets(X, prefix, missing, node_row, tree_offsets, left, right, feature, missing_left, is_cat,
                   cat_bits, owned_slot):
    """Packed row sets, one per node this party owns (row `owned_slot[g]`): its rows going left there.

    The rows in node g's set reach g through this party's own splits and go left at g: the party walks each
    tree with its own tests on its nodes and both branches elsewhere, so a row it cannot send to a node of its
    own has a 0 there, and the sets say exactly what its leaf sets would (module doc).
    Numeric owned nodes read their decision from the prefix bitmaps (`node_row`); categorical ones test row
    by row. Returns (n_owned, n_words) uint64.
    """
    n_rows = X.shape[0]
    n_words = (n_rows + 63) // 64
    n_trees = tree_offsets.shape[0] - 1
    n_owned = 0
    for g in range(feature.shape[0]):
        if feature[g] >= 0:
            n_owned += 1
    out = np.zeros((n_owned, n_words), np.uint64)
    for t in nb.prange(n_trees):
        a = tree_offsets[t]
        n_nodes = tree_offsets[t + 1] - a
        visited = _rows_at_root(n_nodes, n_rows)
        for n in range(n_nodes):
            g = a + n
            if left[g] < 0:
                continue
            lc, rc = left[g], right[g]
            f = feature[g]
            if f < 0:
                visited[lc, :] = visited[n, :]
                visited[rc, :] = visited[n, :]
                continue
            _send_rows_down(X, prefix, missing, visited, n, lc, rc, f, node_row[g],
                            missing_left[g], is_cat[g], cat_bits[g])
            out[owned_slot[g], :] = visited[lc, :]
    return out


@nb.njit(cache=True, nogil=True)
def _rows_at_root(n_nodes, n_rows):
    """A tree's packed row sets per node, (n_nodes, ceil(n_rows / 64)) uint64: all rows at the root.

    The other nodes start empty; the bits past the last row of the last word stay 0.
    """
    n_words = (n_rows + 63) // 64
    rows = np.zeros((n_nodes, n_words), np.uint64)
    for w in range(n_words):
        rows[0, w] = np.uint64(0xFFFFFFFFFFFFFFFF)
    tail = n_rows - (n_words - 1) * 64
    if tail < 64:
        rows[0, n_words - 1] = (np.uint64(1) << np.uint64(tail)) - np.uint64(1)
    return rows


@nb.njit(cache=True, nogil=True)
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


@nb.njit(cache=True, nogil=True)
def _left_bits(X, v, w, f, missing_left, is_cat, cat_bits):
    """Of the rows in word w set in `v`, those the node's test on X[:, f] sends left, as a word."""
    d = np.uint64(0)
    base = w * 64
    for bit in range(64):
        if (v >> np.uint64(bit)) & np.uint64(1):
            if goes_left(X[base + bit, f], 0.0, missing_left, is_cat, cat_bits):
                d |= np.uint64(1) << np.uint64(bit)
    return d


@nb.njit(cache=True, nogil=True, parallel=True)
def route_by_split_sets(sets, set_row, tree_offsets, left, right, n_rows):
    """Each row's leaf (a global node index) in every tree, from the owners' split sets.

    `sets` stacks every party's `own_split_sets`; `set_row[g]` is internal node g's row in it. A row that
    reaches an owned node went there through its owner's own splits, so the owner's bit sends it on: each
    node's reached rows are a packed set, split between its children a word at a time. Returns (n_rows,
    n_trees) int64.
    """
    n_trees = tree_offsets.shape[0] - 1
    n_words = (n_rows + 63) // 64
    out = np.empty((n_rows, n_trees), np.int64)
    for t in nb.prange(n_trees):
        a = tree_offsets[t]
        n_nodes = tree_offsets[t + 1] - a
        reached = _rows_at_root(n_nodes, n_rows)
        for n in range(n_nodes):
            g = a + n
            if left[g] < 0:
                for w in range(n_words):
                    v = reached[n, w]
                    while v != 0:
                        low = v & (~v + np.uint64(1))
                        out[w * 64 + np.int64(np.log2(np.float64(low))), t] = g
                        v ^= low
                continue
            lc, rc, row = left[g], right[g], set_row[g]
            for w in range(n_words):
                v = reached[n, w]
                if v != 0:
                    d = sets[row, w]
                    reached[lc, w] = v & d
                    reached[rc, w] = v & ~d
    return out


@nb.njit(cache=True, nogil=True, parallel=True)
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
