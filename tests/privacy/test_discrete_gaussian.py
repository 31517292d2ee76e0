"""The discrete Gaussian sampler, the law of sums of its draws, and the distributed plan's accounting.

`fedcore.privacy.discrete_gaussian` and `fedcore.privacy.distributed`.
"""

from __future__ import annotations

import bisect
import itertools
import math

import numpy as np
import pytest

from fedcore.privacy.discrete_gaussian import GUIDE_BITS, RESOLUTION_BITS, _outcomes, sum_pmf, table
from fedcore.privacy.distributed import (
    DISCRETIZATION,
    DistributedPlan,
    _shifted_pld,
    distributed_epsilon,
    round_up,
)
from fedcore.randomness import counter_key


def test_the_table_is_an_exact_symmetric_law_in_whole_2_to_the_minus_64ths() -> None:
    sampler = table(3.7)
    widths = sampler.widths
    assert sum(widths) == 2 ** RESOLUTION_BITS and widths == widths[::-1]
    assert all(w > 0 for w in widths) and len(widths) == 2 * sampler.reach + 1
    # the ideal discrete Gaussian (normalised over the integers) to 2^-63, within float64's rounding
    x = np.arange(-sampler.reach, sampler.reach + 1)
    ideal = np.exp(-x * x / (2 * 3.7 ** 2))
    total = sum(math.exp(-k * k / (2 * 3.7 ** 2)) for k in range(-200, 201))
    np.testing.assert_allclose(sampler.pmf(), ideal / total, rtol=1e-12, atol=2.0 ** -63)
    assert math.exp(-(sampler.reach + 1) ** 2 / (2 * 3.7 ** 2)) / total < 2.0 ** -64  # nothing left beyond


def test_a_draw_is_the_philox_words_looked_up_in_the_cumulative_widths() -> None:
    sampler = table(2.5)
    key = counter_key(7, "secagg_dp_noise", 3)
    draws = sampler.draw(key, 1000)
    words = np.random.Philox(key=key).random_raw(1000)
    cumulative = list(itertools.accumulate(sampler.widths))
    expected = np.array([bisect.bisect_right(cumulative, int(w)) for w in words]) - sampler.reach
    np.testing.assert_array_equal(draws, expected)
    np.testing.assert_array_equal(sampler.draw(key, 1000), draws)  # the same key, the same noise
    many = table(40.0).draw(counter_key(1, "secagg_dp_noise", 0), 200_000)
    assert abs(many.mean()) < 0.5 and abs(many.std() / 40.0 - 1) < 0.01


@pytest.mark.parametrize("sigma", [2.5, 129.0])
def test_the_guide_table_places_every_edge_word_as_the_binary_search_does(sigma: float) -> None:
    sampler = table(sigma)
    cumulative = np.array(list(itertools.accumulate(sampler.widths[:-1])), dtype=np.uint64)
    one = np.uint64(1)
    buckets = np.arange(1 << GUIDE_BITS, dtype=np.uint64) << np.uint64(64 - GUIDE_BITS)
    edges = np.concatenate([cumulative - one, cumulative, cumulative + one, buckets, buckets - one,
                            np.array([0, 2 ** 64 - 1], dtype=np.uint64)])
    expected = np.array([bisect.bisect_right(cumulative.tolist(), int(w)) for w in edges])
    np.testing.assert_array_equal(_outcomes(sampler.widths, edges), expected)


def test_the_law_of_a_sum_is_the_convolution_of_the_table() -> None:
    first, one = sum_pmf(1.5, 1)
    law = one
    for _ in range(3):
        law = np.convolve(law, one)
    start, four = sum_pmf(1.5, 4)
    exact = law[start - 4 * first: start - 4 * first + len(four)]
    assert abs(four.sum() - 1) < 1e-9
    np.testing.assert_allclose(four, exact, atol=1e-15)


def test_one_draw_is_accounted_as_dp_accountings_own_discrete_gaussian() -> None:
    from dp_accounting.pld import privacy_loss_distribution

    mine = distributed_epsilon(5.0, 5.0, 0, 1, 1e-6)  # the noisy count alone
    theirs = privacy_loss_distribution.from_discrete_gaussian_mechanism(5.0).get_epsilon_for_delta(1e-6)
    assert mine == pytest.approx(theirs, abs=2e-3)


@pytest.mark.parametrize(("sigma", "draws", "dense"), [(3.0, 1, False), (5.0, 4, False), (40.0, 200, True)])
def test_the_array_built_distribution_is_dp_accountings_own(sigma: float, draws: int, dense: bool) -> None:
    """`_shifted_pld` accounts as dp-accounting's `from_two_probability_mass_functions`, sparse and dense.

    It builds the library's PMF objects itself (the dense one by its constructor's positional arguments,
    past the library's sparse limit: 40.0 x 200 draws has about 8,400 losses): raise the dp-accounting pin
    only with this test passing. Losses are rounded up to whole intervals, by log(u) - log(l) here and
    log(u / l) there, so an outcome on an interval's edge may land one interval apart: epsilon agrees within
    one interval, delta to float rounding.
    """
    from dp_accounting.pld import pld_pmf, privacy_loss_distribution

    first, law = sum_pmf(sigma, draws)
    mine = _shifted_pld(first, law, draws)
    lower = {first + j: math.log(v) for j, v in enumerate(law) if v > 0}
    upper = {first + draws + j: math.log(v) for j, v in enumerate(law) if v > 0}
    theirs = privacy_loss_distribution.from_two_probability_mass_functions(
        lower, upper, pessimistic_estimate=True, value_discretization_interval=DISCRETIZATION,
        symmetric=False)
    assert isinstance(mine._pmf_remove, pld_pmf.DensePLDPmf if dense else pld_pmf.SparsePLDPmf)
    for delta in (1e-3, 1e-6, 1e-9):
        assert mine.get_epsilon_for_delta(delta) == pytest.approx(theirs.get_epsilon_for_delta(delta),
                                                                   abs=DISCRETIZATION)
    for epsilon in (0.1, 1.0):
        assert mine.get_delta_for_epsilon(epsilon) == pytest.approx(theirs.get_delta_for_epsilon(epsilon),
                                                                     rel=1e-6)


def test_a_plan_spends_at_most_its_budget_and_the_coalition_sees_more() -> None:
    plan = DistributedPlan(epsilon=1.0, delta=1e-6, releases=8, k=3, parties=3)
    summary = plan.summary()
    assert 0.99 < summary["epsilon_total"] <= 1.0  # the calibration ends within 1% of the budget
    assert summary["epsilon_coalition"] > 1.5  # 1/3 of the variance left
    assert plan.count_sigma == round_up(plan.sigma * math.sqrt(3)) and plan.sigma == round_up(plan.sigma)
    assert plan.epsilon_after(0) < plan.epsilon_after(4) < plan.epsilon_after(8)
    fewer = DistributedPlan(epsilon=1.0, delta=1e-6, releases=8, k=3, parties=6)
    assert fewer.sigma < plan.sigma  # more parties: a smaller share each
