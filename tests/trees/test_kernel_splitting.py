"""Split search kernels (fedcore/trees/splitting.py) against brute force.

The reference tries every threshold 0..254 with both missing directions (numeric), every prefix of the
documented category orderings and, where it is small enough, every subset of categories (categorical);
gains come from the samples on each side by definition, not from histograms. Exact equality is asserted
for everything discrete (which rows go left, bins, category bits, missing direction, rank, node totals
of class counts); gains are compared at a tolerance tied to the size of the terms they are built from.
On random nodes any candidate within that tolerance of the best is accepted (gains computed in another
order may break a true tie either way); the documented tie order is checked exactly on nodes whose
candidates tie to the bit (pure children, identical columns, pure nodes).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest

from fedcore.data.binning import MISSING_BIN
from fedcore.trees.criteria import ENTROPY, GINI, GRADIENT, SQUARED_ERROR, n_stats
from fedcore.trees.fixed_gradients import GradientGrid, fixed_targets
from fedcore.trees.level_histograms import find_best_splits
from fedcore.trees.splitting import (
    CATEGORY_SMOOTHING,
    MAX_CATEGORY_SPLIT,
    MIN_CATEGORY_ROWS,
    NodeSplits,
    best_splits_from_histograms,
    block_histograms,
    node_statistics,
    sum_histograms,
)
from tests.trees.references import reference_term

MISSING = MISSING_BIN
ALL_VALUES_LEFT = MISSING_BIN - 1  # the bin a numeric split reports when every non-missing value goes left


# -- reference ----------------------------------------------------------------------------------------


def gain_tolerance(y: np.ndarray, w: np.ndarray, criterion: int, n_classes: int) -> float:
    """Absolute tolerance on a gain.

    The kernel subtracts terms of size up to W (x log2 C for entropy) or sum w*y^2 (squared error,
    sum-of-squares form) that carry a few ulps each; 1e-12 of that scale is ~100x the rounding error at these
    sizes and far below the gap between two genuinely different gains.
    """
    W = float(np.sum(w))
    if criterion == SQUARED_ERROR:
        return 1e-12 * max(1.0, W * (1.0 + float(np.max(y * y, initial=0.0))))
    return 1e-12 * max(1.0, W * max(1.0, np.log2(max(n_classes, 2))))


def side_terms(masks: np.ndarray, y: np.ndarray, w: np.ndarray, criterion: int, n_classes: int) -> np.ndarray:
    """reference_term of the samples selected by each row of `masks` ((m, n) bool), vectorised.

    Class weights (or the mean) of each side summed over its samples, then the same definitions.
    """
    m = masks.astype(np.float64) * w[None, :]
    total = m.sum(axis=1)
    safe = np.where(total > 0, total, 1.0)
    if criterion == SQUARED_ERROR:
        mean = (m @ y) / safe
        return np.sum(m * (y[None, :] - mean[:, None]) ** 2, axis=1)
    p = (m @ (y[:, None] == np.arange(n_classes)[None, :])) / safe[:, None]
    if criterion == GINI:
        return total * (1.0 - np.sum(p * p, axis=1))
    with np.errstate(divide="ignore", invalid="ignore"):
        return total * -np.sum(np.where(p > 0, p * np.log2(p), 0.0), axis=1)


def split_gains(masks: np.ndarray, y: np.ndarray, w: np.ndarray, criterion: int,
                n_classes: int) -> np.ndarray:
    """Parent term minus both children's terms, per row of `masks` (True: goes left)."""
    parent = reference_term(y, w, criterion, n_classes)
    return (parent - side_terms(masks, y, w, criterion, n_classes)
            - side_terms(~masks, y, w, criterion, n_classes))


@dataclass
class Candidate:
    """One split of a node's samples on one feature, as the kernel must report it if it picks it."""

    left: np.ndarray  # bool per node sample
    gain: float
    missing_left: bool
    bin: int  # numeric: reported bin; categorical: -1
    categories: frozenset[int] | None  # categorical: the left set of category codes


def _first_admissible(masks: np.ndarray, codes: np.ndarray, w: np.ndarray, min_leaf: float) -> list[int]:
    """Rows of `masks` (in scan order) that are the first occurrence of an admissible partition.

    Both sides non-empty and at least min_leaf heavy; a side of missing values alone goes right (its mirror,
    all values left and missing right, is the same split and the one the kernel writes).
    """
    values = codes != MISSING
    left_weight = masks.astype(np.float64) @ w
    ok = (masks.any(axis=1) & ~masks.all(axis=1) & (masks & values[None, :]).any(axis=1)
          & (left_weight >= min_leaf) & (w.sum() - left_weight >= min_leaf))
    seen: set[bytes] = set()
    out = []
    for r in np.flatnonzero(ok):
        key = masks[r].tobytes()
        if key not in seen:
            seen.add(key)
            out.append(int(r))
    return out


