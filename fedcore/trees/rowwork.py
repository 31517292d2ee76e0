"""Numba kernels for a horizontal party's row work (FET and PPD-ERT).

Moving rows into the children of the nodes that split, per-candidate min/max, and per-branch class counts,
regression sums and LDP report sums.

Layout (`fedcore.horizontal.rows.RowPartition`): like the vertical `SamplePartition`, the rows of every
open node of every tree of the batch sit in one contiguous segment `order[starts[p]:ends[p]]` of a flat
int32 array; tree slot s owns `order[s * n_rows:(s + 1) * n_rows]` and its nodes' segments subdivide that
range. Splits partition segments stably, so each segment lists its rows in ascending order: a node sees
its rows in the same order as a row-major scan of the old (tree x row) position matrix, which keeps
min/max ties (+0.0 / -0.0) exactly as they were. Counting is a histogram per node (its (k, 2, C) block
stays in cache) and the kernels run in parallel over nodes: every output cell belongs to one node, so
results do not depend on the number of threads. LDP reports draw their words by (report, tree slot,
row) position (`fedcore.privacy.ldp_draws`), so they do not depend on the order either.

Branches everywhere: a value goes left when `x <= threshold`; NaN values (and NaN thresholds) go right.

What each kernel allocates besides its output:

* `split_nodes`: the next level's node arrays it returns, and per split node a scratch of its right-going
  rows (at most n_rows int32 per thread at a time);
* `node_ranges`, `regression_sums`: nothing but their outputs ((A, k) float64 x2; (A, k, 2, 2) int64);
* `class_counts`: nothing; it counts into the caller's (A, k, 2, C) array, whose integer type the caller
  picks to hold the largest node (`PartyRows` uses uint16 below 65536 rows: a quarter of int64's memory);
* `ldp_report_sums`: one n_bits int64 response vector per open node;
* `rows_active_count`: one n_rows int32 counter.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from fedcore.privacy.ldp_draws import instant_report


@nb.njit(cache=True, nogil=True, inline="always")
def _right(value: float, threshold: float) -> int:
    """1 when a value goes right: not (x <= t), so NaN values and NaN thresholds go right."""
    return 0 if value <= threshold else 1


@nb.njit(cache=True, nogil=True)
def _partition_segment(order: np.ndarray, s: int, e: int, X: np.ndarray, f: int, t: float) -> int:
    """Partition order[s:e] in place, stably.

    Rows with X[r, f] <= t first, the others (NaN included) after; returns the number of left rows. Allocates
    a scratch for the right-going rows.
    """
    right = np.empty(e - s, np.int32)
    nl = 0
    nr = 0
    for j in range(s, e):
        r = order[j]
        if X[r, f] <= t:
            order[s + nl] = r  # s + nl <= j: never overwrites a row not yet read
            nl += 1
        else:
            right[nr] = r
            nr += 1
    for j in range(nr):
        order[s + nl + j] = right[j]
    return nl


@nb.njit(cache=True, nogil=True, parallel=True)
def split_nodes(order: np.ndarray, starts: np.ndarray, ends: np.ndarray, node_slot: np.ndarray, X: np.ndarray,
                chosen: np.ndarray, next_pos: np.ndarray, features: np.ndarray, thresholds: np.ndarray,
                n_next: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Apply a level's decisions.

    Each node p with chosen[p] = j >= 0 partitions its segment of `order` on candidate j (left first, stably);
    the i-th such node's left / right part becomes open node next_pos[2i] / next_pos[2i + 1] (-1: a leaf, its
    rows leave). Nodes with chosen -1 drop their rows. Returns the next level's (starts, ends, node_slot),
    n_next long; positions no child took stay empty with slot -1. The caller checks that non-negative next_pos
    are distinct and below n_next.
    """
    n_open = chosen.shape[0]
    rank = np.empty(n_open, np.int64)
    n_split = 0
    for p in range(n_open):
        rank[p] = n_split
        if chosen[p] >= 0:
            n_split += 1
    new_starts = np.zeros(n_next, np.int64)
    new_ends = np.zeros(n_next, np.int64)
    new_slot = np.full(n_next, -1, np.int64)
    for p in nb.prange(n_open):
        j = chosen[p]
        if j < 0:
            continue
        s, e = starts[p], ends[p]
        middle = s + _partition_segment(order, s, e, X, features[p, j], thresholds[p, j])
        left, right = next_pos[2 * rank[p]], next_pos[2 * rank[p] + 1]
        if left >= 0:  # distinct positions: no two nodes write the same cell
            new_starts[left], new_ends[left], new_slot[left] = s, middle, node_slot[p]
        if right >= 0:
            new_starts[right], new_ends[right], new_slot[right] = middle, e, node_slot[p]
    return new_starts, new_ends, new_slot


