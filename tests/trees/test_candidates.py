"""The horizontal master's compiled split choice (`best_candidates`) against its NumPy definitions.

The definitions it replaced: the same winner and branch sizes, bit for bit, on exact counts, noisy counts
(where the order of the class sums matters: NumPy's pairwise order from 8 classes on) and regression
statistics.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.trees.candidates import CRITERION_CODES, best_candidates, best_of_counts, summed_counts


def class_term(counts: np.ndarray, criterion: str) -> np.ndarray:
    """Impurity of class-count vectors times their totals, by definition (gini, or entropy in bits)."""
    n = counts.sum(axis=-1)
    safe = np.where(n > 0, n, 1.0)
    if criterion == "gini":
        return np.where(n > 0, n - (counts * counts).sum(axis=-1) / safe, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(counts > 0, counts * np.log2(np.where(counts > 0, counts, 1.0)), 0.0)
    return np.where(n > 0, n * np.log2(safe) - plogp.sum(axis=-1), 0.0)


def reference(branch: np.ndarray, sizes: np.ndarray | None, valid: np.ndarray, criterion: str,
              min_leaf: float) -> tuple[np.ndarray, np.ndarray]:
    """The NumPy split choice: gains of every candidate, usable ones, first best (-1: none)."""
    left, right = branch[..., 0, :], branch[..., 1, :]
    if criterion == "squared_error":
        nl, nr = np.maximum(left[..., 0], 0.0), np.maximum(right[..., 0], 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            gain = nl * nr / (nl + nr) * (left[..., 1] / nl - right[..., 1] / nr) ** 2
        gain = np.where((nl > 0) & (nr > 0), gain, 0.0)
        branch_n = np.stack([nl, nr], axis=-1)
    else:
        left, right = np.maximum(left, 0.0), np.maximum(right, 0.0)
        gain = (class_term(left + right, criterion) - class_term(left, criterion)
                - class_term(right, criterion))
        branch_n = np.stack([left.sum(axis=-1), right.sum(axis=-1)], axis=-1)
    if sizes is not None:
        branch_n = sizes.astype(np.float64)
    n_left, n_right = branch_n[..., 0], branch_n[..., 1]
    usable = (valid & (n_left >= min_leaf) & (n_right >= min_leaf)
              & (gain > 1e-12 * np.maximum(n_left + n_right, 1.0)))
    best = np.argmax(np.where(usable, gain, -np.inf), axis=1)
    return np.where(usable.any(axis=1), best, -1), branch_n


def run(branch, sizes, valid, criterion, min_leaf):
    has_sizes = sizes is not None
    return best_candidates(branch, np.zeros((0, 0, 2)) if sizes is None else sizes.astype(np.float64), valid,
                           CRITERION_CODES[criterion], float(min_leaf), has_sizes)


@pytest.mark.parametrize("criterion", ["gini", "entropy"])
@pytest.mark.parametrize("n_classes", [2, 3, 7, 8, 9, 26, 40, 129, 300])
@pytest.mark.parametrize("noisy", [False, True])
def test_classification_choice_matches_the_numpy_definition(criterion: str, n_classes: int,
                                                            noisy: bool) -> None:
    rng = np.random.default_rng(n_classes * 7 + noisy)
    shape = (300, 5, 2, n_classes)
    branch = rng.integers(0, 6, shape).astype(np.float64) * (rng.random(shape) < 0.5)
    if noisy:  # Laplace-noised counts: fractional and negative, sums depend on their order
        branch = branch + rng.laplace(scale=2.0, size=shape)
    branch[0] = 0.0  # an empty node
    branch[1, :, :, 1:] = 0.0  # a pure node: no candidate gains
    branch[2, :] = branch[2, 0]  # equal candidates: the first wins
    valid = rng.random(shape[:2]) < 0.9
    for min_leaf in (1, 3):
        best, branch_n = run(branch, None, valid, criterion, min_leaf)
        want_best, want_n = reference(branch, None, valid, criterion, min_leaf)
        assert best[1] == -1 and best[0] == -1
        if criterion == "gini":  # libm and NumPy log2 may differ in the last bit: entropy compares decisions
            np.testing.assert_array_equal(branch_n, want_n)
        np.testing.assert_array_equal(best, want_best)
        assert (best >= 0).sum() > 100  # the case is not vacuous


def test_exact_branch_sizes_decide_when_given() -> None:
    rng = np.random.default_rng(3)
    branch = rng.normal(2.0, 1.0, (200, 4, 2, 26))  # estimated counts (LDP)
    sizes = rng.integers(0, 8, (200, 4, 2))
    valid = np.ones((200, 4), bool)
    best, branch_n = run(branch, sizes, valid, "gini", 4)
    want_best, want_n = reference(branch, sizes, valid, "gini", 4)
    np.testing.assert_array_equal(branch_n, sizes)
    np.testing.assert_array_equal(best, want_best)
    chosen = best >= 0
    assert np.all(sizes[chosen, best[chosen]].min(axis=-1) >= 4)


def test_regression_choice_matches_the_numpy_definition() -> None:
    rng = np.random.default_rng(5)
    n = rng.integers(0, 20, (400, 6, 2)).astype(np.float64)
    branch = np.stack([n, n * rng.normal(0, 3, n.shape) + rng.normal(0, 1, n.shape)], axis=-1)
    branch[7, :, :, 1] = 2.5 * branch[7, :, :, 0]  # one target value: every gain is 0
    valid = rng.random((400, 6)) < 0.95
    best, branch_n = run(branch, None, valid, "squared_error", 2)
    want_best, want_n = reference(branch, None, valid, "squared_error", 2)
    np.testing.assert_array_equal(branch_n, want_n)
    np.testing.assert_array_equal(best, want_best)
    assert best[7] == -1 and (best >= 0).sum() > 200


@pytest.mark.parametrize("n_parties", [1, 3, 4, 5, 9])
@pytest.mark.parametrize("criterion", ["gini", "entropy", "squared_error"])
def test_counts_read_part_by_part_choose_as_their_float64_sum(n_parties: int, criterion: str) -> None:
    """`best_of_counts` on each party's integer counts: the winners and sizes of `best_candidates` on the sum.

    Each party sends its own narrowest type (one read-only, as received); large values (regression sums) stay
    exact; more than four parties are added up before the kernel reads them.
    """
    rng = np.random.default_rng(n_parties)
    high = 2**40 if criterion == "squared_error" else 7
    shape = (250, 4, 2, 2 if criterion == "squared_error" else 26)
    dtypes = [np.uint8, np.uint16, np.int64, np.uint32, np.uint64]
    parts = [rng.integers(0, high, shape).astype(np.int64 if high > 255 else dtypes[i % 5])
             * (rng.random(shape) < 0.6) for i in range(n_parties)]
    parts[0].flags.writeable = False
    total = sum(part.astype(np.float64) for part in parts)
    valid = rng.random(shape[:2]) < 0.9
    for min_leaf in (1, 3):
        best, branch_n = best_of_counts(parts, valid, CRITERION_CODES[criterion], min_leaf)
        want_best, want_n = run(total, None, valid, criterion, min_leaf)
        np.testing.assert_array_equal(best, want_best)
        np.testing.assert_array_equal(branch_n, want_n)
        assert (best >= 0).sum() > 100  # the case is not vacuous
    chosen = np.flatnonzero(best >= 0)
    np.testing.assert_array_equal(summed_counts(parts, chosen, best[chosen]), total[chosen, best[chosen]])
    np.testing.assert_array_equal(summed_counts(parts, slice(None), 0), total[:, 0])


def test_one_compiled_kernel_reads_every_contributors_type() -> None:
    """One compiled signature chooses from every contributor's type (no compile per party dtype).

    Each party's counts in the narrowest type it sent, signed ones too (regression's narrowed sums), one not
    in native byte order, and the noisy float64 sums.
    """
    from fedcore.horizontal.rows import narrow
    from fedcore.trees.candidates import _choose

    rng = np.random.default_rng(11)
    shape = (300, 4, 2, 2)
    for scale in (5, 200, 40_000, 2**40):  # narrowed to 8, 16, 32 and 64 bits, signed (negative sums)
        n = rng.integers(0, 9, shape[:3])
        parts = [np.stack([n, rng.integers(-scale, scale, shape[:3]) * (n > 0)], axis=-1) for _ in range(3)]
        narrowed = [narrow(part) for part in parts]
        assert {p.dtype.kind for p in narrowed} == {"i"} and narrowed[0].dtype.itemsize == {
            5: 1, 200: 2, 40_000: 4, 2**40: 8}[scale]
        narrowed[1] = narrowed[1].astype(narrowed[1].dtype.newbyteorder(">"))  # not native: read as its value
        total = sum(part.astype(np.float64) for part in parts)
        valid = rng.random(shape[:2]) < 0.9
        best, branch_n = best_of_counts(narrowed, valid, CRITERION_CODES["squared_error"], 1)
        want_best, want_n = run(total, None, valid, "squared_error", 1)
        np.testing.assert_array_equal(best, want_best)
        np.testing.assert_array_equal(branch_n, want_n)
        assert (best >= 0).sum() > 100
    best_of_counts([np.ones((2, 3, 2, 4), np.uint64)], np.ones((2, 3), bool), CRITERION_CODES["gini"], 1)
    assert len(_choose.signatures) == 1


def test_statistics_that_do_not_fit_are_refused() -> None:
    valid = np.ones((5, 3), bool)
    with pytest.raises(ValueError, match=r"^contributors' statistics differ in shape: \(5, 3, 2, 4\) and "
                                         r"\(5, 3, 2, 3\)$"):
        best_of_counts([np.ones((5, 3, 2, 3), np.uint8), np.ones((5, 3, 2, 4), np.uint8)], valid, 0, 1)
    with pytest.raises(ValueError, match=r"^statistics of shape \(5, 2, 2, 3\) with validity \(5, 3\) and "
                                         r"sizes \(0, 0, 2\)$"):
        best_of_counts([np.ones((5, 2, 2, 3), np.uint8)], valid, 0, 1)
    with pytest.raises(ValueError, match=r"^statistics of type bool cannot be read \(integers or float64\)$"):
        best_of_counts([np.ones((5, 3, 2, 3), bool)], valid, 0, 1)
