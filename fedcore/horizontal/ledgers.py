"""Each party's privacy ledger as it states it with the finished model, and the master's check of it.

When a FET party in a DP mode acknowledges the model (`ack`, header field `ledger`), it states its ledger's
data-independent summary (issue #31): gdp, the Gaussian plan's mechanism, sigma, L2 sensitivity, planned
releases per row, budget, delta and the accountant's `epsilon_total` for all planned releases (the bound every
row's spend is under, `GaussianPlan.summary`); ldp, the label mechanism, each row's epsilon and delta 0
(`LocalDP.budget`). The busiest row's actual releases depend on the data and stay in the party's own report.

The master checks every stated ledger against the agreed setting (its terms, and `epsilon_total` at most the
agreed epsilon) and refuses one that differs, naming the party; the session records the checked ledgers, per
institution, in the signed manifest and the model card. Without DP (FET none, PPD-ERT) a party states none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fedcore.errors import ProtocolError
from fedcore.privacy.ldp import LabelLDP
from fedcore.privacy.settings import LocalDP
from fedcore.protocol.messages import Message

LEDGER = "ledger"
"""The `ack` header field a DP party states its ledger in."""


def label_ldp_ledger(ldp: LabelLDP) -> dict[str, Any]:
    """An LDP party's ledger: the mechanism, each row's label epsilon, the model's (the same) and delta 0."""
    return LocalDP(ldp).budget()


@dataclass(frozen=True)
class AgreedLedger:
    """What every party's stated ledger must say: the agreed setting's terms, and its epsilon as the bound.

    `terms`: every field but `epsilon_total`, each stated exactly (those in `approximate` within a relative
    `tolerance`: sigma comes out of the accountant's search, whose last digits may differ between installs).
    """

    terms: dict[str, Any]
    epsilon: float
    approximate: tuple[str, ...] = ()
    tolerance: float = 0.0

    def check(self, party: str, stated: object) -> dict[str, Any]:
        """`stated` if it is this agreement's ledger with an epsilon_total in (0, epsilon]; else refuse it."""
        fields = [*self.terms, "epsilon_total"]
        if not isinstance(stated, dict) or sorted(stated) != sorted(fields):
            what = sorted(stated) if isinstance(stated, dict) else stated
            raise ProtocolError(f"party {party!r} stated no usable privacy ledger with the model ({what!r}); "
                                f"a party in a DP mode states {fields}")
        for name, agreed in self.terms.items():
            if not self._matches(stated[name], agreed, name in self.approximate):
                raise ProtocolError(f"party {party!r} stated {name} {stated[name]!r} in its privacy ledger, "
                                    f"but the agreed setting's is {agreed!r}")
        total = stated["epsilon_total"]
        if not _is_number(total) or not 0 < total <= self.epsilon:
            raise ProtocolError(f"party {party!r} stated epsilon_total {total!r} in its privacy ledger, but "
                                f"the agreed budget is epsilon {self.epsilon!r}: a party's accountant states "
                                "a number > 0 and at most the budget")
        return dict(stated)

    def _matches(self, value: object, agreed: object, approximate: bool) -> bool:
        """`value` is `agreed`: the same string, or a number of its type (int for int), within tolerance."""
        if isinstance(agreed, str) or not isinstance(agreed, (int, float)):
            return value == agreed
        if not _is_number(value) or (isinstance(agreed, int) and not isinstance(value, int)):
            return False
        assert isinstance(value, (int, float))
        if approximate:
            return abs(value - agreed) <= self.tolerance * abs(agreed)
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
