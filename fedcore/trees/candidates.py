"""Choosing the best of k candidate splits per node from aggregated branch statistics.

The horizontal master's hot path, compiled: gains, the usable candidates and the winner, in one pass over (A,
k, 2, S).

The arithmetic is the same, operation for operation, as the NumPy definitions it replaced (kept as the
reference in tests/trees/test_candidates.py): sums over the S statistics follow NumPy's pairwise order
(`_numpy_sum`), so noisy (non-integer) statistics give the same bits as before, and exact integer counts
give exact sums in any order. Logarithms (entropy) are libm's `log2`, the same on
every CPU. Exact counts need not be added into a float64 array first: `best_of_counts` reads each
contributor's integer counts and adds them node by node, to the same values. One compiled kernel (`_choose`,
one signature) serves both entry points and every contributor's element type: it reads the statistics'
bytes as their type says.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

GINI, ENTROPY, VARIANCE = 0, 1, 2
CRITERION_CODES = {"gini": GINI, "entropy": ENTROPY, "squared_error": VARIANCE}


@nb.njit(cache=True, nogil=True)
def _numpy_sum(values: np.ndarray) -> float:
    """Sum in NumPy's pairwise order for a contiguous row.

    8 running partial sums up to 128 values, and above that the halves (rounded to a multiple of 8) summed so,
    then added.
    """
    n = values.shape[0]
    if n > 128:
        half = n // 2
        half -= half % 8
        return _numpy_sum(values[:half]) + _numpy_sum(values[half:])
    if n < 8:
        total = 0.0
        for i in range(n):
            total += values[i]
        return total
    r0, r1, r2, r3 = values[0], values[1], values[2], values[3]
    r4, r5, r6, r7 = values[4], values[5], values[6], values[7]
    i = 8
    while i < n - n % 8:
        r0 += values[i]
        r1 += values[i + 1]
        r2 += values[i + 2]
        r3 += values[i + 3]
        r4 += values[i + 4]
        r5 += values[i + 5]
        r6 += values[i + 6]
        r7 += values[i + 7]
        i += 8
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        total += values[i]
        i += 1
    return total


@nb.njit(cache=True, nogil=True, inline="always")
def _class_term(counts: np.ndarray, scratch: np.ndarray, criterion: int) -> float:
    """Impurity of a clamped class-count vector times its total count (gini, or entropy in bits).

    `scratch` holds S floats.
    """
    n = _numpy_sum(counts)
    if n <= 0:
        return 0.0
    if criterion == GINI:
        for c in range(counts.shape[0]):
            scratch[c] = counts[c] * counts[c]
        return n - _numpy_sum(scratch) / n
    for c in range(counts.shape[0]):
        scratch[c] = counts[c] * math.log2(counts[c]) if counts[c] > 0 else 0.0
    return n * math.log2(n) - _numpy_sum(scratch)


@nb.njit(cache=True, nogil=True, inline="always")
def _gain(raw_left: np.ndarray, raw_right: np.ndarray, left: np.ndarray, right: np.ndarray,
          parent: np.ndarray, scratch: np.ndarray, criterion: int) -> tuple[float, float, float]:
    """One candidate's gain and its branches' sizes from its left and right statistics (S,) each.

    Classes: the clamped counts (in `left`, `right`, `parent`; `scratch` holds S floats). Regression:
    (count, sum) per branch.
    """
    if criterion == VARIANCE:
        nl = max(raw_left[0], 0.0)
        nr = max(raw_right[0], 0.0)
        gain = 0.0
        if nl > 0 and nr > 0:
            diff = raw_left[1] / nl - raw_right[1] / nr
            gain = nl * nr / (nl + nr) * (diff * diff)
        return gain, nl, nr
    for c in range(raw_left.shape[0]):
        left[c] = max(raw_left[c], 0.0)
        right[c] = max(raw_right[c], 0.0)
        parent[c] = left[c] + right[c]
    nl = _numpy_sum(left)
    nr = _numpy_sum(right)
    gain = (_class_term(parent, scratch, criterion) - _class_term(left, scratch, criterion)
            - _class_term(right, scratch, criterion))
    return gain, nl, nr


@nb.njit(cache=True, nogil=True, inline="always")
def _usable(gain: float, nl: float, nr: float, valid: bool, min_leaf: float) -> bool:
    """A candidate that may split: valid, both sides >= min_leaf, gain above the rounding guard."""
    return valid and nl >= min_leaf and nr >= min_leaf and gain > 1e-12 * max(nl + nr, 1.0)


def best_candidates(branch: np.ndarray, sizes: np.ndarray, valid: np.ndarray, criterion: int, min_leaf: float,
                    has_sizes: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per open node: the best usable candidate (-1 when none) and every candidate's branch sizes (A, k, 2).

    branch (A, k, 2, S) float64: left then right statistics; sizes (A, k, 2): the branch sizes to use when
    `has_sizes` (LDP: exact; GDP: the unclamped sums of the noisy counts), else ignored and the sizes are the
    clamped counts (classification) or the count statistic (regression). Usable: valid, both sides >=
    min_leaf, gain > 1e-12 max(n, 1). Ties go to the lowest candidate index.
    """
    return _chosen([np.asarray(branch, np.float64)], sizes, has_sizes, valid, criterion, min_leaf)


