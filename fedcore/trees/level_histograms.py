"""A level's split search: each node's histograms in one pass over its rows, larger siblings' by subtraction.

For every open node the kernel reads the node's rows once and adds each row to the histograms of all the
node's candidate features (a task of one feature reads its column alone), then scans each
histogram with the shared scan (`fedcore.trees.splitting`). Work is cut into a few tasks a thread of about
equal rows x features (a large node's features in several tasks, small nodes grouped), run by numba `prange`
with dynamic scheduling; every (node, feature) histogram is built by one task in row order, so the results
are the same bytes at any thread count (and any cut).

Histogram subtraction (XGBoost's and LightGBM's): when a level's histograms were kept, a split's larger
child gets each feature both its parent and its smaller sibling considered as parent minus sibling, and
only the smaller child is read. It is exact where the statistics are integers in float64: class counts
times integer bootstrap weights, and boosting's (g, h) on their power-of-two grid
(`fedcore.trees.fixed_gradients`); regression's float sums are never subtracted. The same plan
(`subtraction_plan`) tells the label holder which encrypted histograms to derive
(`fedcore.vertical.encrypted`), and a party on Dask which pairs its blocks need not compute: the agent
derives them from the last level's merged histograms (`derive_histograms`, on the blocks' CSR form).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from fedcore.trees.criteria import GRADIENT, SQUARED_ERROR
from fedcore.trees.splitting import (
    N_CODES,
    NodeSplits,
    _accumulate,
    _accumulate_gradient,
    _category_rows,
    _pair_histogram,
    _reduce_pairs,
    _scratch,
    _split_of_histogram,
    node_statistics,
    signed_histogram_sums,
    target_columns,
)

STORE_BYTES = 64 << 20
"""At most this many bytes of a level's histograms are kept for the next level's subtraction (else none)."""
TASK_COST = 1 << 15
"""The least rows x features of a histogram task (smaller nodes are grouped into one)."""
TASKS_PER_THREAD = 2
"""A level's direct histograms are cut into about this many tasks a numba thread (of at least `TASK_COST`):
a task of several features reads each row's (g, h) once for all of them. 32 tasks a level (one feature
each at a 160,000-row root of 13 features) took 1.3x to 1.5x the CPU of 2 to 4 (two such nodes, one
thread)."""


@dataclass
class LevelHistograms:
    """A level's (node, feature) histograms, kept so the next level can subtract (dense, per pair)."""

    pair_node: np.ndarray  # int64, the level's node position of each pair
    pair_feat: np.ndarray  # int64, its local feature
    store: np.ndarray  # (n_pairs, N_CODES, n_stats) float64; a node under two rows has none (zeros)
    has: np.ndarray  # bool per pair: its histogram is in `store`


