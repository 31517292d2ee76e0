"""PPD-ERT `secagg-dp`: each party's plan, ledger and noise, and what the master refuses (issue #31).

What crosses the wire (the unmasked sums are the exact counts plus the parties' recorded noise, no exact
row count, the ledgers within the budget) is asserted on a federation's transcript in
tests/test_wire_invariants.py.
"""

from __future__ import annotations

import pytest

from fedcore.errors import ParameterError, ProtocolError
from fedcore.horizontal.estimators import PPDERTClassifier
from fedcore.horizontal.ppdert.noise import DistributedNoise
from fedcore.privacy.distributed import recompute_distributed
from tests.horizontal.common import assert_same_forest, horizontal_table, split_rows

BUDGET = {"mode": "secagg-dp", "epsilon": 2.0, "delta": 1e-6}
OPTIONS = {"n_estimators": 3, "max_depth": 3, "random_state": 0, "allow_data_ranges": True}


@pytest.fixture(scope="module")
def parties():
    return split_rows(horizontal_table(seed=3, n_rows=450), 3, seed=2)


def test_a_fit_is_reproducible_and_every_ledger_is_within_the_budget(parties) -> None:
    model = PPDERTClassifier(**OPTIONS, privacy=BUDGET).fit(parties, label="target")
    again = PPDERTClassifier(**OPTIONS, privacy=BUDGET).fit(parties, label="target")
    assert_same_forest(model.model_, again.model_)  # the noise comes from counters under each party's seed
    report = model.privacy_report_
    assert report["mode"] == "secagg-dp" and 0 < report["epsilon_total"] <= 2.0
    assert report["epsilon_coalition"] > report["epsilon_total"]
    checked = model.master_.ledgers
    assert set(checked) == {p.name for p in model.parties_}
    for party in model.parties_:
        stated = party.noise.plan.summary()
        assert checked[party.name] == {**stated, **recompute_distributed(stated)}
        assert checked[party.name]["epsilon_total"] <= 2.0
        assert party.privacy_spent()["releases_per_row"] <= 3 * 3  # at most trees x levels
    # the master planned its ring and bounds from the noisy counts, not the exact ones
    assert model.master_.party_rows != {p.name: p.n_rows for p in model.parties_}


class _Mixed(PPDERTClassifier):
    """A federation whose party 'party1' is configured otherwise (`own`: its noise share, or None)."""

    own: object = None

    def _party_noise(self, name):
        return self.own if name == "party1" else super()._party_noise(name)


def test_a_party_trains_only_in_its_own_mode(parties) -> None:
    model = _Mixed(**OPTIONS, privacy=BUDGET)
    model.own = None  # party1 is configured for secagg
    with pytest.raises(ProtocolError) as refused:
        model.fit(parties, label="target")
    assert str(refused.value) == ("party 'party1' is configured for privacy 'secagg', the master asked for "
                                  "'secagg-dp'; the party's own setting wins")


def test_the_master_refuses_a_party_stating_another_noise_scale(parties) -> None:
    model = _Mixed(**OPTIONS, privacy=BUDGET)
    model.own = DistributedNoise("party1", epsilon=8.0, delta=1e-6, noise_seed=5)  # a looser own budget
    with pytest.raises(ProtocolError) as refused:
        model.fit(parties, label="target")
    assert str(refused.value).startswith("party 'party1' stated noise sigma ")
    assert "but the agreed budget (epsilon 2, delta 1e-06) for 3 parties plans sigma " in str(refused.value)


def test_a_party_refuses_a_release_past_its_plan(parties, monkeypatch) -> None:
    from fedcore.horizontal.ppdert.sums import DistributedSums

    check_hello = DistributedSums.check_hello

    def planned_for_one_level(self, replies, party_rows):
        self.terms = {**self.terms, "max_depth": 1}
        return check_hello(self, replies, party_rows)

    announced = DistributedSums.hello_terms
    # a master announcing (and planning) 1 level per tree, then growing 3
    monkeypatch.setattr(DistributedSums, "hello_terms", lambda self: {**announced(self), "max_depth": 1})
    monkeypatch.setattr(DistributedSums, "check_hello", planned_for_one_level)
    with pytest.raises(ProtocolError) as refused:
        PPDERTClassifier(**OPTIONS, privacy=BUDGET).fit(parties, label="target")
    assert str(refused.value).startswith("party 'party0': the privacy budget (epsilon 2, delta 1e-06) is "
                                         "spent: a row would take part in ")
    assert str(refused.value).endswith(" releases, its plan has 3; nothing more is released")


@pytest.mark.parametrize(("options", "refusal"), [
    ({"privacy": {**BUDGET, "thresholds": "histogram"}},
     "privacy: mode 'secagg-dp' does not use field(s) ['thresholds']; valid: ['delta', 'epsilon', 'mode']"),
    ({"privacy": BUDGET, "max_depth": None},
     "privacy 'secagg-dp' needs a bounded depth: set params.max_depth (the model's budget is spread over "
     "trees x levels)"),
    ({"privacy": BUDGET, "secure_aggregation": False},
     "privacy 'secagg-dp' needs secure_aggregation=True: each party adds 1/P of the noise, enough only for "
     "the masked sum"),
])
def test_settings_secagg_dp_cannot_keep_are_refused(parties, options, refusal) -> None:
    with pytest.raises(ParameterError) as refused:
        PPDERTClassifier(**{**OPTIONS, **options}).fit(parties, label="target")
    assert str(refused.value) == refusal