COUNT_GROUP = 4
"""Contributors' counts `best_of_counts` reads in one pass: a fixed number, so one compiled kernel serves
every party count (more are added up first)."""


def best_of_counts(parts: list[np.ndarray], valid: np.ndarray, criterion: int,
                   min_leaf: float) -> tuple[np.ndarray, np.ndarray]:
    """`best_candidates` of the sum of the contributors' exact integer counts (A, k, 2, S) each, same shape.

    The sum is made where it is read, node by node, never as a float64 array of the level (20 MB a deep
    level of letter: writing and reading it again cost more than the choice), and each contributor's counts
    are read in the integer type it sent (no widened copy). Exact in any order: checked counts are integers
    below 2**52, so each float64 sum is the one `best_candidates` would be given.
    """
    if len(parts) > COUNT_GROUP:  # added up in int64 first (exact), then read as one
        total = parts[0].astype(np.int64)
        for part in parts[1:]:
            total += part.astype(np.int64, copy=False)  # checked: below 2**52, whatever integer type came
        parts = [total]
    return _chosen(parts, np.zeros((0, 0, 2)), False, valid, criterion, min_leaf)


def summed_counts(parts: list[np.ndarray], nodes: np.ndarray | slice,
                  candidates: np.ndarray | int) -> np.ndarray:
    """The contributors' counts of the given (node, candidate) pairs added up: (..., 2, S) float64, exact."""
    total = parts[0][nodes, candidates].astype(np.float64)
    for part in parts[1:]:
        total += part[nodes, candidates]
    return total


KINDS = (np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32, np.int64, np.float64)
"""The element types `_choose` reads statistics in, by their index (`_add_row`)."""


def _chosen(parts: list[np.ndarray], sizes: np.ndarray, has_sizes: bool, valid: np.ndarray, criterion: int,
            min_leaf: float) -> tuple[np.ndarray, np.ndarray]:
    """`_choose` on up to COUNT_GROUP contributors' (A, k, 2, S) statistics, each as it came.

    Every argument in one type whatever the contributors' element types (their bytes, read-only), so one
    compiled signature serves every party's counts and the noisy float64 sums alike.
    """
    shape = parts[0].shape
    if valid.shape != shape[:2] or (has_sizes and sizes.shape != (*shape[:2], 2)):
        raise ValueError(f"statistics of shape {shape} with validity {valid.shape} and sizes {sizes.shape}")
    raws, kinds = [], []
    for part in parts:
        if part.shape != shape:
            raise ValueError(f"contributors' statistics differ in shape: {part.shape} and {shape}")
        dtype = part.dtype.newbyteorder("=")
        if dtype.type not in KINDS:
            raise ValueError(f"statistics of type {part.dtype} cannot be read (integers or float64)")
        native = np.ascontiguousarray(part, dtype)
        raws.append(_read_only(native.reshape(shape[0], -1 if native.size else 0).view(np.uint8)))
        kinds.append(KINDS.index(dtype.type))
    unused = _read_only(np.zeros((0, 0), np.uint8))
    raws += [unused] * (COUNT_GROUP - len(raws))
    kinds += [0] * (COUNT_GROUP - len(kinds))
    return _choose(tuple(raws), np.array(kinds, np.int64), len(parts), shape[-1],
                   _read_only(np.ascontiguousarray(sizes, np.float64)), bool(has_sizes),
                   _read_only(np.ascontiguousarray(valid, np.bool_)), int(criterion), float(min_leaf))


