"""Histogram split finding: the scan of a (node, feature) histogram, and histograms of blocks of rows.

A level's in-process search (`fedcore.trees.level_histograms`) builds each node's histograms and scans
them here; the label holder scans decrypted ones (`best_splits_from_histograms`) and a party on Dask adds
up blocks' (`block_histograms`). Only bins that occur in the node are scanned, so deep, small nodes
cost O(samples) rather than O(bins). Numeric features split at a bin threshold; categorical ones at a
prefix of their categories ordered by class share or mean target, regularised as the gradient-boosting
libraries do (`_categorical_split`); missing values go to whichever side is better (or to the heavier side
when the node has none). Ties keep the first candidate in feature-rank
order, then the lowest threshold, so results do not depend on how features are spread over parties.

Targets are (samples, T) float64: T = 1 (class code or value) for the forests' criteria, T = 2 (g, h) for
gradient statistics; `reg_lambda` is the gradient criterion's L2 term (ignored by the others).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from fedcore.data.binning import MISSING_BIN
from fedcore.trees.criteria import GRADIENT, SQUARED_ERROR, VALUE_STATISTICS, impurity_term, stats_weight

N_CODES = 256
MIN_CATEGORY_ROWS = 5.0
"""A category with fewer (bootstrap-weighted) rows in a node is never sent left on its own: it stays with the
right child (scikit-learn's HistGradientBoosting: MIN_CAT_SUPPORT; LightGBM: min_data_per_group)."""
CATEGORY_SMOOTHING = 10.0
"""Rows of the node's own mean blended into each category's statistic before ordering (LightGBM's
cat_smooth): a category seen on three rows is not ranked by those three alone."""
MAX_CATEGORY_SPLIT = 32
"""At most this many categories on the left (the side listed in the split's bits), scanned from both ends
of the order (LightGBM's and HistGradientBoosting's max_cat_threshold)."""


@dataclass
class NodeSplits:
    """Best split per node found by one party (gain is -inf where it has none)."""

    gain: np.ndarray  # float64
    rank: np.ndarray  # int32, position of the feature in the node's candidate list
    feature: np.ndarray  # int32, local column
    bin: np.ndarray  # int32, numeric: left if code <= bin
    missing_left: np.ndarray  # bool
    is_categorical: np.ndarray  # bool
    cat_bits: np.ndarray  # uint64 (n_nodes, 4): categorical left set


def target_columns(target: np.ndarray) -> np.ndarray:
    """Targets as the kernels read them: (samples, T) float64 (a 1-D target is one column, a view)."""
    target = np.asarray(target, dtype=np.float64)
    return target.reshape(len(target), 1) if target.ndim == 1 else target


@nb.njit(cache=True, nogil=True, inline="always")
def _accumulate(hist, b, w, y, criterion):
    """Add one sample (weight w, target y: class code or value) to bin b's statistics."""
    if criterion == SQUARED_ERROR:
        hist[b, 0] += w
        hist[b, 1] += w * y
    else:
        hist[b, np.int64(y)] += w


@nb.njit(cache=True, nogil=True, inline="always")
def _accumulate_gradient(hist, b, w, target, j):
    """Add sample j (weight w, target row (g, h)) to bin b's gradient statistics (count, G, H).

    Kept out of `_accumulate` and out of the forests' histogram loop (`_gradient_histogram`), which stays
    as fast as before boosting.
    """
    hist[b, 0] += w
    hist[b, 1] += w * target[j, 0]
    hist[b, 2] += w * target[j, 1]


@nb.njit(cache=True, nogil=True)
def _scan(hist, ordered, n_ordered, total, missing, has_missing, parent_term, criterion, reg_lambda,
          min_leaf, best_gain, cum, lbuf, rbuf, max_cuts=N_CODES, rest_right=False):
    """Scan the prefix splits of `ordered` bins, and "all values | missing" when values are missing.

    At most `max_cuts` prefixes. `rest_right`: the node has rows in bins not in `ordered` (categories
    too rare to order), which always go right, so every prefix, all of `ordered` too, leaves a right child.
    Returns (gain, cut, missing_left) of the best one beating `best_gain`, cut -1 if none.
    """
    S = hist.shape[1]
    found_cut = -1
    found_ml = False
    for k in range(S):
        cum[k] = 0.0
    n_cuts = min(n_ordered - 1 + (1 if (has_missing or rest_right) else 0), max_cuts)
    for t in range(n_cuts):
        b = ordered[t]
        for k in range(S):
            cum[k] += hist[b, k]
        n_options = 2 if (has_missing and (t < n_ordered - 1 or rest_right)) else 1
        for option in range(n_options):
            ml = option == 1
            for k in range(S):
                lbuf[k] = cum[k] + missing[k] if ml else cum[k]
                rbuf[k] = total[k] - lbuf[k]
            if stats_weight(lbuf, criterion) < min_leaf or stats_weight(rbuf, criterion) < min_leaf:
                continue
            gain = (parent_term - impurity_term(lbuf, criterion, reg_lambda)
                    - impurity_term(rbuf, criterion, reg_lambda))
            if gain > best_gain:
                best_gain = gain
                found_cut = t
                found_ml = ml
    return best_gain, found_cut, found_ml


@nb.njit(cache=True, nogil=True)
def _scratch(n_stats):
    """Scratch buffers of one histogram scan: hist, seen, touched, ordered, cum, lbuf, rbuf, missing, keys."""
    return (np.zeros((N_CODES, n_stats)), np.zeros(N_CODES, np.bool_), np.empty(N_CODES, np.int64),
            np.empty(N_CODES, np.int64), np.zeros(n_stats), np.zeros(n_stats), np.zeros(n_stats),
            np.zeros(n_stats), np.empty(N_CODES))


@nb.njit(cache=True, nogil=True)
def _reduce_pairs(feat_ptr, feat_local, feat_rank, pair_gain, pair_bin, pair_ml, pair_bits):
    """Per node: the best pair, scanning in feature-rank order and keeping the first maximum."""
    n_nodes = feat_ptr.shape[0] - 1
    out_gain = np.full(n_nodes, -np.inf)
    out_rank = np.full(n_nodes, -1, np.int32)
    out_feat = np.full(n_nodes, -1, np.int32)
    out_bin = np.zeros(n_nodes, np.int32)
    out_ml = np.zeros(n_nodes, np.bool_)
    out_cat = np.zeros(n_nodes, np.bool_)
    out_bits = np.zeros((n_nodes, 4), np.uint64)
    for i in range(n_nodes):
        for q in range(feat_ptr[i], feat_ptr[i + 1]):
            if pair_gain[q] > out_gain[i]:
                out_gain[i] = pair_gain[q]
                out_rank[i] = feat_rank[q]
                out_feat[i] = feat_local[q]
                out_bin[i] = pair_bin[q]
                out_ml[i] = pair_ml[q]
                out_cat[i] = pair_bin[q] < 0
                out_bits[i, :] = pair_bits[q, :]
    return out_gain, out_rank, out_feat, out_bin, out_ml, out_cat, out_bits


@nb.njit(cache=True, nogil=True)
def _pair_histogram(f, codes, target, order, weight, s, e, criterion, hist, seen, touched):
    """The histogram kernel: samples s..e of feature f into `hist`; returns how many bins they touch.

    The touched bins are `touched[:n]`, flagged in `seen`. Used by `block_histograms` (a block of rows on a
    Dask worker).
    """
    if criterion == GRADIENT:
        return _gradient_histogram(f, codes, target, order, weight, s, e, hist, seen, touched)
    n_touched = 0
    for j in range(s, e):
        r = order[j]
        b = codes[r, f]
        if not seen[b]:
            seen[b] = True
            touched[n_touched] = b
            n_touched += 1
        _accumulate(hist, b, weight[j], target[j, 0], criterion)
    return n_touched


@nb.njit(cache=True, nogil=True, inline="never")
def _gradient_histogram(f, codes, target, order, weight, s, e, hist, seen, touched):
    """`_pair_histogram` of gradient statistics, a function of its own (see `_accumulate_gradient`).

    Its loop repeats the class/value loop's bin bookkeeping on purpose: a shared inlined helper for it made
    the forests' histograms several times slower (numba 0.68).
    """
    n_touched = 0
    for j in range(s, e):
        r = order[j]
        b = codes[r, f]
        if not seen[b]:
            seen[b] = True
            touched[n_touched] = b
            n_touched += 1
        _accumulate_gradient(hist, b, weight[j], target, j)
    return n_touched


@nb.njit(cache=True, nogil=True)
def _split_of_histogram(pair, categorical, n_touched, total, n_stats, criterion, reg_lambda, min_leaf,
                        n_class_orderings, hist, seen, touched, ordered, cum, lbuf, rbuf, missing, keys,
                        out_gain, out_bin, out_ml, out_bits):
    """Scan one node-feature histogram for its best split, write it at `pair`, reset the scratch.

    The histogram's bins are `touched[:n_touched]`, flagged in `seen`. Shared by the plain kernel and by the
    label holder scanning decrypted histograms, so both pick bit-identical splits.
    """
    parent_term = impurity_term(total, criterion, reg_lambda)
    _sort_touched(n_touched, seen, touched, ordered)
    has_missing = seen[MISSING_BIN]
    n_values = n_touched - 1 if has_missing else n_touched
    for k in range(n_stats):
        missing[k] = hist[MISSING_BIN, k] if has_missing else 0.0
    if not categorical:
        _numeric_split(pair, n_values, total, missing, has_missing, parent_term, criterion, reg_lambda,
                       min_leaf, hist, ordered, cum, lbuf, rbuf, out_gain, out_bin, out_ml)
    else:
        _categorical_split(pair, n_values, total, n_stats, missing, has_missing, parent_term,
                           criterion, reg_lambda, min_leaf, n_class_orderings, hist, ordered, cum, lbuf, rbuf,
                           keys, out_gain, out_bin, out_ml, out_bits)
    for t in range(n_touched):
        b = touched[t]
        seen[b] = False
        for k in range(n_stats):
            hist[b, k] = 0.0


@nb.njit(cache=True, nogil=True)
def _sort_touched(n_touched, seen, touched, ordered):
    """The touched bin codes into ordered[:n_touched], ascending."""
    if n_touched > 48:  # a pass over all codes beats sorting many touched ones
        m = 0
        for b in range(N_CODES):
            if seen[b]:
                ordered[m] = b
                m += 1
    else:
        ordered[:n_touched] = np.sort(touched[:n_touched])


@nb.njit(cache=True, nogil=True)
def _numeric_split(pair, n_values, total, missing, has_missing, parent_term, criterion, reg_lambda, min_leaf,
                   hist, ordered, cum, lbuf, rbuf, out_gain, out_bin, out_ml):
    """The best threshold over the ordered bins, written at `pair` if one is admissible."""
    gain, cut, ml = _scan(hist, ordered, n_values, total, missing, has_missing, parent_term,
                          criterion, reg_lambda, min_leaf, -np.inf, cum, lbuf, rbuf)
    if cut >= 0:
        out_gain[pair] = gain
        if cut == n_values - 1:  # all values left, missing right
            out_bin[pair] = MISSING_BIN - 1
        else:
            out_bin[pair] = (ordered[cut] + ordered[cut + 1] - 1) // 2
        out_ml[pair] = ml if has_missing else _more_left(hist, ordered, cut, total, criterion, lbuf)


@nb.njit(cache=True, nogil=True)
def _categorical_split(pair, n_values, total, n_stats, missing, has_missing, parent_term, criterion,
                       reg_lambda, min_leaf, n_class_orderings, hist, ordered, cum, lbuf, rbuf, keys,
                       out_gain, out_bin, out_ml, out_bits):
    """The best set of categories to send left, written at `pair` if admissible.

    As scikit-learn's HistGradientBoosting and LightGBM regularise it: only categories with at least
    `MIN_CATEGORY_ROWS` rows in the node are ordered (the rarer ones always go right), by their smoothed
    statistic (`_category_keys`) under each documented ordering; the split sends a prefix of that order
    left, at most `MAX_CATEGORY_SPLIT` categories, taken from either end when the cap or rare categories make
    the two ends differ.
    """
    used = np.empty(n_values, np.int64)
    n_used = 0
    for t in range(n_values):
        if _category_rows(hist[ordered[t]], criterion) >= MIN_CATEGORY_ROWS:
            used[n_used] = ordered[t]
            n_used += 1
    rest_right = n_used < n_values
    both_ends = rest_right or n_used > MAX_CATEGORY_SPLIT
    best = -np.inf
    by_value = criterion == SQUARED_ERROR or criterion == GRADIENT
    n_orderings = 1 if by_value or n_stats == 2 else n_class_orderings
    cats = np.empty(n_used, np.int64)
    for o in range(n_orderings):
        _category_keys(hist, used, n_used, total, n_stats, criterion, reg_lambda, o, keys)
        perm = np.argsort(keys[:n_used], kind="mergesort")
        for end in range(2 if both_ends else 1):
            for t in range(n_used):
                cats[t] = used[perm[t]] if end == 0 else used[perm[n_used - 1 - t]]
            gain, cut, ml = _scan(hist, cats, n_used, total, missing, has_missing, parent_term, criterion,
                                  reg_lambda, min_leaf, best, cum, lbuf, rbuf, MAX_CATEGORY_SPLIT, rest_right)
            if cut >= 0:
                best = gain
                out_gain[pair] = gain
                out_bin[pair] = -1
                out_ml[pair] = ml if has_missing else _more_left(hist, cats, cut, total, criterion, lbuf)
                for w in range(4):
                    out_bits[pair, w] = 0
                for t in range(cut + 1):
                    c = cats[t]
                    out_bits[pair, c >> 6] |= np.uint64(1) << np.uint64(c & 63)


@nb.njit(cache=True, nogil=True, inline="always")
def _category_rows(stats, criterion):
    """A category's (bootstrap-weighted) rows in the node: the count statistic, or the class counts' sum."""
    if criterion == SQUARED_ERROR or criterion == GRADIENT:
        return stats[0]
    rows = 0.0
    for k in range(stats.shape[0]):
        rows += stats[k]
    return rows


@nb.njit(cache=True, nogil=True)
def _category_keys(hist, cats, n_cats, total, n_stats, criterion, reg_lambda, o, keys):
    """Each category's key under ordering o, smoothed towards the node's (`CATEGORY_SMOOTHING` rows of it).

    Mean target: (sum + s mean) / (w + s); class o's share (two classes: class 1's): (count + s share) /
    (rows + s); gradient statistics: G / (H + lambda + s), LightGBM's (the node's own weight is 0 there).
    """
    s = CATEGORY_SMOOTHING
    if criterion == SQUARED_ERROR:
        prior = total[1] / total[0] if total[0] > 0.0 else 0.0
    elif criterion != GRADIENT:
        k = o if n_stats > 2 else n_stats - 1
        rows = _category_rows(total, criterion)
        prior = total[k] / rows if rows > 0.0 else 0.0
    else:
        prior = 0.0
    for t in range(n_cats):
        c = cats[t]
        if criterion == GRADIENT:
            keys[t] = hist[c, 1] / (hist[c, 2] + reg_lambda + s)
        elif criterion == SQUARED_ERROR:
            keys[t] = (hist[c, 1] + s * prior) / (hist[c, 0] + s)
        else:
            count = hist[c, o if n_stats > 2 else n_stats - 1]
            keys[t] = (count + s * prior) / (_category_rows(hist[c], criterion) + s)


def best_splits_from_histograms(hist_ptr, hist_bins, hist_stats, pair_node, pair_categorical, totals,
                                node_rows, feat_ptr, feat_local, feat_rank, criterion, min_leaf,
                                n_class_orderings, reg_lambda: float = 0.0) -> NodeSplits:
    """Best split per node from per-pair histograms someone else built.

    CSR: pair q's non-empty bins are hist_bins[hist_ptr[q]:hist_ptr[q+1]] with statistics hist_stats rows. The
    label holder uses this on decrypted histograms of a passive party; the scan is the plain kernel's, so
    results are identical. `node_rows` holds each node's count of distinct in-bag rows (nodes under two are
    skipped, as there).
    """
    pair_out = _splits_of_histograms(hist_ptr, hist_bins, hist_stats, pair_node, pair_categorical, totals,
                                     node_rows, hist_stats.shape[1], criterion, float(reg_lambda), min_leaf,
                                     n_class_orderings)
    return NodeSplits(*_reduce_pairs(feat_ptr, feat_local, feat_rank, *pair_out))


@nb.njit(cache=True, nogil=True, parallel=True)
def _splits_of_histograms(hist_ptr, hist_bins, hist_stats, pair_node, pair_categorical, totals, node_rows,
                          n_stats, criterion, reg_lambda, min_leaf, n_class_orderings):
    n_pairs = pair_node.shape[0]
    out_gain = np.full(n_pairs, -np.inf)
    out_bin = np.zeros(n_pairs, np.int32)
    out_ml = np.zeros(n_pairs, np.bool_)
    out_bits = np.zeros((n_pairs, 4), np.uint64)
    n_chunks = min(n_pairs, 64)
    for chunk in nb.prange(n_chunks):  # every pair writes only its own outputs: any thread count, same bits
        hist, seen, touched, ordered, cum, lbuf, rbuf, missing, keys = _scratch(n_stats)
        for q in range(chunk * n_pairs // n_chunks, (chunk + 1) * n_pairs // n_chunks):
            if node_rows[pair_node[q]] < 2:
                continue  # as the plain kernel: a node of one distinct row has no split
            n_touched = 0
            for t in range(hist_ptr[q], hist_ptr[q + 1]):
                b = hist_bins[t]
                rows = hist_stats[t, 0] if criterion == GRADIENT else stats_weight(hist_stats[t], criterion)
                if rows <= 0.0:  # an empty bin: the plain kernel never sees it (boosting: no row, whatever H)
                    continue
                seen[b] = True
                touched[n_touched] = b
                n_touched += 1
                for k in range(n_stats):
                    hist[b, k] = hist_stats[t, k]
            _split_of_histogram(q, pair_categorical[q], n_touched, totals[pair_node[q]], n_stats, criterion,
                                reg_lambda, min_leaf, n_class_orderings, hist, seen, touched, ordered, cum,
                                lbuf, rbuf, missing, keys, out_gain, out_bin, out_ml, out_bits)
    return out_gain, out_bin, out_ml, out_bits


@nb.njit(cache=True, nogil=True, inline="always")
def _more_left(hist, ordered, cut, total, criterion, buf):
    """Default direction for missing values when the node had none: the heavier child."""
    for k in range(buf.shape[0]):
        buf[k] = 0.0
    for t in range(cut + 1):
        for k in range(buf.shape[0]):
            buf[k] += hist[ordered[t], k]
    wl = stats_weight(buf, criterion)
    return wl >= stats_weight(total, criterion) - wl


def node_statistics(target, weight, starts, ends, n_stats, criterion) -> np.ndarray:
    """Sufficient statistics of every node (rows of the returned (n_nodes, n_stats) array)."""
    return _node_statistics(target_columns(target), weight, starts, ends, n_stats, criterion)


@nb.njit(cache=True, nogil=True, parallel=True)
def _node_statistics(target, weight, starts, ends, n_stats, criterion):
    n_nodes = starts.shape[0]
    out = np.zeros((n_nodes, n_stats))
    for i in nb.prange(n_nodes):
        if criterion == GRADIENT:
            for j in range(starts[i], ends[i]):
                _accumulate_gradient(out, i, weight[j], target, j)
        else:
            for j in range(starts[i], ends[i]):
                _accumulate(out, i, weight[j], target[j, 0], criterion)
    return out


# -- histograms of a block of rows (a vertical party's rows on Dask, issue #29) ---------------------------
def block_histograms(codes, target, order, weight, starts, ends, feat_ptr, feat_local, n_stats,
                     criterion) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (node, candidate feature) pair's histogram over a block's samples, in CSR, exact.

    Returns (hist_ptr (n_pairs + 1), hist_bins, hist_stats (m, n_stats)): pair q's non-empty bins, ascending,
    are hist_bins[hist_ptr[q]:hist_ptr[q + 1]]. Class counts weighted by integer bootstrap counts are int64;
    squared error's (w, wy) and boosting's (count, G, H) stay float64, exact over targets on their grid
    (`fedcore.trees.fixed_gradients`: `fixed_targets`, or a round's `GradientGrid`: integers times 2^e,
    every sum of them below 2^53 times 2^e). Either way the blocks add up (`sum_histograms`) to the whole
    table's in any order.
    """
    target = target_columns(target)
    pair_node = np.repeat(np.arange(len(starts), dtype=np.int64), np.diff(feat_ptr))
    bound = np.minimum(ends - starts, N_CODES)[pair_node].astype(np.int64)
    slots = np.zeros(len(bound) + 1, np.int64)
    np.cumsum(bound, out=slots[1:])
    bins, stats, counts = _block_histograms(codes, target, order, weight, starts, ends, pair_node,
                                            feat_local.astype(np.int64), slots, n_stats, criterion)
    ptr = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=ptr[1:])
    bins, stats = _compact_runs(bins, stats, slots, counts, ptr)
    return ptr, bins, stats if criterion in VALUE_STATISTICS else stats.astype(np.int64)


@nb.njit(cache=True, nogil=True)
def _compact_runs(bins, stats, slots, counts, ptr):
    """Pair q's `counts[q]` bins and statistics from slot `slots[q]` to `ptr[q]`: the CSR without gaps."""
    out_bins = np.empty(ptr[-1], np.uint8)
    out_stats = np.empty((ptr[-1], stats.shape[1]))
    for q in range(counts.shape[0]):
        a, b = slots[q], ptr[q]
        for t in range(counts[q]):
            out_bins[b + t] = bins[a + t]
            for k in range(stats.shape[1]):
                out_stats[b + t, k] = stats[a + t, k]
    return out_bins, out_stats


@nb.njit(cache=True, nogil=True, parallel=True)
def _block_histograms(codes, target, order, weight, starts, ends, pair_node, pair_feat, slots, n_stats,
                      criterion):
    """Pair q's `counts[q]` touched bins, ascending, with their statistics, from slot `slots[q]` on.

    The rest of a pair's slots are left unwritten (`_compact_runs` copies the written ones).
    """
    n_pairs = pair_node.shape[0]
    bins = np.empty(slots[-1], np.uint8)
    stats = np.empty((slots[-1], n_stats))
    counts = np.zeros(n_pairs, np.int64)
    n_chunks = min(n_pairs, 64)
    for chunk in nb.prange(n_chunks):
        hist, seen, touched, ordered, cum, lbuf, rbuf, missing, keys = _scratch(n_stats)
        for q in range(chunk * n_pairs // n_chunks, (chunk + 1) * n_pairs // n_chunks):
            i = pair_node[q]
            n = _pair_histogram(pair_feat[q], codes, target, order, weight, starts[i], ends[i], criterion,
                                hist, seen, touched)
            _sort_touched(n, seen, touched, ordered)
            for t in range(n):
                b = ordered[t]
                bins[slots[q] + t] = b
                for k in range(n_stats):
                    stats[slots[q] + t, k] = hist[b, k]
                    hist[b, k] = 0.0
                seen[b] = False
            counts[q] = n
    return bins, stats, counts


def sum_histograms(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                   n_pairs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The blocks' `block_histograms` added up: one CSR over the union of their bins (exact, their dtype)."""
    if not parts:
        return np.zeros(n_pairs + 1, np.int64), np.zeros(0, np.uint8), np.zeros((0, 0), np.int64)
    base = np.cumsum([0] + [len(p[1]) for p in parts])[:-1]
    ptrs = np.stack([np.asarray(p[0], np.int64) for p in parts])  # (n_blocks, n_pairs + 1)
    term_lo = (ptrs[:, :-1] + base[:, None]).T.ravel()  # pair after pair, its blocks in block order
    term_hi = (ptrs[:, 1:] + base[:, None]).T.ravel()
    term_ptr = np.arange(n_pairs + 1, dtype=np.int64) * len(parts)
    return signed_histogram_sums(np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts]),
                                 term_ptr, term_lo, term_hi, np.ones(len(term_lo), np.int64))


def signed_histogram_sums(src_bins: np.ndarray, src_stats: np.ndarray, term_ptr: np.ndarray,
                          term_lo: np.ndarray, term_hi: np.ndarray,
                          term_sign: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per output pair, a signed sum of CSR histogram runs: the blocks' sum, or a parent minus its sibling.

    Pair q adds run t (bins `src_bins[term_lo[t]:term_hi[t]]`, their `src_stats` rows) times `term_sign[t]`
    for t in term_ptr[q]:term_ptr[q + 1]. Returns (ptr, bins ascending, stats) of the bins with any non-zero
    statistic (a bin holds rows iff one of its statistics is non-zero: every row weighs at least 1). Exact
    for integers (and for sums of (w, wy) on their grid), in any order of the terms.
    """
    dtype = src_stats.dtype
    src_stats = np.ascontiguousarray(src_stats, np.float64)  # one compiled kernel: integers below 2^53 exact
    sign = term_sign.astype(np.float64)
    n_pairs = len(term_ptr) - 1
    ptr = np.zeros(n_pairs + 1, np.int64)
    none_bins, none_stats = np.zeros(0, np.uint8), np.zeros((0, src_stats.shape[1]))
    _signed_pass(src_bins, src_stats, term_ptr, term_lo, term_hi, sign, False, ptr, none_bins, none_stats)
    np.cumsum(ptr[1:], out=ptr[1:])  # each pair's count, then where its bins start
    bins, stats = np.zeros(ptr[-1], np.uint8), np.zeros((ptr[-1], src_stats.shape[1]))
    _signed_pass(src_bins, src_stats, term_ptr, term_lo, term_hi, sign, True, ptr, bins, stats)
    return ptr, bins, stats.astype(dtype, copy=False)


@nb.njit(cache=True, nogil=True)
def _signed_pair(src_bins, src_stats, term_ptr, term_lo, term_hi, term_sign, q, acc, seen):
    """Pair q's terms into the zeroed dense `acc` (N_CODES, n_stats); `seen` flags the bins they touch."""
    for t in range(term_ptr[q], term_ptr[q + 1]):
        sign = term_sign[t]
        for j in range(term_lo[t], term_hi[t]):
            b = src_bins[j]
            seen[b] = True
            for k in range(acc.shape[1]):
                acc[b, k] += sign * src_stats[j, k]


@nb.njit(cache=True, nogil=True, parallel=True)
def _signed_pass(src_bins, src_stats, term_ptr, term_lo, term_hi, term_sign, fill, ptr, bins, stats):
    """Each pair's bins with a non-zero statistic: counted into ptr[q + 1], or (`fill`) written from ptr[q].

    One pass serves both: count, allocate (`signed_histogram_sums`), fill, each pair's bins ascending.
    """
    n_pairs = term_ptr.shape[0] - 1
    n_chunks = min(n_pairs, 64)
    for chunk in nb.prange(n_chunks):
        acc = np.zeros((N_CODES, src_stats.shape[1]), src_stats.dtype)
        seen = np.zeros(N_CODES, np.bool_)
        for q in range(chunk * n_pairs // n_chunks, (chunk + 1) * n_pairs // n_chunks):
            _signed_pair(src_bins, src_stats, term_ptr, term_lo, term_hi, term_sign, q, acc, seen)
            m = ptr[q] if fill else 0
            for b in range(N_CODES):
                if seen[b]:
                    for k in range(acc.shape[1]):
                        if acc[b, k] != 0:
                            if fill:
                                bins[m] = b
                                stats[m, :] = acc[b, :]
                            m += 1
                            break
                    acc[b, :] = 0
                    seen[b] = False
            if not fill:
                ptr[q + 1] = m
