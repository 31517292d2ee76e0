"""The master's check of the privacy ledgers parties state with the model (`fedcore.horizontal.ledgers`)."""

from __future__ import annotations

import math

import pytest

from fedcore.errors import ProtocolError
from fedcore.horizontal.ledgers import AgreedLedger, check_ledgers, label_ldp_ledger
from fedcore.privacy.accounting import GaussianPlan, recompute_gaussian
from fedcore.privacy.distributed import DistributedPlan, recompute_distributed
from fedcore.privacy.ldp import LabelLDP
from fedcore.protocol.messages import Message

PLAN = GaussianPlan(epsilon=2.0, delta=1e-6, releases=24, sensitivity=math.sqrt(3))
AGREED = AgreedLedger(PLAN.terms(), PLAN.epsilon, approximate=("sigma",), tolerance=1e-6)


def _acks(**ledgers) -> dict[str, Message]:
    return {name: Message("ack", {"n_nodes": 7, **({"ledger": ledger} if ledger is not None else {})})
            for name, ledger in ledgers.items()}


def test_a_plans_summary_is_accepted_and_its_epsilon_total_is_within_the_budget() -> None:
    summary = PLAN.summary()
    assert sorted(summary) == sorted([*PLAN.terms(), "epsilon_total"])
    assert 0 < summary["epsilon_total"] <= PLAN.epsilon
    nudged = {**summary, "sigma": summary["sigma"] * (1 + 5e-7)}  # another install's last digits
    assert check_ledgers(_acks(north=summary, south=nudged), AGREED) == {"north": summary, "south": nudged}


@pytest.mark.parametrize(("change", "refusal"), [
    ({"sigma": PLAN.sigma * 0.9},
     f"party 'north' stated sigma {PLAN.sigma * 0.9!r} in its privacy ledger, but the agreed setting's is "
     f"{PLAN.sigma!r}"),
    ({"planned_releases_per_row": "24"},
     "party 'north' stated planned_releases_per_row '24' in its privacy ledger, but the agreed setting's "
     "is 24"),
    ({"planned_releases_per_row": 24.0},
     "party 'north' stated planned_releases_per_row 24.0 in its privacy ledger, but the agreed setting's "
     "is 24"),
    ({"mechanism": "laplace"},
     "party 'north' stated mechanism 'laplace' in its privacy ledger, but the agreed setting's is "
     "'gaussian'"),
    ({"delta": 1e-5},
     "party 'north' stated delta 1e-05 in its privacy ledger, but the agreed setting's is 1e-06"),
    ({"epsilon_total": True},
     "party 'north' stated epsilon_total True in its privacy ledger, but the agreed budget is epsilon 2.0: a "
     "party's accountant states a number > 0 and at most the budget"),
    ({"epsilon_total": math.nan},
     "party 'north' stated epsilon_total nan in its privacy ledger, but the agreed budget is epsilon 2.0: a "
     "party's accountant states a number > 0 and at most the budget"),
    ({"epsilon_total": 0.0},
     "party 'north' stated epsilon_total 0.0 in its privacy ledger, but the agreed budget is epsilon 2.0: a "
     "party's accountant states a number > 0 and at most the budget"),
])
def test_a_ledger_other_than_the_agreed_one_is_refused_naming_the_party(change, refusal) -> None:
    with pytest.raises(ProtocolError) as refused:
        check_ledgers(_acks(north={**PLAN.summary(), **change}), AGREED)
    assert str(refused.value) == refusal


def test_a_ledger_with_missing_or_extra_fields_is_refused() -> None:
    """A data-dependent figure (the busiest row's releases) is not part of what a party states."""
    fields = [*PLAN.terms(), "epsilon_total"]
    for stated in ({**PLAN.summary(), "releases_per_row": 3}, PLAN.terms(), None):
        with pytest.raises(ProtocolError) as refused:
            check_ledgers(_acks(east=stated), AGREED)
        what = sorted(stated) if stated is not None else None
        assert str(refused.value) == (f"party 'east' stated no usable privacy ledger with the model "
                                      f"({what!r}); a party in a DP mode states {fields}")


