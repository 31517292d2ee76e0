"""The model budget's accountant (issue #31): calibration and totals from dp-accounting's PLD accountant."""

from __future__ import annotations

import math

import pytest
from dp_accounting import dp_event, pld

from fedcore.errors import ParameterError
from fedcore.privacy.accounting import (
    DISCRETIZATION,
    GaussianPlan,
    PrivacyLedger,
    check_delta,
    gaussian_epsilon,
    gaussian_noise_multiplier,
)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 4.0, 8.0])
def test_the_calibrated_noise_spends_the_budget_and_no_more(epsilon):
    z = gaussian_noise_multiplier(epsilon, 1e-6)
    assert gaussian_epsilon(z, 1e-6) <= epsilon
    assert gaussian_epsilon(z * 0.999, 1e-6) > epsilon * 0.99  # 0.1% less noise would spend about all of it


def test_releases_compose_as_the_one_gaussian_the_ledger_asks_about():
    """Releases: n of noise multiplier z are one of z / sqrt(n), and the accountant agrees."""
    z, n = 6.0, 20
    accountant = pld.PLDAccountant(value_discretization_interval=DISCRETIZATION)
    accountant.compose(dp_event.GaussianDpEvent(z), n)
    composed = accountant.get_epsilon(1e-6)
    assert gaussian_epsilon(z / math.sqrt(n), 1e-6) == pytest.approx(composed, rel=1e-3)


def test_a_plan_scales_its_noise_with_the_releases_and_their_sensitivity():
    plan = GaussianPlan(1.0, 1e-6, releases=400, sensitivity=2.0)
    assert plan.sigma == gaussian_noise_multiplier(1.0, 1e-6) * 2.0 * 20.0


def test_the_ledger_totals_what_the_busiest_row_took_part_in_and_refuses_past_the_plan():
    ledger = PrivacyLedger(GaussianPlan(2.0, 1e-6, releases=30, sensitivity=math.sqrt(3)))
    assert ledger.epsilon_spent() == 0.0
    ledger.charge(10, "party 'a'")
    first = ledger.epsilon_spent()
    ledger.charge(20, "party 'a'")
    assert 0 < first < ledger.epsilon_spent() <= 2.0
    assert ledger.epsilon_spent() > 2.0 * 0.99
    with pytest.raises(ParameterError) as refused:
        ledger.charge(1, "party 'a'")
    assert str(refused.value) == ("party 'a': the privacy budget (epsilon 2, delta 1e-06) is spent: a row "
                                  "would take part in 31 releases, its plan has 30; nothing more is released")
    assert ledger.releases_per_row == 30 and ledger.queries == 2
    report = ledger.to_dict()
    assert report["epsilon_total"] == ledger.epsilon_spent() and report["delta"] == 1e-6


@pytest.mark.parametrize("delta", [0, -1e-6, 0.5, float("nan"), "1e-6", True])
def test_a_delta_that_promises_nothing_is_refused(delta):
    with pytest.raises(ParameterError, match=r"delta must be a number in \(0, 0.01\]"):
        check_delta(delta)
