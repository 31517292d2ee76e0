"""Each party's privacy ledger as it states it with the finished model, and the master's check of it.

When a FET party in a DP mode acknowledges the model (`ack`, header field `ledger`), it states its ledger's
data-independent summary (issue #31): gdp, the Gaussian plan's mechanism, sigma, L2 sensitivity, planned
releases per row, budget, delta and the accountant's `epsilon_total` for all planned releases (the bound every
row's spend is under, `GaussianPlan.summary`); ldp, the label mechanism, each row's epsilon and delta 0
(`LocalDP.budget`). The busiest row's actual releases depend on the data and stay in the party's own report.

PPD-ERT secagg-dp states its distributed plan's terms and both of its totals (`epsilon_total` against the
master, `epsilon_coalition` against the master with the other parties; `fedcore.privacy.distributed`).

The master checks every stated ledger against the agreed setting (its terms) and, for gdp and secagg-dp,
**recomputes** its totals with the accountant from the mechanism and parameters it lists (`recompute`), rather
than trusting the stated numbers: a recomputed `epsilon_total` above the agreed epsilon is refused, and so is
a stated total that is not the recomputed one (`RESULT_TOLERANCE`). The checked ledger carries the recomputed
totals. LDP's total is its mechanism's epsilon itself (one report per row), checked against the budget. The
session records the checked ledgers, per institution, in the signed manifest and the model card. Without DP
(FET none, PPD-ERT secagg) a party states none.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedcore.errors import ProtocolError
from fedcore.privacy.ldp import LabelLDP
from fedcore.privacy.settings import LocalDP
from fedcore.protocol.messages import Message

LEDGER = "ledger"
"""The `ack` header field a DP party states its ledger in."""
SIGMA_TOLERANCE = 1e-6
"""How far (relative) a party's stated noise scale may be from the master's own plan. The calibrations search
to about 1e-6 (`fedcore.privacy.accounting`), so another install of dp-accounting or SciPy may end in other
digits; the bounds on that party's counts take the larger of the two."""
RESULT_TOLERANCE = 1e-6
"""How far (relative) a stated total may be from the master's recomputation of it (the same accountant on
the same parameters gives the same number; another install may differ in the last digits)."""


def stated_sigma(party: str, header: dict, planned: float, plan: str, mode: str = "GDP") -> float:
    """The noise sigma a DP party's hello reply states: a number > 0 within SIGMA_TOLERANCE of `planned`.

    `plan` says where the planned one comes from, for the refusal ("the agreed budget (...) over ...").
    """
    sigma = header.get("sigma")
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not 0 < sigma < math.inf:
        raise ProtocolError(f"party {party!r} reported no usable noise sigma ({sigma!r}); a {mode} party "
                            "states the scale of its noise in its hello reply")
    if abs(sigma - planned) > SIGMA_TOLERANCE * planned:
        raise ProtocolError(f"party {party!r} stated noise sigma {sigma!r} in hello, but {plan} plans sigma "
                            f"{planned!r}")
    return float(sigma)


def label_ldp_ledger(ldp: LabelLDP) -> dict[str, Any]:
    """An LDP party's ledger: the mechanism, each row's label epsilon, the model's (the same) and delta 0."""
    return LocalDP(ldp).budget()


@dataclass(frozen=True)
class AgreedLedger:
    """What every party's stated ledger must say: the agreed setting's terms, and its epsilon as the bound.

    `terms`: every field but the totals (`results`), each stated exactly (those in `approximate` within a
    relative `tolerance`: sigma comes out of the accountant's search, whose last digits may differ between
    installs).
    """

    terms: dict[str, Any]
    epsilon: float
    approximate: tuple[str, ...] = ()
    tolerance: float = 0.0
    recompute: Callable[[dict], dict[str, float]] | None = None
    """The accountant's totals from a stated ledger's mechanism and parameters (gdp, secagg-dp)."""
    results: tuple[str, ...] = ("epsilon_total",)
    """The totals a ledger states besides its terms."""

    def check(self, party: str, stated: object) -> dict[str, Any]:
        """`stated`, totals recomputed, if it is this agreement's ledger within the budget; else refuse it.

        Without `recompute` the stated epsilon_total must be in (0, epsilon].
        """
        fields = [*self.terms, *self.results]
        if not isinstance(stated, dict) or sorted(stated) != sorted(fields):
            what = sorted(stated) if isinstance(stated, dict) else stated
            raise ProtocolError(f"party {party!r} stated no usable privacy ledger with the model ({what!r}); "
                                f"a party in a DP mode states {fields}")
        for name, agreed in self.terms.items():
            if not self._matches(stated[name], agreed, name in self.approximate):
                raise ProtocolError(f"party {party!r} stated {name} {stated[name]!r} in its privacy ledger, "
                                    f"but the agreed setting's is {agreed!r}")
        if self.recompute is not None:
            return self._recomputed(party, stated)
        total = stated["epsilon_total"]
        if not _is_number(total) or not 0 < total <= self.epsilon:
            raise ProtocolError(f"party {party!r} stated epsilon_total {total!r} in its privacy ledger, but "
                                f"the agreed budget is epsilon {self.epsilon!r}: a party's accountant states "
                                "a number > 0 and at most the budget")
        return dict(stated)

    def _recomputed(self, party: str, stated: dict[str, Any]) -> dict[str, Any]:
        """The stated ledger with the accountant's totals; refused above the budget or stating others."""
        assert self.recompute is not None
        totals = self.recompute(stated)
        if totals["epsilon_total"] > self.epsilon:
            raise ProtocolError(f"party {party!r} stated a privacy ledger whose mechanism and parameters "
                                f"spend epsilon {totals['epsilon_total']:.6g} (recomputed by the master's "
                                f"accountant), above the agreed budget epsilon {self.epsilon!r}; refusing "
                                "its model")
        for name, value in totals.items():
            if not self._matches(stated[name], value, True, RESULT_TOLERANCE):
                raise ProtocolError(f"party {party!r} stated {name} {stated[name]!r} in its privacy ledger, "
                                    f"but its mechanism and parameters give {value!r} (the master's "
                                    "accountant)")
        return {**stated, **totals}

    def _matches(self, value: object, agreed: object, approximate: bool,
                 tolerance: float | None = None) -> bool:
        """`value` is `agreed`: the same string, or a number of its type (int for int), within tolerance."""
        if isinstance(agreed, str) or not isinstance(agreed, (int, float)):
            return value == agreed
        if not _is_number(value) or (isinstance(agreed, int) and not isinstance(value, int)):
            return False
        assert isinstance(value, (int, float))
        if approximate:
            return abs(value - agreed) <= (self.tolerance if tolerance is None else tolerance) * abs(agreed)
        return value == agreed


def check_ledgers(replies: dict[str, Message], agreed: AgreedLedger | None) -> dict[str, dict[str, Any]]:
    """Every party's ledger from its `ack`, checked against `agreed` (None: no DP mode, so no ledger)."""
    ledgers: dict[str, dict[str, Any]] = {}
    for name, reply in replies.items():
        stated = reply.header.get(LEDGER)
        if agreed is None:
            if stated is not None:
                raise ProtocolError(f"party {name!r} stated a privacy ledger with the model, but this "
                                    "training has no differential privacy to account for")
            continue
        ledgers[name] = agreed.check(name, stated)
    return ledgers


def _is_number(value: object) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