def _read_only(array: np.ndarray) -> np.ndarray:
    """A read-only view: received arrays are read-only, converted ones not; the kernel takes one type."""
    view = array.view()
    view.flags.writeable = False
    return view


@nb.njit(cache=True, nogil=True, inline="always")
def _add_values(out: np.ndarray, values: np.ndarray, first: bool) -> None:
    """`out` = (first) or += `values` as float64, element by element (a copy keeps the sign of a zero)."""
    if first:
        for i in range(out.shape[0]):
            out[i] = np.float64(values[i])
    else:
        for i in range(out.shape[0]):
            out[i] += np.float64(values[i])


@nb.njit(cache=True, nogil=True, inline="always")
def _add_row(out: np.ndarray, row: np.ndarray, kind: int, first: bool) -> None:
    """A node's statistics, given as the bytes of `KINDS[kind]` values, into `out` (`_add_values`).

    One branch per type: numba's parallel loops do not take `literal_unroll` in their body, and a call to a
    function that unrolls the types costs the choice 10-20% on regression's two statistics.
    """
    if kind == 0:
        _add_values(out, row, first)
    elif kind == 1:
        _add_values(out, row.view(np.uint16), first)
    elif kind == 2:
        _add_values(out, row.view(np.uint32), first)
    elif kind == 3:
        _add_values(out, row.view(np.uint64), first)
    elif kind == 4:
        _add_values(out, row.view(np.int8), first)
    elif kind == 5:
        _add_values(out, row.view(np.int16), first)
    elif kind == 6:
        _add_values(out, row.view(np.int32), first)
    elif kind == 7:
        _add_values(out, row.view(np.int64), first)
    else:
        _add_values(out, row.view(np.float64), first)


NODE_CHUNK = 256
"""Nodes `_choose` takes one after another in a parallel task, reusing its scratch arrays."""


@nb.njit(cache=True, nogil=True, parallel=True)
def _choose(raws: tuple, kinds: np.ndarray, used: int, n_stats: int, sizes: np.ndarray, has_sizes: bool,
            valid: np.ndarray, criterion: int, min_leaf: float) -> tuple[np.ndarray, np.ndarray]:
    """`best_candidates` of the sum of the first `used` contributors (`_chosen`), node by node.

    A node's statistics are added up in contributor order into one float64 block, then each candidate's gain
    and sizes are computed from its (left, right) rows of it and the first best usable one wins.
    """
    n_nodes, k = valid.shape
    best = np.full(n_nodes, -1, dtype=np.int64)
    branch_n = np.empty((n_nodes, k, 2), dtype=np.float64)
    for chunk in nb.prange((n_nodes + NODE_CHUNK - 1) // NODE_CHUNK):
        flat = np.empty(k * 2 * n_stats)
        stats = flat.reshape((k, 2, n_stats))
        left = np.empty(n_stats)
        right = np.empty(n_stats)
        parent = np.empty(n_stats)
        scratch = np.empty(n_stats)
        for a in range(chunk * NODE_CHUNK, min((chunk + 1) * NODE_CHUNK, n_nodes)):
            for i in range(used):
                _add_row(flat, raws[i][a], kinds[i], i == 0)
            best_gain = -np.inf
            for j in range(k):
                gain, nl, nr = _gain(stats[j, 0], stats[j, 1], left, right, parent, scratch, criterion)
                if has_sizes:
                    nl = sizes[a, j, 0]
                    nr = sizes[a, j, 1]
                branch_n[a, j, 0] = nl
                branch_n[a, j, 1] = nr
                if _usable(gain, nl, nr, valid[a, j], min_leaf) and gain > best_gain:
                    best_gain = gain
                    best[a] = j
    return best, branch_n
