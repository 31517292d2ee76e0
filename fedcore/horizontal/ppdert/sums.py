"""The PPD-ERT master's side of `secagg-dp`: the plan, each party's stated noise, and bounds on noisy sums.

Each party's hello states its noise scale (refused unless it is the agreed plan's, `SIGMA_TOLERANCE`) and its
row count plus discrete Gaussian noise (`fedcore/horizontal/ppdert/noise.py`): the master never learns an
exact count. The sampler draws nothing beyond its table's reach, so a party's rows are at most its noisy count
plus the count noise's reach, and every unmasked sum lies within P times the count noise's reach of
[0, all rows]: the ring is sized for that, and a sum outside it is refused (naming no party: masked). Within
it a party can bias the sum without being caught, as under secagg.
"""

from __future__ import annotations

import numpy as np

from fedcore.errors import ProtocolError
from fedcore.horizontal.counts import SUM_OF_PARTIES
from fedcore.horizontal.ledgers import SIGMA_TOLERANCE, AgreedLedger, stated_sigma
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.plan import distributed_plan, plan_terms
from fedcore.privacy.discrete_gaussian import table
from fedcore.privacy.distributed import DistributedPlan, recompute_distributed
from fedcore.privacy.settings import DistributedDP
from fedcore.protocol.messages import Message


class DistributedSums:
    """The agreed secagg-dp budget, its plan for the parties of a session, and the checks of their sums."""

    def __init__(self, budget: DistributedDP, params: ExtraTreesParams, k: int) -> None:
        """The plan's terms (a bounded depth is required); the plan itself waits for the parties (hello)."""
        self.budget = budget
        self.terms = plan_terms(params.n_estimators, params.max_depth, k, params.task, mode="secagg-dp")
        self._plan: DistributedPlan | None = None
        self._low = self._high = 0

    @property
    def plan(self) -> DistributedPlan:
        """The plan for this session's parties (made at hello)."""
        assert self._plan is not None, "hello makes the plan"
        return self._plan

    @property
    def planned(self) -> bool:
        """Whether hello made the plan."""
        return self._plan is not None

    def hello_terms(self) -> dict:
        """What the master's hello adds: the mode and the plan's terms."""
        return {"privacy": "secagg-dp", **self.terms}

    def check_hello(self, replies: dict[str, Message], party_rows: dict[str, int]) -> int:
        """Plan for these parties, refuse a stated sigma not the plan's; the largest sum's magnitude."""
        plan = self._plan = distributed_plan(self.budget.epsilon, self.budget.delta, self.terms, len(replies))
        for name, reply in replies.items():
            stated_sigma(name, reply.header, plan.sigma,
                         f"the agreed budget (epsilon {plan.epsilon:g}, delta {plan.delta:g}) for "
                         f"{len(replies)} parties", "secagg-dp")
        parties = len(replies)
        reach = parties * table(plan.sigma).reach
        rows = sum(party_rows.values()) + parties * table(plan.count_sigma).reach  # the most rows there are
        self._low, self._high = -reach, rows + reach
        return self._high

    def check_sums(self, counts: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """The unmasked noisy sums as (A, k, 2, C) float64; refused outside what honest noise can reach."""
        if counts.size != int(np.prod(shape)):
            raise ProtocolError(f"aggregated counts have {counts.size} entries, expected "
                                f"{int(np.prod(shape))}")
        if counts.size and (int(counts.min()) < self._low or int(counts.max()) > self._high):
            raise ProtocolError(f"{SUM_OF_PARTIES}: a noisy count outside [{self._low}, {self._high}], the "
                                "declared (noisy) rows widened by the most the agreed noise can reach")
        return counts.reshape(shape).astype(np.float64)

    def variance(self) -> float:
        """The noise variance of one unmasked count: P sigma^2."""
        return self.plan.parties * self.plan.sigma ** 2

    def agreed_ledger(self) -> AgreedLedger:
        """The plan's terms (sigmas within SIGMA_TOLERANCE); each party's totals recomputed."""
        return AgreedLedger(self.plan.terms(), self.plan.epsilon, approximate=("sigma", "count_sigma"),
                            tolerance=SIGMA_TOLERANCE, recompute=recompute_distributed,
                            results=("epsilon_total", "epsilon_coalition"))