@nb.njit(cache=True, nogil=True, parallel=True)
def node_ranges(order: np.ndarray, starts: np.ndarray, ends: np.ndarray, X: np.ndarray,
                features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Min and max of each candidate's feature over each open node's rows, NaN ignored.

    Per (open node, candidate), +inf / -inf when the node has no other value. Rows are visited in ascending
    order and an equal value replaces the current one, as `np.minimum.at` / `np.maximum.at` over a row-major
    scan do (the sign of a zero is kept exactly). One pass over a node's rows updates all its k candidates
    (each row's index read once): 5x faster than a pass per candidate on nodes of a few rows, which a fully
    grown forest's deep levels are made of, and 1.7x on nodes of 1,000 rows.
    """
    n_open, k = features.shape
    low = np.empty((n_open, k))
    high = np.empty((n_open, k))
    for p in nb.prange(n_open):
        for j in range(k):
            low[p, j] = np.inf
            high[p, j] = -np.inf
        for i in range(starts[p], ends[p]):
            r = order[i]
            for j in range(k):
                v = X[r, features[p, j]]
                if v == v:  # not NaN
                    if not low[p, j] < v:
                        low[p, j] = v
                    if not high[p, j] > v:
                        high[p, j] = v
    return low, high


@nb.njit(cache=True, nogil=True, parallel=True)
def class_counts(order: np.ndarray, starts: np.ndarray, ends: np.ndarray, X: np.ndarray, y: np.ndarray,
                 features: np.ndarray, thresholds: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The number of rows per (open node, candidate, branch 0 left / 1 right, class).

    Added into `out` (A, k, 2, C), zeroed by the caller in any integer type that holds the largest node
    (returned).
    """
    k = features.shape[1]
    for p in nb.prange(features.shape[0]):
        # one candidate at a time: with X in column order its reads walk one column forward
        for j in range(k):
            f, t = features[p, j], thresholds[p, j]
            for i in range(starts[p], ends[p]):
                r = order[i]
                out[p, j, _right(X[r, f], t), y[r]] += 1
    return out


@nb.njit(cache=True, nogil=True, parallel=True)
def regression_sums(order: np.ndarray, starts: np.ndarray, ends: np.ndarray, X: np.ndarray, q: np.ndarray,
                    features: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Per (open node, candidate, branch): the number of rows and the sum of their integer targets q.

    (A, k, 2, 2) int64; integer sums are exact (the master keeps |sum q| < 2**52) and independent of order.
    """
    n_open, k = features.shape
    out = np.zeros((n_open, k, 2, 2), np.int64)
    for p in nb.prange(n_open):
        for j in range(k):  # one candidate at a time, as in class_counts
            f, t = features[p, j], thresholds[p, j]
            for i in range(starts[p], ends[p]):
                r = order[i]
                b = _right(X[r, f], t)
                out[p, j, b, 0] += 1
                out[p, j, b, 1] += q[r]
    return out


@nb.njit(cache=True, nogil=True, parallel=True)
def ldp_report_sums(order: np.ndarray, starts: np.ndarray, ends: np.ndarray, node_slot: np.ndarray,
                    X: np.ndarray, features: np.ndarray, thresholds: np.ndarray, permanent: np.ndarray,
                    first_row: int, key: np.ndarray, report: int, if_one: np.uint64, if_zero: np.uint64,
                    bit_sums: np.ndarray, sizes: np.ndarray) -> None:
    """One fresh instant report per row of each open node, added to every branch group it takes.

    Row r of the rows given is the party's row first_row + r; its report in the node's tree slot is
    `ldp_draws.instant_report` at (first_row + r, node_slot[p], report). Under candidate j a row's branch
    group is (p * k + j) * 2 + branch: bit_sums[g] += response, sizes[g] += 1, in place (int64: exact, so
    blocks of rows add up to the whole table's sums).
    """
    k = features.shape[1]
    n_bits = permanent.shape[1]
    for p in nb.prange(starts.shape[0]):
        response = np.empty(n_bits, np.uint8)
        slot = np.uint64(node_slot[p])
        for i in range(starts[p], ends[p]):
            r = order[i]
            instant_report(permanent[r], key, np.uint64(first_row + r), slot, np.uint64(report), if_one,
                           if_zero, response)
            for j in range(k):
                g = (p * k + j) * 2 + _right(X[r, features[p, j]], thresholds[p, j])
                sizes[g] += 1
                for b in range(n_bits):
                    bit_sums[g, b] += response[b]


@nb.njit(cache=True, nogil=True)
def rows_active_count(order: np.ndarray, starts: np.ndarray, ends: np.ndarray, n_rows: int) -> np.ndarray:
    """In how many open nodes (hence tree slots) each row sits: (n_rows,) int32."""
    count = np.zeros(n_rows, np.int32)
    for p in range(starts.shape[0]):
        for i in range(starts[p], ends[p]):
            count[order[i]] += 1
    return count
