"""FET-GDP's DP marginal histograms: exact cells before the noise, thresholds where the rows are."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.errors import ParameterError, ProtocolError
from fedcore.horizontal import FederatedExtraTreesClassifier
from fedcore.horizontal.fet.marginals import MarginalQuantiles, histogram_counts, marginal_releases
from fedcore.horizontal.plan import COUNT_RELEASES, count_sigma, gaussian_plan, gdp_terms, marginal_sigma
from fedcore.protocol.messages import Message
from fedcore.randomness import stream
from tests.horizontal.common import horizontal_table, split_rows


def test_histogram_counts_place_every_value_once_and_skip_missing() -> None:
    X = np.array([[0.0, 5.0], [0.24, np.nan], [0.25, 5.0], [1.0, 5.0], [-3.0, 5.0], [7.0, 5.0]])
    counts = histogram_counts(X, np.array([0.0, 5.0]), np.array([1.0, 5.0]), 4)
    # feature 0: cells [0, .25), [.25, .5), [.5, .75), [.75, 1]; outside values in the end cells
    assert counts.tolist() == [[3, 1, 0, 2], [5, 0, 0, 0]]


def test_thresholds_follow_the_mass() -> None:
    """All rows in the first of 8 cells of [0, 800]: nearly every threshold falls below 100."""
    histograms = np.array([[1000.0, 0, 0, 0, 0, 0, 0, 0]])
    quantiles = MarginalQuantiles(histograms, np.array([0.0]), np.array([800.0]))
    u = np.linspace(0.0, 0.99, 100).reshape(50, 2)
    features = np.zeros(u.shape, dtype=np.int64)
    low, high = np.zeros(u.shape), np.full(u.shape, 800.0)
    share = quantiles.warp(features, low, high, u)
    thresholds = low + share * (high - low)
    # the floor adds 1% of a cell's mean mass to every cell (1.25): the first cell holds 1001.25 of 1010, so
    # u below 0.9913 places the threshold in it, linearly
    np.testing.assert_allclose(thresholds, 100.0 * u * 1010 / 1001.25, rtol=1e-12)
    assert np.all(np.diff(thresholds.ravel()) >= 0)  # monotone in u
    # within a box [400, 800] (no mass), thresholds spread over it as uniform ones would
    box = quantiles.warp(features, np.full(u.shape, 400.0), high, u)
    np.testing.assert_allclose(box, u, atol=1e-12)


def test_the_marginals_are_charged_as_a_tenth_of_the_plan() -> None:
    assert marginal_releases(20) == 3 and marginal_releases(400) == 45 and marginal_releases(1) == 1
    terms = gdp_terms(10, 4, False, 3, "classification", 9)
    plan = gaussian_plan(2.0, 1e-6, terms)
    assert plan.releases == 40 + terms["marginal_releases"] + COUNT_RELEASES == 46  # and the noisy row count
    # the histograms (L2 sensitivity 3 = sqrt(9)) counted as 5 releases of the plan's noise multiplier, the
    # row count (sensitivity 1) as 1
    assert count_sigma(plan) == pytest.approx(plan.sigma / np.sqrt(3), rel=1e-12)
    assert marginal_sigma(plan, terms) == pytest.approx(plan.sigma / np.sqrt(3) * 3 / np.sqrt(5), rel=1e-12)
    assert plan.epsilon_after(plan.releases) <= 2.0
    with pytest.raises(ParameterError) as refused:
        gaussian_plan(2.0, 1e-6, {**terms, "marginal_bins": 10**6})
    assert str(refused.value) == ("privacy 'gdp': the plan's marginal_bins must be an integer in [0, 4096], "
                                  "got 1000000")
    uniform = gdp_terms(10, 4, False, 3, "classification", 9, marginal_bins=0)
    assert uniform["marginal_releases"] == 0 and gaussian_plan(2.0, 1e-6, uniform).releases == 41


def _fitted():
    table = horizontal_table(seed=4, n_rows=240)
    model = FederatedExtraTreesClassifier(3, privacy="gdp", epsilon=1.0, max_depth=3, allow_data_ranges=True,
                                          record_payloads=True)
    return model.fit(split_rows(table, 2), "target")


def test_a_party_releases_its_marginals_and_noisy_count_once_and_refuses_another_grid() -> None:
    model = _fitted()
    hello = next(Message.from_bytes(e.payload) for e in model.transcript_ if e.kind == "hello")
    first = [Message.from_bytes(e.payload) for e in model.transcript_ if e.kind == "hello_reply"]
    party = model.parties_[0]
    spent = party.ledger.releases_per_row
    again = party.handle(hello)  # a second session's hello: the same release, charged once
    np.testing.assert_array_equal(again.arrays["marginals"], first[0].arrays["marginals"])
    # the row count: its exact count plus its own Gaussian draw of the count's sigma, rounded
    noise = stream(party.noise_seed, "gdp_count").standard_normal() * count_sigma(party.ledger.plan)
    assert again.header["n_rows"] == first[0].header["n_rows"] == max(int(np.rint(party.n_rows + noise)), 0)
    assert party.ledger.releases_per_row == spent
    party.machine.state = "idle"  # as after a session's model: a hello is the next message
    other = Message("hello", hello.header, {"low": hello.arrays["low"] - 1.0, "high": hello.arrays["high"]})
    with pytest.raises(ProtocolError) as refused:
        party.handle(other)
    assert str(refused.value).endswith(f"party {party.name!r} has released its marginal histograms over "
                                       "other domains; a second hello must send the same 'low' and 'high'")


def test_the_executed_plan_stays_within_the_budget_with_the_marginals() -> None:
    model = _fitted()
    for party in model.parties_:
        ledger = party.privacy_spent()
        assert ledger["releases_per_row"] <= ledger["planned_releases_per_row"]
        assert 0 < ledger["epsilon_total"] <= 1.0
    assert model.privacy_report_["epsilon_total"] <= 1.0