def test_without_differential_privacy_a_stated_ledger_is_refused_and_none_is_kept() -> None:
    assert check_ledgers(_acks(north=None, south=None), None) == {}
    with pytest.raises(ProtocolError) as refused:
        check_ledgers(_acks(north=None, south=PLAN.summary()), None)
    assert str(refused.value) == ("party 'south' stated a privacy ledger with the model, but this training "
                                  "has no differential privacy to account for")


def test_an_ldp_ledger_states_the_mechanism_and_each_rows_epsilon_with_delta_0() -> None:
    bloom = LabelLDP(mechanism="bloom", n_bits=32)
    ledger = label_ldp_ledger(bloom)
    assert ledger == {"mechanism": "bloom", "epsilon": bloom.epsilon()["permanent"],
                      "epsilon_total": bloom.epsilon()["permanent"], "delta": 0.0}
    terms = {k: v for k, v in ledger.items() if k != "epsilon_total"}
    agreed = AgreedLedger(terms, ledger["epsilon_total"])
    assert check_ledgers(_acks(north=ledger), agreed) == {"north": ledger}
    with pytest.raises(ProtocolError, match="party 'north' stated epsilon 4.0 in its privacy ledger"):
        check_ledgers(_acks(north={**ledger, "epsilon": 4.0}), agreed)


RECOMPUTED = AgreedLedger(PLAN.terms(), PLAN.epsilon, approximate=("sigma",), tolerance=1e-6,
                          recompute=recompute_gaussian)


def test_the_master_recomputes_a_stated_gaussian_ledger_from_its_mechanism_and_parameters() -> None:
    summary = PLAN.summary()
    checked = check_ledgers(_acks(north=summary), RECOMPUTED)["north"]
    assert checked == {**summary, "epsilon_total": recompute_gaussian(summary)["epsilon_total"]}
    understated = {**summary, "epsilon_total": summary["epsilon_total"] / 2}
    with pytest.raises(ProtocolError) as refused:
        check_ledgers(_acks(north=understated), RECOMPUTED)
    assert str(refused.value) == (
        f"party 'north' stated epsilon_total {summary['epsilon_total'] / 2!r} in its privacy ledger, but its "
        f"mechanism and parameters give {summary['epsilon_total']!r} (the master's accountant)")


def test_a_ledger_whose_recomputed_total_exceeds_the_budget_is_refused() -> None:
    # terms that match an agreement but whose noise is too small for the budget: the stated total (within the
    # budget) is not believed, the accountant's is
    thin = {**PLAN.terms(), "sigma": PLAN.sigma / 4}
    agreed = AgreedLedger(thin, PLAN.epsilon, recompute=recompute_gaussian)
    spent = recompute_gaussian(thin)["epsilon_total"]
    assert spent > PLAN.epsilon
    with pytest.raises(ProtocolError) as refused:
        check_ledgers(_acks(north={**thin, "epsilon_total": 1.9}), agreed)
    assert str(refused.value) == (
        f"party 'north' stated a privacy ledger whose mechanism and parameters spend epsilon {spent:.6g} "
        "(recomputed by the master's accountant), above the agreed budget epsilon 2.0; refusing its model")


def test_a_distributed_ledger_states_and_is_checked_on_both_totals() -> None:
    plan = DistributedPlan(epsilon=2.0, delta=1e-6, releases=6, k=3, parties=3)
    agreed = AgreedLedger(plan.terms(), plan.epsilon, approximate=("sigma", "count_sigma"), tolerance=1e-6,
                          recompute=recompute_distributed, results=("epsilon_total", "epsilon_coalition"))
    summary = plan.summary()
    assert 0 < summary["epsilon_total"] <= 2.0 < summary["epsilon_coalition"]
    assert check_ledgers(_acks(north=summary), agreed) == {"north": summary}
    with pytest.raises(ProtocolError) as refused:
        check_ledgers(_acks(north={**summary, "epsilon_coalition": 2.0}), agreed)
    assert str(refused.value) == (
        f"party 'north' stated epsilon_coalition 2.0 in its privacy ledger, but its mechanism and parameters "
        f"give {summary['epsilon_coalition']!r} (the master's accountant)")