def subtraction_plan(feat_ptr: np.ndarray, feat_local: np.ndarray, node_rows: np.ndarray,
                     parents: np.ndarray | None,
                     previous: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
    """Per pair: its parent's pair and its smaller sibling's, where its histogram is parent minus sibling.

    Nodes 2j and 2j + 1 are the children of the previous level's node `parents[j]`; `previous` holds the
    (node, feature) of each previous pair that has a histogram (-1 node: none). The parent's pair is of the
    previous level, the sibling's of this level; -1 where the histogram is computed directly (the smaller
    child's, one neither parent nor sibling has, or a sibling under two rows).
    """
    n_pairs = len(feat_local)
    derive_from = np.full(n_pairs, -1, np.int64)
    sibling = np.full(n_pairs, -1, np.int64)
    if parents is None or previous is None or n_pairs == 0:
        return derive_from, sibling
    parents = np.asarray(parents, np.int64)
    prev_node, prev_feat = (np.asarray(a, np.int64) for a in previous)
    feat = np.asarray(feat_local, np.int64)
    n_nodes = len(feat_ptr) - 1
    pair_node = np.repeat(np.arange(n_nodes, dtype=np.int64), np.diff(feat_ptr))
    width = int(max(feat.max(initial=0), prev_feat.max(initial=0))) + 1
    left = 2 * np.arange(len(parents), dtype=np.int64)
    small = np.where(node_rows[left] <= node_rows[left + 1], left, left + 1)
    derived_node = np.zeros(n_nodes, bool)
    derived_node[(small ^ 1)[node_rows[small] >= 2]] = True
    candidates = np.flatnonzero(derived_node[pair_node])
    nodes = pair_node[candidates]
    parent_at = _last_match(np.where(prev_node >= 0, prev_node * width + prev_feat, -1),
                            parents[nodes // 2] * width + feat[candidates])
    sibling_at = _last_match(pair_node * width + feat, (nodes ^ 1) * width + feat[candidates])
    both = (parent_at >= 0) & (sibling_at >= 0)
    derive_from[candidates[both]] = parent_at[both]
    sibling[candidates[both]] = sibling_at[both]
    return derive_from, sibling


def subtractable(criterion: int, n_pairs: int, n_stats: int) -> bool:
    """Whether a level's histograms may be kept for subtraction: exact statistics, within `STORE_BYTES`."""
    return criterion != SQUARED_ERROR and n_pairs * N_CODES * n_stats * 8 <= STORE_BYTES


def worth_keeping(criterion: int, n_pairs: int, n_stats: int, n_nodes: int, n_columns: int) -> bool:
    """Whether a party keeps a level's histograms for the next level's subtraction (in process and on Dask).

    `subtractable`, and most nodes consider most of the party's `n_columns`: features sampled per node
    rarely meet again in a parent and its child.
    """
    return 2 * n_pairs >= n_nodes * n_columns and subtractable(criterion, n_pairs, n_stats)


def derive_histograms(direct: tuple[np.ndarray, np.ndarray, np.ndarray], direct_pairs: np.ndarray,
                      n_pairs: int, derive_from: np.ndarray, sibling: np.ndarray,
                      previous: tuple[np.ndarray, np.ndarray, np.ndarray] | None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A level's CSR histograms of all `n_pairs`: the `direct_pairs`' summed ones, the rest by subtraction.

    `direct`: (ptr, bins, stats) of the directly summed pairs, in `direct_pairs` order; a pair with
    `derive_from` >= 0 (`subtraction_plan`) is its parent's histogram in `previous` (the last level's, all its
    pairs) minus its smaller sibling's, with the bins whose statistics all cancel dropped. Pairs neither
    direct nor derived (nodes under two rows) have no bins. Exact: integer statistics only.
    """
    ptr, bins, stats = direct
    counts = np.zeros(n_pairs, np.int64)
    counts[direct_pairs] = 1
    derived = np.flatnonzero(derive_from >= 0)
    counts[derived] = 2
    term_ptr = np.zeros(n_pairs + 1, np.int64)
    np.cumsum(counts, out=term_ptr[1:])
    term_lo, term_hi = np.zeros(term_ptr[-1], np.int64), np.zeros(term_ptr[-1], np.int64)
    term_sign = np.ones(term_ptr[-1], np.int64)
    term_lo[term_ptr[direct_pairs]], term_hi[term_ptr[direct_pairs]] = ptr[:-1], ptr[1:]
    if len(derived) == 0 or previous is None:
        return signed_histogram_sums(bins, stats, term_ptr, term_lo, term_hi, term_sign)
    prev_ptr, prev_bins, prev_stats = previous
    at = np.full(n_pairs, -1, np.int64)
    at[direct_pairs] = np.arange(len(direct_pairs))
    sib = at[sibling[derived]]  # the smaller sibling is computed directly (`subtraction_plan`)
    first, second = term_ptr[derived], term_ptr[derived] + 1
    shift = len(bins)  # the previous level's runs follow this level's in the sources
    parent = derive_from[derived]
    term_lo[first], term_hi[first] = prev_ptr[parent] + shift, prev_ptr[parent + 1] + shift
    term_lo[second], term_hi[second], term_sign[second] = ptr[sib], ptr[sib + 1], -1
    return signed_histogram_sums(np.concatenate([bins, prev_bins]),
                                 np.concatenate([stats, prev_stats.astype(stats.dtype)]),
                                 term_ptr, term_lo, term_hi, term_sign)


def _last_match(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Per wanted key: the last index of `keys` holding it (as a dict built in order keeps), -1 if none."""
    order = np.argsort(keys, kind="stable")
    where = np.searchsorted(keys[order], wanted, side="right") - 1
    found = (where >= 0) & (keys[order][np.maximum(where, 0)] == wanted)
    return np.where(found, order[np.maximum(where, 0)], -1)


def find_best_splits(codes, target, order, weight, starts, ends, feat_ptr, feat_local, feat_rank,
                     is_cat, n_stats, criterion, min_leaf, n_class_orderings, reg_lambda: float = 0.0,
                     parents: np.ndarray | None = None, previous: LevelHistograms | None = None,
                     keep: bool = False) -> tuple[NodeSplits, np.ndarray, LevelHistograms | None]:
    """Best split per node over its candidate features (CSR: feat_ptr over nodes), and the nodes' statistics.

    `codes` (n_rows, n_features) uint8 in either memory order (the party's are column-major, as the binner
    makes them: a second, row-major copy measured no faster, 200,000 and 2,000,000 rows). `parents` and
    `previous`: the previous level's split nodes and kept histograms, from which larger children are derived
    (see the module doc); `keep`: return this level's histograms for the next level (None when they would
    take over `STORE_BYTES`, or regression's, which cannot be subtracted). The answer is the same with or
    without subtraction, bit for bit.
    """
    target = target_columns(target)
    n_pairs = len(feat_local)
    node_rows = (ends - starts).astype(np.int64)
    store_ok = subtractable(criterion, n_pairs, n_stats)
    usable = previous if store_ok and previous is not None and parents is not None else None
    derive_from, sibling = subtraction_plan(
        feat_ptr, feat_local, node_rows, parents,
        None if usable is None else (np.where(usable.has, usable.pair_node, -1), usable.pair_feat))
    derived = np.flatnonzero(derive_from >= 0)
    keep = keep and store_ok
    store = np.zeros((n_pairs if keep or len(derived) else 0, N_CODES, n_stats))
    pair_node = np.repeat(np.arange(len(starts), dtype=np.int64), np.diff(feat_ptr))
    direct = np.flatnonzero((derive_from < 0) & (node_rows[pair_node] >= 2))
    dptr = np.zeros(len(starts) + 1, np.int64)
    np.cumsum(np.bincount(pair_node[direct], minlength=len(starts)), out=dptr[1:])
    k_max = int(np.diff(dptr).max(initial=0))
    feat64 = feat_local.astype(np.int64)
    totals = _row_totals(target, weight, starts, ends, n_stats, criterion,
                         np.concatenate([pair_node[direct], pair_node[derived]]))
    from_hist = criterion != SQUARED_ERROR
    out_gain = np.full(n_pairs, -np.inf)
    out_bin = np.zeros(n_pairs, np.int32)
    out_ml = np.zeros(n_pairs, np.bool_)
    out_bits = np.zeros((n_pairs, 4), np.uint64)
    chunk = nb.set_parallel_chunksize(1)  # tasks differ in size: hand them out one at a time
    try:
        if len(direct):
            lo, hi, k_lo, k_hi = _tasks(node_rows, dptr,
                                        max(int(node_rows[pair_node[direct]].sum())
                                            // (TASKS_PER_THREAD * nb.get_num_threads()), TASK_COST))
            _direct_splits(codes, target, order, weight, starts, ends, totals, dptr, direct,
                           feat64, is_cat, lo, hi, k_lo, k_hi, max(k_max, 1), n_stats, criterion,
                           float(reg_lambda), min_leaf, n_class_orderings, store, len(store) > 0, from_hist,
                           out_gain, out_bin, out_ml, out_bits)
        if len(derived):
            assert usable is not None
            first = np.zeros(n_pairs, np.bool_)  # a derived pair first of its node, none direct
            first[derived] = np.bincount(pair_node[direct], minlength=len(starts))[pair_node[derived]] == 0
            first[derived[1:]] &= pair_node[derived[1:]] != pair_node[derived[:-1]]
            _derived_splits(derived, derive_from, sibling, usable.store, store, pair_node, feat64, is_cat,
                            totals, from_hist, first, n_stats, criterion, float(reg_lambda), min_leaf,
                            n_class_orderings, out_gain, out_bin, out_ml, out_bits)
    finally:
        nb.set_parallel_chunksize(chunk)
    splits = NodeSplits(*_reduce_pairs(feat_ptr, feat_local, feat_rank, out_gain, out_bin, out_ml, out_bits))
    if not keep:
        return splits, totals, None
    return splits, totals, LevelHistograms(pair_node, feat64, store, node_rows[pair_node] >= 2)


def _row_totals(target, weight, starts, ends, n_stats, criterion, histogram_nodes) -> np.ndarray:
    """The nodes' statistics by a pass over their rows, except where the level's histograms give them.

    Where statistics are exact sums (class counts, boosting's grid: not regression's), a node with a built
    or derived histogram gets its totals from that histogram's bins in the kernels (the same numbers in any
    order); the rest (under two rows, or no candidate feature here) are summed here, zeros left for the
    kernels.
    """
    if criterion == SQUARED_ERROR:
        return node_statistics(target, weight, starts, ends, n_stats, criterion)
    totals = np.zeros((len(starts), n_stats))
    rest = np.ones(len(starts), np.bool_)
    rest[histogram_nodes] = False
    idx = np.flatnonzero(rest)
    if len(idx):
        totals[idx] = node_statistics(target, weight, starts[idx], ends[idx], n_stats, criterion)
    return totals


@nb.njit(cache=True, nogil=True, inline="always")
def _histogram_total(hist, touched, n_touched, total):
    """A node's statistics as the sum of one of its histograms' bins (exact statistics only)."""
    for s in range(total.shape[0]):
        total[s] = 0.0
    for m in range(n_touched):
        b = touched[m]
        for s in range(total.shape[0]):
            total[s] += hist[b, s]


@nb.njit(cache=True, nogil=True)
def _tasks(node_rows, dptr, cost):
    """Histogram tasks (first node, end node, first pair offset, end offset; -1: all the node's pairs).

    A node of at least `cost` rows x pairs is cut by features into about that much each; smaller nodes in
    a row are grouped until they reach it.
    """
    n = node_rows.shape[0]
    size = n + dptr[n] + 1
    lo, hi = np.empty(size, np.int64), np.empty(size, np.int64)
    k_lo, k_hi = np.empty(size, np.int64), np.empty(size, np.int64)
    t, i = 0, 0
    while i < n:
        k = dptr[i + 1] - dptr[i]
        if k == 0 or node_rows[i] < 2:
            i += 1
            continue
        if node_rows[i] * k >= cost:
            parts = min(k, (node_rows[i] * k + cost - 1) // cost)
            for p in range(parts):
                lo[t], hi[t], k_lo[t], k_hi[t] = i, i + 1, p * k // parts, (p + 1) * k // parts
                t += 1
            i += 1
            continue
        j, total = i, 0
        while j < n:
            c = node_rows[j] * (dptr[j + 1] - dptr[j])
            if c >= cost or total >= cost:
                break
            total += c
            j += 1
        lo[t], hi[t], k_lo[t], k_hi[t] = i, j, 0, -1
        t += 1
        i = j
    return lo[:t], hi[:t], k_lo[:t], k_hi[:t]


@nb.njit(cache=True, nogil=True, parallel=True)
def _direct_splits(codes, target, order, weight, starts, ends, totals, dptr, direct, feat_local,
                   is_cat, task_lo, task_hi, task_klo, task_khi, k_max, n_stats, criterion, reg_lambda,
                   min_leaf, n_class_orderings, store, keep, from_hist, out_gain, out_bin, out_ml, out_bits):
    """Build (one pass over the rows per node and task) and scan the histograms of the directly built pairs.

    `from_hist`: each node's totals are its first histogram's sum, written to `totals` by its first task.
    """
    for t in nb.prange(task_lo.shape[0]):
        hist = np.zeros((k_max, N_CODES, n_stats))
        seen = np.zeros((k_max, N_CODES), np.bool_)
        touched = np.empty((k_max, N_CODES), np.int64)
        n_touched = np.zeros(k_max, np.int64)
        feats = np.empty(k_max, np.int64)
        _, _, _, ordered, cum, lbuf, rbuf, missing, keys = _scratch(n_stats)
        total = np.zeros(n_stats)
        for i in range(task_lo[t], task_hi[t]):
            if ends[i] - starts[i] < 2:
                continue
            a = dptr[i] + (task_klo[t] if task_khi[t] >= 0 else 0)
            b = dptr[i] + task_khi[t] if task_khi[t] >= 0 else dptr[i + 1]
            k = b - a
            if k == 0:  # in a group of small nodes, one with no candidate feature here
                continue
            for kk in range(k):
                feats[kk] = feat_local[direct[a + kk]]
                n_touched[kk] = 0
            _node_histograms(codes, target, order, weight, starts[i], ends[i], feats, k, criterion,
                             hist, seen, touched, n_touched)
            if from_hist:
                _histogram_total(hist[0], touched[0], n_touched[0], total)
                if task_khi[t] < 0 or task_klo[t] == 0:
                    totals[i] = total
            else:
                total[:] = totals[i]
            for kk in range(k):
                q = direct[a + kk]
                if keep:
                    _keep(store, q, hist[kk], touched[kk], n_touched[kk])
                _split_of_histogram(q, is_cat[feats[kk]], n_touched[kk], total, n_stats, criterion,
                                    reg_lambda, min_leaf, n_class_orderings, hist[kk], seen[kk], touched[kk],
                                    ordered, cum, lbuf, rbuf, missing, keys, out_gain, out_bin, out_ml,
                                    out_bits)


@nb.njit(cache=True, nogil=True)
def _node_histograms(codes, target, order, weight, s, e, feats, k, criterion, hist, seen, touched,
                     n_touched):
    """Rows s..e into the histograms of the k features: by column for one feature, else row by row."""
    if k == 1:  # the column kernel: one histogram stays in L1
        n_touched[0] = _pair_histogram(feats[0], codes, target, order, weight, s, e, criterion, hist[0],
                                       seen[0], touched[0])
    else:
        _rows_into(codes, target, order, weight, s, e, feats, k, criterion, hist, seen, touched,
                   n_touched)


@nb.njit(cache=True, nogil=True)
def _keep(store, q, hist, touched, n_touched):
    """Pair q's histogram (its touched bins; the store is zeroed) into the kept level's store."""
    for m in range(n_touched):
        b = touched[m]
        for s in range(hist.shape[1]):
            store[q, b, s] = hist[b, s]


@nb.njit(cache=True, nogil=True, inline="never")
def _rows_into(codes, target, order, weight, s, e, feats, k, criterion, hist, seen, touched, n_touched):
    """Rows s..e into the histograms of the k features, a row at a time (class counts, sums or (count, G, H)).

    Each row adds to a bin as the column kernel adds it (`_accumulate`, `_accumulate_gradient`).
    """
    track = e - s < N_CODES  # few rows: note the bins they touch; many: find them after, from the counts
    for j in range(s, e):
        r = order[j]
        w = weight[j]
        for kk in range(k):
            b = codes[r, feats[kk]]
            if track and not seen[kk, b]:
                seen[kk, b] = True
                touched[kk, n_touched[kk]] = b
                n_touched[kk] += 1
            if criterion == GRADIENT:
                _accumulate_gradient(hist[kk], b, w, target, j)
            else:
                _accumulate(hist[kk], b, w, target[j, 0], criterion)
    if not track:
        _touched_bins(hist, k, criterion, seen, touched, n_touched)


@nb.njit(cache=True, nogil=True)
def _touched_bins(hist, k, criterion, seen, touched, n_touched):
    """Flag the bins holding rows (every row weighs at least 1) of each of the k histograms, ascending."""
    for kk in range(k):
        m = 0
        for b in range(N_CODES):
            if _category_rows(hist[kk, b], criterion) > 0.0:
                seen[kk, b] = True
                touched[kk, m] = b
                m += 1
        n_touched[kk] = m


@nb.njit(cache=True, nogil=True, parallel=True)
def _derived_splits(derived, derive_from, sibling, parent_store, store, pair_node, feat_local, is_cat, totals,
                    from_hist, first, n_stats, criterion, reg_lambda, min_leaf, n_class_orderings, out_gain,
                    out_bin, out_ml, out_bits):
    """Each derived pair's histogram as parent minus smaller sibling (kept in `store`), then its scan.

    `from_hist`: the pair's node totals are the histogram's sum, written to `totals` where `first`.
    """
    n = derived.shape[0]
    n_chunks = min(n, 64)
    keep = store.shape[0] > 0
    for chunk in nb.prange(n_chunks):
        hist, seen, touched, ordered, cum, lbuf, rbuf, missing, keys = _scratch(n_stats)
        total = np.zeros(n_stats)
        for x in range(chunk * n // n_chunks, (chunk + 1) * n // n_chunks):
            q = derived[x]
            p, sb = derive_from[q], sibling[q]
            n_touched = 0
            for b in range(N_CODES):
                for s in range(n_stats):
                    hist[b, s] = parent_store[p, b, s] - store[sb, b, s]
                    if keep:
                        store[q, b, s] = hist[b, s]
                if _category_rows(hist[b], criterion) > 0.0:  # rows in the bin: the count, or the classes'
                    seen[b] = True
                    touched[n_touched] = b
                    n_touched += 1
                else:
                    for s in range(n_stats):
                        hist[b, s] = 0.0
            if from_hist:
                _histogram_total(hist, touched, n_touched, total)
                if first[q]:
                    totals[pair_node[q]] = total
            else:
                total[:] = totals[pair_node[q]]
            _split_of_histogram(q, is_cat[feat_local[q]], n_touched, total, n_stats, criterion,
                                reg_lambda, min_leaf, n_class_orderings, hist, seen, touched, ordered, cum,
                                lbuf, rbuf, missing, keys, out_gain, out_bin, out_ml, out_bits)