def _reported_missing_left(codes: np.ndarray, w: np.ndarray, left: np.ndarray, ml: bool) -> bool:
    """Missing direction: as chosen when the node has missing values, else the heavier child (ties left)."""
    if (codes == MISSING).any():
        return ml
    return float(np.sum(w[left])) >= float(np.sum(w[~left]))


def numeric_candidates(codes: np.ndarray, y: np.ndarray, w: np.ndarray, criterion: int, n_classes: int,
                       min_leaf: float) -> list[Candidate]:
    """Every threshold b in 0..254 (left iff code <= b) and missing direction, once per partition.

    Lowest b first and missing right before missing left, one entry per distinct partition (its first
    occurrence).
    """
    thresholds = np.repeat(np.arange(MISSING), 2)
    ml = np.tile([False, True], MISSING)
    masks = np.where(codes[None, :] == MISSING, ml[:, None], codes[None, :] <= thresholds[:, None])
    keep = _first_admissible(masks, codes, w, min_leaf)
    gains = split_gains(masks[keep], y, w, criterion, n_classes)
    values = codes[codes != MISSING].astype(np.int64)
    out = []
    for r, gain in zip(keep, gains, strict=True):
        left, b = masks[r], int(thresholds[r])
        right_values = values[values > b]
        # the kernel's threshold: halfway (rounded down) between the node's neighbouring occupied bins
        reported = ALL_VALUES_LEFT if len(right_values) == 0 else (int(values[values <= b].max())
                                                                    + int(right_values.min()) - 1) // 2
        out.append(Candidate(left, float(gain), _reported_missing_left(codes, w, left, bool(ml[r])),
                             reported, None))
    return out


def category_orderings(codes: np.ndarray, y: np.ndarray, w: np.ndarray, criterion: int,
                       n_classes: int) -> tuple[list[list[int]], bool]:
    """The documented orderings of the node's categories, and whether rare ones always go right.

    Only categories with at least MIN_CATEGORY_ROWS (weighted) rows are ordered; by the mean target
    (regression), the share of class 1 (two classes), else one ordering per class by its share, each smoothed
    by CATEGORY_SMOOTHING rows of the node's own; ties keep ascending codes.
    """
    present = sorted(set(codes[codes != MISSING].tolist()))
    used = [c for c in present if float(np.sum(w[codes == c])) >= MIN_CATEGORY_ROWS]
    s, total = CATEGORY_SMOOTHING, float(np.sum(w))
    if criterion == SQUARED_ERROR:
        prior = float(np.sum(w * y)) / total
        keys = [{c: (float(np.sum(w[codes == c] * y[codes == c])) + s * prior)
                 / (float(np.sum(w[codes == c])) + s) for c in used}]
    else:
        classes = [1] if n_classes == 2 else range(n_classes)
        keys = [{c: (float(np.sum(w[(codes == c) & (y == k)])) + s * (float(np.sum(w[y == k])) / total))
                 / (float(np.sum(w[codes == c])) + s) for c in used} for k in classes]
    return [sorted(used, key=key.__getitem__) for key in keys], len(used) < len(present)


def categorical_candidates(codes: np.ndarray, y: np.ndarray, w: np.ndarray, criterion: int, n_classes: int,
                           min_leaf: float) -> list[Candidate]:
    """Every prefix (at most MAX_CATEGORY_SPLIT categories) of every ordering, missing right before left.

    From each order's low end, then from its high end where rare categories or the cap make the ends differ;
    the first occurrence of each partition.
    """
    sets, masks, mls = [], [], []
    orderings, rest_right = category_orderings(codes, y, w, criterion, n_classes)
    for ordering in orderings:
        ends = [ordering, ordering[::-1]] if rest_right or len(ordering) > MAX_CATEGORY_SPLIT else [ordering]
        for end in ends:
            for t in range(min(len(end), MAX_CATEGORY_SPLIT)):
                chosen = frozenset(end[: t + 1])
                member = np.isin(codes, list(chosen))
                for ml in (False, True):
                    sets.append(chosen)
                    masks.append(np.where(codes == MISSING, ml, member))
                    mls.append(ml)
    if not masks:
        return []
    masks_ = np.array(masks)
    keep = _first_admissible(masks_, codes, w, min_leaf)
    gains = split_gains(masks_[keep], y, w, criterion, n_classes)
    return [Candidate(masks_[r], float(g), _reported_missing_left(codes, w, masks_[r], mls[r]), -1, sets[r])
            for r, g in zip(keep, gains, strict=True)]


def all_subset_gains(codes: np.ndarray, y: np.ndarray, w: np.ndarray, criterion: int,
                     n_classes: int) -> np.ndarray:
    """Gain of every partition of {categories present} + {missing} into two non-empty sides."""
    present = sorted(set(codes[codes != MISSING].tolist()))
    masks = []
    for size in range(len(present) + 1):
        for subset in itertools.combinations(present, size):
            member = np.isin(codes, list(subset))
            for ml in (False, True):
                left = np.where(codes == MISSING, ml, member)
                if left.any() and not left.all():
                    masks.append(left)
    return split_gains(np.array(masks), y, w, criterion, n_classes) if masks else np.zeros(0)


