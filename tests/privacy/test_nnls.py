"""The compiled NNLS behind LDP count estimation.

Exact (against Lawson-Hanson and scipy), and the answer for a row never depends on which other rows share the
call, their order, or the number of threads.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import nnls as scipy_nnls

from fedcore.privacy.ldp import SUM_WEIGHT, LabelLDP
from fedcore.privacy.nnls import SharedNNLS, lawson_hanson
from fedcore.randomness import counter_key
from tests.privacy.reports import instant_bits

EPS = np.finfo(np.float64).eps


def tolerance(matrix: np.ndarray, target: np.ndarray) -> float:
    """Both solvers are backward stable on a strictly convex problem.

    Their solutions differ by at most a modest multiple of cond(A) * eps * (|y| / sigma_min), the forward
    error of a least-squares solve.
    """
    singular = np.linalg.svd(matrix, compute_uv=False)
    return 1e3 * EPS * (singular[0] / singular[-1]) * max(1.0, float(np.linalg.norm(target)) / singular[-1])


def ldp_design(n_classes: int, n_bits: int = 32) -> np.ndarray:
    # 32 bits: the worst-conditioned designs
    bits = LabelLDP(mechanism="bloom", n_bits=n_bits).report_probabilities(n_classes).T
    return np.vstack([bits, np.full((1, n_classes), SUM_WEIGHT)])


@st.composite
def problems(draw) -> tuple[np.ndarray, np.ndarray]:
    """A full-column-rank design and 1..16 targets, some of them near-ties.

    The design is random, or an LDP design of 2..26 classes; near-ties are y = A x* with x* on the boundary of
    x >= 0, nudged by 1e-12.
    """
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if draw(st.booleans()):
        n = draw(st.integers(1, 12))
        matrix = rng.normal(size=(n + draw(st.integers(0, 10)), n))
    else:
        matrix = ldp_design(draw(st.integers(2, 26)))
    m, n = matrix.shape
    g = draw(st.integers(1, 16))
    truth = np.where(rng.random((g, n)) < 0.5, 0.0, rng.random((g, n)))
    targets = truth @ matrix.T + rng.normal(size=(g, m)) * rng.choice([0.0, 1e-12, 1e-3, 0.3], size=(g, 1))
    return matrix, targets


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_batched_rows_equal_alone_and_the_oracle(problem: tuple[np.ndarray, np.ndarray]) -> None:
    matrix, targets = problem
    solver = SharedNNLS(matrix)
    batched = solver.solve(targets)
    assert batched.shape == (targets.shape[0], matrix.shape[1]) and (batched >= 0).all()
    for row, target in enumerate(targets):
        alone = solver.solve(target[None, :])[0]
        np.testing.assert_array_equal(alone, batched[row])  # bit for bit: no neighbour effect
        tol = tolerance(matrix, target)
        np.testing.assert_allclose(batched[row], lawson_hanson(matrix, target), rtol=0, atol=tol)
        reference = scipy_nnls(matrix, target, maxiter=50 * matrix.shape[1])[0]
        np.testing.assert_allclose(batched[row], reference, rtol=0, atol=tol)
        # the support decides: the objective must match to rounding, a far tighter test than on x
        objective = float(np.sum((matrix @ batched[row] - target) ** 2))
        best = float(np.sum((matrix @ reference - target) ** 2))
        assert objective <= best * (1 + 1e-9) + 1e3 * EPS * max(1.0, float(target @ target))
    reversed_order = solver.solve(targets[::-1])[::-1]
    np.testing.assert_array_equal(reversed_order, batched)


def test_allowed_rows_equal_alone() -> None:
    """The Lasso's refit path (a support per row) is row-local too."""
    rng = np.random.default_rng(8)
    matrix = ldp_design(20)
    targets = rng.random((300, 20)) @ matrix.T / 10
    allowed = rng.random((300, 20)) < 0.4
    solver = SharedNNLS(matrix)
    batched = solver.solve(targets, allowed=allowed)
    for row in range(0, 300, 7):
        np.testing.assert_array_equal(solver.solve(targets[row:row + 1], allowed=allowed[row:row + 1])[0],
                                      batched[row])
    with pytest.raises(ValueError, match=r"allowed must have shape \(300, 20\) and offset \(20,\)"):
        solver.solve(targets, allowed=allowed[:1])


def test_allowed_columns_and_offset() -> None:
    rng = np.random.default_rng(3)
    matrix = rng.normal(size=(9, 5))
    targets = rng.normal(size=(20, 9))
    allowed = rng.random((20, 5)) < 0.6
    solver = SharedNNLS(matrix)
    out = solver.solve(targets, allowed=allowed)
    assert (out[~allowed] == 0).all()
    for row in range(20):
        columns = np.flatnonzero(allowed[row])
        expected = np.zeros(5)
        if columns.size:
            expected[columns] = lawson_hanson(matrix[:, columns], targets[row])
        np.testing.assert_allclose(out[row], expected, atol=tolerance(matrix, targets[row]))
    # an offset z on the reduced target is the target shift Q z
    z = rng.normal(size=5)
    np.testing.assert_allclose(solver.solve(targets, offset=z),
                               solver.solve(targets + z @ solver.q.T), atol=1e-12)


def test_many_classes_estimate_a_large_group() -> None:
    """26 classes on the Bloom filter sized for them (64 bits).

    A 20,000-sample group is estimated within 5 standard errors per class, and those are under 2% of the group
    (on 32 bits they would be 3.5%).
    """
    ldp = LabelLDP(mechanism="bloom").sized_for(26)
    assert ldp.n_bits == 64
    counts = np.random.default_rng(4).multinomial(20000, np.random.default_rng(5).dirichlet(np.ones(26)))
    labels = np.repeat(np.arange(26), counts)
    reports = instant_bits(ldp, ldp.permanent_bits(labels, 26, counter_key(6, "ldp_permanent")),
                               counter_key(6, "ldp_instant"))
    estimate = ldp.estimate_counts(reports.sum(axis=0), np.array(labels.size), 26)
    assert (estimate >= 0).all() and estimate.sum() == pytest.approx(20000, rel=1e-5)
    # the unconstrained estimator's standard error per class (bits independent, variance <= 1/4 per report):
    # the constrained estimate is no further from the truth than 5 of them
    design = ldp_design(26, 64)
    pseudo = np.linalg.pinv(design)[:, :-1]
    standard_error = 20000 * np.sqrt(0.25 / 20000 * (pseudo**2).sum(axis=1))
    assert (np.abs(estimate - counts) <= 5 * standard_error).all()
    assert standard_error.max() < 0.02 * 20000  # and that is a useful estimate


def test_estimates_do_not_depend_on_the_thread_count() -> None:
    """The same groups estimated with one thread and with every thread give the same bits."""
    import numba

    rng = np.random.default_rng(7)
    sizes = rng.integers(0, 60, size=3000)
    bit_sums = rng.binomial(sizes[:, None], rng.uniform(0.3, 0.7, size=(3000, 32)))
    ldp = LabelLDP(mechanism="bloom", n_bits=32)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = ldp.estimate_counts(bit_sums, sizes, 26)
    finally:
        numba.set_num_threads(threads)
    np.testing.assert_array_equal(one, ldp.estimate_counts(bit_sums, sizes, 26))
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one CPU: the multi-threaded side of the comparison ran on one thread too")