def kernel_left(codes: np.ndarray, split: NodeSplits, i: int) -> np.ndarray:
    """Which samples go left under the kernel's split of node i.

    Missing: missing_left; categorical: bit set; numeric: code <= bin.
    """
    if split.is_categorical[i]:
        bits = split.cat_bits[i]
        member = np.array([(int(bits[c >> 6]) >> (c & 63)) & 1 for c in codes.tolist()], dtype=bool)
    else:
        member = codes.astype(np.int64) <= split.bin[i]
    return np.where(codes == MISSING, bool(split.missing_left[i]), member)


def category_bits(categories: frozenset[int]) -> np.ndarray:
    """The (4,) uint64 bitset of a set of category codes."""
    out = [0, 0, 0, 0]
    for c in categories:
        out[c >> 6] |= 1 << (c & 63)
    return np.array(out, dtype=np.uint64)


# -- problems -----------------------------------------------------------------------------------------


@dataclass
class Problem:
    """Inputs of find_best_splits in the layout the party passes (fedcore/vertical/party.py)."""

    codes: np.ndarray  # (n_rows, n_features) uint8, Fortran order, MISSING_BIN for missing
    is_cat: np.ndarray
    order: np.ndarray  # int32 row per sample position
    weight: np.ndarray  # int32 bootstrap counts
    target: np.ndarray  # float64 class code or value per position
    starts: np.ndarray
    ends: np.ndarray
    feat_ptr: np.ndarray
    feat_local: np.ndarray
    feat_rank: np.ndarray
    criterion: int
    n_classes: int
    min_leaf: float

    @property
    def n_stats(self) -> int:
        return n_stats(self.criterion, self.n_classes)

    def run(self) -> tuple[NodeSplits, np.ndarray]:
        """The kernel, called as the party calls it (n_class_orderings = n_stats)."""
        splits, totals, _ = find_best_splits(self.codes, self.target, self.order, self.weight, self.starts,
                                             self.ends, self.feat_ptr, self.feat_local, self.feat_rank,
                                             self.is_cat, self.n_stats, self.criterion, self.min_leaf,
                                             self.n_stats)
        return splits, totals

    def node(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, weights, targets) of node i."""
        s, e = self.starts[i], self.ends[i]
        return self.order[s:e], self.weight[s:e].astype(np.float64), self.target[s:e]


def feature_columns(rng: np.random.Generator, n_rows: int) -> tuple[list[np.ndarray], list[bool]]:
    """Columns of codes covering the interesting shapes.

    Few spread-out bins with missing values, >48 distinct bins (the kernel's full-scan path), no missing,
    constant, categoricals with low and with high codes (all four bitset words), one with more categories
    than MAX_CATEGORY_SPLIT, and a categorical with
    missing values.
    """
    def spread(choices: np.ndarray, missing_rate: float) -> np.ndarray:
        col = rng.choice(choices, n_rows).astype(np.uint8)
        col[rng.random(n_rows) < missing_rate] = MISSING
        return col

    columns = [
        (spread(np.sort(rng.choice(255, 7, replace=False)), 0.15), False),
        (spread(np.arange(0, 240, 2), 0.05), False),
        (spread(np.array([3, 4, 9, 60, 61, 200]), 0.0), False),
        (spread(np.array([17]), 0.3), False),
        (spread(np.arange(5), 0.0), True),
        (spread(np.array([0, 63, 64, 127, 128, 191, 192, 254]), 0.2), True),
        (spread(np.arange(3), 0.25), True),
        (spread(np.arange(0, 200, 5), 0.1), True),  # 40 categories: more than MAX_CATEGORY_SPLIT
    ]
    return [c for c, _ in columns], [cat for _, cat in columns]


def random_problem(seed: int, criterion: int, n_classes: int, min_leaf: float,
                   sizes: tuple[int, ...] = (0, 1, 2, 2, 3, 4, 5, 8, 13, 21, 40, 90, 250) * 2,
                   constant_label: bool = False) -> Problem:
    """Nodes of the given sizes, each with a random subset of the features, as the master sends them.

    Distinct rows each, weights 1..3; the features in random local order with ascending, gapped ranks.
    """
    rng = np.random.default_rng(seed)
    n_rows = 300
    columns, cats = feature_columns(rng, n_rows)
    codes = np.asfortranarray(np.stack(columns, axis=1))
    if criterion == SQUARED_ERROR:
        y = rng.normal(0.0, 3.0, n_rows).round(3) if not constant_label else np.full(n_rows, 2.5)
    else:
        y = (rng.integers(0, n_classes, n_rows).astype(np.float64) if not constant_label
             else np.full(n_rows, 1.0))
    order = np.concatenate([np.zeros(0, np.int64)] + [rng.choice(n_rows, s, replace=False) for s in sizes])
    order = order.astype(np.int32)
    ends = np.cumsum(sizes).astype(np.int64)
    starts = ends - np.asarray(sizes, dtype=np.int64)
    n_features = codes.shape[1]
    locals_, ranks, ptr = [], [], [0]
    for _ in sizes:
        k = rng.integers(1, n_features + 1)
        locals_.append(rng.permutation(n_features)[:k])
        ranks.append(np.sort(rng.choice(3 * n_features, k, replace=False)))
        ptr.append(ptr[-1] + k)
    return Problem(codes, np.array(cats), order, rng.integers(1, 4, len(order)).astype(np.int32),
                   y[order].astype(np.float64), starts, ends, np.array(ptr, np.int64),
                   np.concatenate([np.zeros(0, np.int32)] + locals_).astype(np.int32),
                   np.concatenate([np.zeros(0, np.int32)] + ranks).astype(np.int32),
                   criterion, n_classes, min_leaf)


# -- checks -------------------------------------------------------------------------------------------


def check_against_brute_force(problem: Problem, splits: NodeSplits) -> int:
    """Each node: gain = the best brute-force gain over its candidate features.

    The reported split is one of the brute-force optima, written as the kernel documents (rows left, bin,
    bits, missing side, rank). Returns how many nodes split (so callers can check the case was not vacuous).
    """
    n_split = 0
    for i in range(len(problem.starts)):
        rows, w, y = problem.node(i)
        per_feature: list[list[Candidate]] = []
        for q in range(problem.feat_ptr[i], problem.feat_ptr[i + 1]):
            f = problem.feat_local[q]
            enumerate_ = categorical_candidates if problem.is_cat[f] else numeric_candidates
            args = (problem.codes[rows, f], y, w, problem.criterion, problem.n_classes, problem.min_leaf)
            per_feature.append(enumerate_(*args) if len(rows) >= 2 else [])
        gains = [c.gain for cands in per_feature for c in cands]
        if not gains:
            assert splits.gain[i] == -np.inf and splits.rank[i] == -1 and splits.feature[i] == -1, i
            continue
        n_split += 1
        best, tol = max(gains), gain_tolerance(y, w, problem.criterion, problem.n_classes)
        assert abs(splits.gain[i] - best) <= tol, (i, splits.gain[i], best)
        ranks = problem.feat_rank[problem.feat_ptr[i]:problem.feat_ptr[i + 1]]
        q = problem.feat_ptr[i] + int(np.flatnonzero(ranks == splits.rank[i])[0])
        f = problem.feat_local[q]
        assert splits.feature[i] == f and splits.is_categorical[i] == problem.is_cat[f]
        codes = problem.codes[rows, f]
        left = kernel_left(codes, splits, i)
        match = [c for c in per_feature[q - problem.feat_ptr[i]] if np.array_equal(c.left, left)]
        assert len(match) == 1, f"node {i}: the kernel's partition is not an admissible candidate"
        chosen = match[0]
        assert chosen.gain >= best - tol, f"node {i}: the kernel's split is not optimal"
        assert splits.missing_left[i] == chosen.missing_left and splits.bin[i] == chosen.bin, i
        expected_bits = (category_bits(chosen.categories) if chosen.categories is not None
                         else np.zeros(4, np.uint64))
        np.testing.assert_array_equal(splits.cat_bits[i], expected_bits)
    return n_split


def check_totals(problem: Problem, totals: np.ndarray) -> None:
    """Node statistics by a loop over samples: exact for class counts, to rounding for moments."""
    assert totals.shape == (len(problem.starts), problem.n_stats)
    for i in range(len(problem.starts)):
        _, w, y = problem.node(i)
        if problem.criterion == SQUARED_ERROR:
            expected = [np.sum(w), np.sum(w * y)]
            np.testing.assert_allclose(totals[i], expected, rtol=1e-13, atol=1e-12)  # summation order only
        else:
            np.testing.assert_array_equal(totals[i],
                                          np.bincount(y.astype(int), weights=w, minlength=problem.n_classes))


CASES = [(GINI, 2), (GINI, 3), (GINI, 5), (ENTROPY, 2), (ENTROPY, 4), (SQUARED_ERROR, 0)]


@pytest.mark.parametrize(("criterion", "n_classes"), CASES)
@pytest.mark.parametrize("min_leaf", [1.0, 4.0, 6.5])
def test_best_split_per_node_matches_brute_force(criterion: int, n_classes: int, min_leaf: float) -> None:
    problem = random_problem(100 * criterion + 10 * n_classes + int(min_leaf), criterion, n_classes, min_leaf)
    assert len(problem.feat_local) > 64  # several pairs per parallel chunk: scratch buffers are reused
    splits, totals = problem.run()
    check_totals(problem, totals)
    assert check_against_brute_force(problem, splits) >= 10


@pytest.mark.parametrize(("criterion", "n_classes"), [(GINI, 3), (ENTROPY, 2), (SQUARED_ERROR, 0)])
def test_min_leaf_zero_and_huge(criterion: int, n_classes: int) -> None:
    """min_samples_leaf 0 admits every non-trivial split; one larger than any node admits none."""
    problem = random_problem(7, criterion, n_classes, 0.0, sizes=(2, 3, 30, 120))
    splits, _ = problem.run()
    assert check_against_brute_force(problem, splits) == 4
    problem.min_leaf = 1000.0
    splits, _ = problem.run()
    assert np.all(splits.gain == -np.inf) and np.all(splits.rank == -1)
    assert check_against_brute_force(problem, splits) == 0


@pytest.mark.parametrize(("criterion", "n_classes"), [(GINI, 2), (ENTROPY, 2), (SQUARED_ERROR, 0), (GINI, 4)])
def test_category_search_never_beats_the_exhaustive_best(criterion: int, n_classes: int) -> None:
    """The regularised search (rare categories right, smoothed orders, a cap) never beats every subset's best.

    Without the regularisation Breiman's theorem made the best prefix the best subset (two classes or squared
    error); with it the kernel may give up gain for a split that generalises, never find more than exists.
    Columns of at most 8 categories (2^9 partitions).
    """
    problem = random_problem(31 + criterion, criterion, n_classes, 1.0, sizes=(2, 5, 9, 30, 80, 150))
    checked = 0
    for i in range(len(problem.starts)):
        rows, w, y = problem.node(i)
        for f in np.flatnonzero(problem.is_cat):
            codes = problem.codes[rows, f]
            if len(set(codes.tolist())) > 8:
                continue
            exhaustive = all_subset_gains(codes, y, w, criterion, n_classes)
            single = Problem(problem.codes, problem.is_cat, problem.order, problem.weight, problem.target,
                             problem.starts[i:i + 1], problem.ends[i:i + 1], np.array([0, 1], np.int64),
                             np.array([f], np.int32), np.array([0], np.int32), criterion, n_classes, 1.0)
            gain = single.run()[0].gain[0]
            if gain == -np.inf:
                continue
            assert gain <= max(exhaustive) + gain_tolerance(y, w, criterion, n_classes), (i, f)
            checked += 1
    assert checked >= 8


@pytest.mark.parametrize(("criterion", "n_classes"), [(GINI, 3), (ENTROPY, 2)])
def test_pure_nodes_tie_everywhere_and_keep_the_first_candidate(criterion: int, n_classes: int) -> None:
    """All rows one class: every split gains exactly 0.0, so the documented order decides alone.

    Pure terms are exact. The winner: first feature in rank order, its lowest threshold (or first category
    prefix), missing right.
    """
    problem = random_problem(55, criterion, n_classes, 1.0, sizes=(1, 2, 7, 60), constant_label=True)
    splits, _ = problem.run()
    for i in range(len(problem.starts)):
        rows, w, y = problem.node(i)
        candidates = []
        for q in range(problem.feat_ptr[i], problem.feat_ptr[i + 1]):
            f = problem.feat_local[q]
            enumerate_ = categorical_candidates if problem.is_cat[f] else numeric_candidates
            found = (enumerate_(problem.codes[rows, f], y, w, criterion, n_classes, 1.0) if len(rows) >= 2
                     else [])
            candidates += [(q, c) for c in found]
        if not candidates:
            assert splits.gain[i] == -np.inf
            continue
        q, first = candidates[0]
        assert splits.gain[i] == 0.0 and splits.rank[i] == problem.feat_rank[q]
        assert splits.feature[i] == problem.feat_local[q] and splits.bin[i] == first.bin
        assert splits.missing_left[i] == first.missing_left
        np.testing.assert_array_equal(kernel_left(problem.codes[rows, splits.feature[i]], splits, i),
                                      first.left)


def test_single_class_categories_keep_ascending_codes() -> None:
    """One class: every category's share is 1.0, a tie, so the order is ascending codes.

    The first candidate (all gains are exactly 0) is the prefix {63}, with missing to the heavier side
    (right). Weights of 5 give every category MIN_CATEGORY_ROWS rows. Unreachable through the estimators
    (check_label refuses single-class labels) and harmless there (gain 0 never splits), but the kernel reads
    outside its histogram.
    """
    splits, _ = one_node([[63, 64, 64, 127]], [0, 0, 0, 0], [5, 5, 5, 5], n_classes=1, is_cat=[True]).run()
    assert splits.gain[0] == 0.0 and not splits.missing_left[0]
    np.testing.assert_array_equal(splits.cat_bits[0], category_bits(frozenset({63})))


# -- documented details, on hand-made nodes ----------------------------------------------------------------


def one_node(columns: list[list[int]], y: list[float], w: list[int] | None = None, *, criterion: int = GINI,
             n_classes: int = 3, is_cat: list[bool] | None = None, ranks: list[int] | None = None,
             min_leaf: float = 1.0) -> Problem:
    """A single node holding every row once, with the given code columns as its candidate features."""
    codes = np.asfortranarray(np.array(columns, dtype=np.uint8).T)
    n, k = codes.shape
    return Problem(codes, np.array(is_cat or [False] * k), np.arange(n, dtype=np.int32),
                   np.array(w or [1] * n, np.int32), np.array(y, np.float64), np.array([0], np.int64),
                   np.array([n], np.int64), np.array([0, k], np.int64), np.arange(k, dtype=np.int32),
                   np.array(ranks or list(range(k)), np.int32), criterion, n_classes, min_leaf)


def test_equal_gains_keep_the_lowest_threshold() -> None:
    """Classes A B B A on bins 10 20 30 40.

    Cutting after 10 or after 30 both leave one pure child (the same gain to the bit); the lower threshold
    wins, written halfway between bins 10 and 20.
    """
    splits, _ = one_node([[10, 20, 30, 40]], [0, 1, 1, 0]).run()
    assert splits.gain[0] == 2.0 - (3.0 - 5.0 / 3.0)
    # no missing: the heavier child (3 rows) is right
    assert splits.bin[0] == 14 and not splits.missing_left[0]


def test_equal_gains_prefer_missing_right() -> None:
    """Classes 0 | 1 | missing=2.

    (0 | 1,2), (0,2 | 1) and (0,1 | 2) all gain exactly 1.0; the first in scan order (cut after bin 5, missing
    right) wins.
    """
    splits, _ = one_node([[5, 9, MISSING]], [0, 1, 2]).run()
    assert splits.gain[0] == 1.0 and splits.bin[0] == (5 + 9 - 1) // 2 and not splits.missing_left[0]


def test_missing_alone_on_one_side_is_written_as_all_values_left() -> None:
    """Values all class 0 and missing all class 1.

    The only pure split is values | missing, reported as bin 254 with missing right (so any non-missing value,
    even an unseen bin, goes left).
    """
    splits, _ = one_node([[5, 9, 9, MISSING, MISSING]], [0, 0, 0, 1, 1]).run()
    assert splits.bin[0] == ALL_VALUES_LEFT and not splits.missing_left[0] and splits.gain[0] > 0
    splits, _ = one_node([[5, 9, 9, MISSING, MISSING]], [0, 0, 0, 1, 1], [5] * 5, is_cat=[True]).run()
    assert splits.bin[0] == -1 and not splits.missing_left[0] and splits.gain[0] > 0
    np.testing.assert_array_equal(splits.cat_bits[0], category_bits(frozenset({5, 9})))


@pytest.mark.parametrize(("w", "expected"), [([3, 1], True), ([1, 3], False), ([2, 2], True)])
def test_without_missing_values_missing_goes_to_the_heavier_child(w: list[int], expected: bool) -> None:
    """Bin 1 (class 0) | bin 2 (class 1) with the given weights.

    Missing values, unseen in the node, follow the heavier child, the left one on equal weights. (Categorical:
    the left set is {2} here, as category 2 comes first by class 0 share, so the heavier child is the other
    one.)
    """
    splits, _ = one_node([[1, 2]], [0, 1], w).run()
    assert splits.bin[0] == 1 and splits.missing_left[0] == expected
    splits, _ = one_node([[1, 2]], [0, 1], [5 * weight for weight in w], is_cat=[True]).run()  # 5+ rows each
    assert int(splits.cat_bits[0, 0]) == 1 << 2 and splits.missing_left[0] == (w[1] >= w[0])


def test_identical_features_tie_by_rank_not_by_column() -> None:
    """Three copies of one column (the same gains to the bit).

    The lowest rank wins, wherever the column sits locally and however ranks are spaced.
    """
    col = [0, 3, 3, 7, MISSING, 9]
    y = [0, 0, 1, 1, 2, 2]
    problem = one_node([col, col, col], y, ranks=[4, 11, 12])
    problem.feat_local = np.array([2, 0, 1], np.int32)
    splits, _ = problem.run()
    assert splits.rank[0] == 4 and splits.feature[0] == 2


def test_a_strictly_better_later_feature_wins() -> None:
    splits, _ = one_node([[0, 0, 1, 1], [0, 1, 0, 1]], [0, 1, 0, 1], ranks=[0, 5]).run()
    assert splits.rank[0] == 5 and splits.feature[0] == 1 and splits.gain[0] == 2.0


@pytest.mark.parametrize(("min_leaf", "splits_"), [(2.0, True), (2.5, False)])
def test_min_leaf_is_a_weight_bound_on_both_children(min_leaf: float, splits_: bool) -> None:
    """Bin 0 holds one row of weight 2: the only split leaves a child of weight exactly 2."""
    splits, _ = one_node([[0, 1, 1]], [0, 1, 1], [2, 1, 3], min_leaf=min_leaf).run()
    assert np.isfinite(splits.gain[0]) == splits_


def test_nodes_of_fewer_than_two_rows_never_split() -> None:
    """A single distinct row cannot split, however heavy (bootstrap weight 9).

    An empty node has zero statistics and no split either.
    """
    problem = random_problem(3, GINI, 2, 0.0, sizes=(1, 0, 1))
    problem.weight[:] = 9
    splits, totals = problem.run()
    assert np.all(splits.gain == -np.inf) and np.all(splits.feature == -1)
    np.testing.assert_array_equal(totals.sum(axis=1), [9.0, 0.0, 9.0])


def test_constant_or_all_missing_feature_has_no_split() -> None:
    splits, _ = one_node([[4, 4, 4], [MISSING] * 3], [0, 1, 2], is_cat=[False, True]).run()
    assert splits.gain[0] == -np.inf


def test_no_nodes_and_nodes_without_candidates() -> None:
    problem = random_problem(4, GINI, 2, 1.0, sizes=(5, 6))
    problem.feat_ptr = np.zeros(3, np.int64)
    problem.feat_local = problem.feat_rank = np.zeros(0, np.int32)
    splits, totals = problem.run()
    assert np.all(splits.gain == -np.inf) and totals.shape == (2, 2)
    empty = random_problem(4, GINI, 2, 1.0, sizes=())
    splits, totals = empty.run()
    assert len(splits.gain) == 0 and totals.shape == (0, 2)


def test_categories_in_every_bitset_word() -> None:
    """Categories 1, 64, 130, 254 with classes 0, 1, 0, 1, five (weighted) rows each.

    The left set is {1, 130} or {64, 254}, bits in words 0 and 2 or 1 and 3.
    """
    splits, _ = one_node([[1, 64, 130, 254]], [0, 1, 0, 1], [5] * 4, n_classes=2, is_cat=[True]).run()
    bits = [int(b) for b in splits.cat_bits[0]]
    assert bits in ([1 << 1, 0, 1 << 2, 0], [0, 1, 0, 1 << 62]) and splits.gain[0] == 10.0  # 5 rows each


def test_node_statistics_by_loop() -> None:
    for criterion, n_classes in CASES:
        problem = random_problem(9, criterion, n_classes, 1.0)
        totals = node_statistics(problem.target, problem.weight, problem.starts, problem.ends,
                                 problem.n_stats, criterion)
        check_totals(problem, totals)


# -- histogram entry point (the Paillier label holder) ----------------------------------------------------


def histograms_of(problem: Problem, rng: np.random.Generator, empty_bins: bool) -> tuple[np.ndarray, ...]:
    """Per (node, feature) pair the CSR histogram a passive party's sums decrypt to.

    Its bins in shuffled order, optionally with zero-weight bins mixed in (as subtraction of sibling
    histograms leaves).
    """
    ptr, bins, stats = [0], [], []
    for i in range(len(problem.starts)):
        rows, w, y = problem.node(i)
        for q in range(problem.feat_ptr[i], problem.feat_ptr[i + 1]):
            if len(rows) < 2:
                ptr.append(ptr[-1])  # the passive party skips such pairs
                continue
            codes = problem.codes[rows, problem.feat_local[q]]
            present = np.unique(codes)
            extra = np.setdiff1d(rng.choice(256, 5), present) if empty_bins else np.zeros(0, np.int64)
            pair_bins = rng.permutation(np.concatenate([present, extra]))
            for b in pair_bins:
                m = codes == b
                if problem.criterion == SQUARED_ERROR:
                    stats.append([np.sum(w[m]), np.sum(w[m] * y[m])])
                else:
                    stats.append(np.bincount(y[m].astype(int), weights=w[m], minlength=problem.n_classes))
            bins.extend(pair_bins.tolist())
            ptr.append(ptr[-1] + len(pair_bins))
    return (np.array(ptr, np.int64), np.array(bins, np.uint8),
            np.array(stats, np.float64).reshape(len(bins), problem.n_stats))


@pytest.mark.parametrize(("criterion", "n_classes"), CASES)
@pytest.mark.parametrize("empty_bins", [False, True])
def test_histogram_entry_point_is_identical_to_the_plain_kernel(criterion: int, n_classes: int,
                                                                 empty_bins: bool) -> None:
    """best_splits_from_histograms on the same statistics returns bit-identical splits.

    Regression targets are multiples of 1/8 here so every histogram sum is exact whatever the summation order.
    """
    problem = random_problem(17 * criterion + n_classes, criterion, n_classes, 2.0)
    if criterion == SQUARED_ERROR:
        problem.target = np.round(problem.target * 8) / 8
    rng = np.random.default_rng(5)
    plain, totals = problem.run()
    ptr, bins, stats = histograms_of(problem, rng, empty_bins)
    pair_node = np.repeat(np.arange(len(problem.starts)), np.diff(problem.feat_ptr))
    got = best_splits_from_histograms(ptr, bins, stats, pair_node, problem.is_cat[problem.feat_local], totals,
                                      (problem.ends - problem.starts).astype(np.int64), problem.feat_ptr,
                                      problem.feat_local, problem.feat_rank, criterion, 2.0, problem.n_stats)
    for name in ("gain", "rank", "feature", "bin", "missing_left", "is_categorical", "cat_bits"):
        np.testing.assert_array_equal(getattr(got, name), getattr(plain, name), err_msg=name)
    assert np.isfinite(plain.gain).sum() >= 10


def test_histogram_entry_point_skips_nodes_of_one_row() -> None:
    """node_rows < 2 means no split even when a (non-empty) histogram is supplied."""
    problem = one_node([[0, 1, 2, 3]], [0, 1, 0, 1], n_classes=2)
    ptr, bins, stats = histograms_of(problem, np.random.default_rng(0), False)
    args = (ptr, bins, stats, np.zeros(1, np.int64), np.zeros(1, bool), stats.sum(axis=0)[None])
    rest = (problem.feat_ptr, problem.feat_local, problem.feat_rank, GINI, 1.0, 2)
    assert np.isfinite(best_splits_from_histograms(*args, np.array([4]), *rest).gain[0])
    assert best_splits_from_histograms(*args, np.array([1]), *rest).gain[0] == -np.inf


def _block_of(problem: Problem, low: int, high: int) -> tuple[np.ndarray, ...]:
    """(order, weight, target, starts, ends) of the samples of rows [low, high), node by node."""
    keep = (problem.order >= low) & (problem.order < high)
    sizes = [int(keep[s:e].sum()) for s, e in zip(problem.starts, problem.ends, strict=True)]
    ends = np.cumsum(sizes).astype(np.int64)
    return (problem.order[keep], problem.weight[keep], problem.target[keep], ends - np.asarray(sizes), ends)


@pytest.mark.parametrize(("criterion", "n_classes"), [(GINI, 2), (GINI, 4), (ENTROPY, 3), (SQUARED_ERROR, 0),
                                                     (GRADIENT, 0)])
@pytest.mark.parametrize("cuts", [[], [150], [1, 77, 78, 200, 299]])
def test_block_histograms_summed_then_scanned_are_the_plain_kernel(criterion: int, n_classes: int,
                                                                   cuts: list[int]) -> None:
    """Rows cut into blocks: their histograms, added in any order and scanned, are the plain kernel's.

    Bit-identical splits and node totals to the fused in-process kernel (the Dask vertical path): int64
    class counts, squared error's float64 (w, wy) over targets on their grid (`fixed_targets`), and
    boosting's float64 (count, G, H) over a round's (g, h) on its grid (`GradientGrid`), every row weight 1.
    """
    problem = random_problem(3 * criterion + n_classes, min(criterion, SQUARED_ERROR), n_classes, 2.0)
    dtype = np.int64 if criterion in (GINI, ENTROPY) else np.float64
    if criterion == SQUARED_ERROR:
        problem.target = fixed_targets(problem.target * 1e6)
    if criterion == GRADIENT:
        gh = np.random.default_rng(8).normal(0.0, 1e3, (1, len(problem.order), 2))
        gh[..., 1] = np.abs(gh[..., 1])
        grid, q = GradientGrid.of(gh, len(problem.order))
        problem.criterion, problem.target = GRADIENT, grid.values(q)[0]
        problem.weight = np.ones(len(problem.order), np.int32)
    plain, totals = problem.run()
    edges = [0, *cuts, 300]
    parts, block_totals, node_rows = [], np.zeros_like(totals, dtype=dtype), 0
    for low, high in zip(edges[:-1], edges[1:], strict=True):
        order, weight, target, starts, ends = _block_of(problem, low, high)
        parts.append(block_histograms(problem.codes, target, order, weight, starts, ends, problem.feat_ptr,
                                      problem.feat_local, problem.n_stats, criterion))
        assert parts[-1][2].dtype == dtype
        block_totals += node_statistics(target, weight, starts, ends, problem.n_stats,
                                        criterion).astype(dtype)
        node_rows = node_rows + (ends - starts)
    order = np.random.default_rng(len(cuts)).permutation(len(parts))
    ptr, bins, stats = sum_histograms([parts[i] for i in order], len(problem.feat_local))
    np.testing.assert_array_equal(block_totals.astype(np.float64), totals)
    pair_node = np.repeat(np.arange(len(problem.starts)), np.diff(problem.feat_ptr))
    got = best_splits_from_histograms(ptr, bins, stats.astype(np.float64), pair_node,
                                      problem.is_cat[problem.feat_local], block_totals.astype(np.float64),
                                      node_rows, problem.feat_ptr, problem.feat_local, problem.feat_rank,
                                      criterion, 2.0, problem.n_stats)
    for name in ("gain", "rank", "feature", "bin", "missing_left", "is_categorical", "cat_bits"):
        np.testing.assert_array_equal(getattr(got, name), getattr(plain, name), err_msg=name)
    assert np.isfinite(plain.gain).sum() >= 10
