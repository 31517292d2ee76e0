"""A PPD-ERT party's share of the noise under `secagg-dp` (distributed DP, `fedcore.privacy.distributed`).

At hello the party plans from the master's terms (trees, depth, candidates, task), the number of parties and
its OWN configured budget (`fedcore.horizontal.plan.distributed_plan`), keeps a `PrivacyLedger`, and states
its noise scale and its row count plus discrete Gaussian noise (`count_sigma`): no exact count leaves it.
Before every masked level it charges the ledger (refusing a release past the plan) and adds discrete Gaussian
noise of scale sigma to every count (`fedcore.privacy.discrete_gaussian`), from Philox words keyed by its own
secret seed and the round id: a batch grown again after a resume (same round ids) is answered with the same
noise.

`audit` (a list, when asked for): every release's round id, exact counts and noise, kept in the party's own
memory for its own audit (and the tests): nothing of it is sent.
"""

from __future__ import annotations

import numpy as np

from fedcore.errors import ParameterError, ProtocolError
from fedcore.horizontal.plan import PLAN_TERMS, distributed_plan
from fedcore.privacy.accounting import PrivacyLedger
from fedcore.privacy.discrete_gaussian import table
from fedcore.privacy.distributed import DistributedPlan
from fedcore.randomness import counter_key


class DistributedNoise:
    """One party's plan, ledger and noise under secagg-dp (see the module doc)."""

    def __init__(self, party: str, epsilon: float, delta: float, noise_seed: int,
                 audit: bool = False) -> None:
        """The party's own budget (epsilon, delta) and secret noise seed; `audit` keeps what it released."""
        self.party, self.noise_seed = party, noise_seed
        self.epsilon, self.delta = float(epsilon), float(delta)
        self.ledger: PrivacyLedger[DistributedPlan] | None = None
        self.restored_ledger = (0, 0)  # (releases per row, queries) of a resumed run (the agent's checkpoint)
        self.audit: list[tuple[int, np.ndarray, np.ndarray]] | None = [] if audit else None

    @property
    def plan(self) -> DistributedPlan:
        """The plan made at hello."""
        if self.ledger is None:
            raise ProtocolError(f"party {self.party!r}: no secagg-dp plan before hello")
        return self.ledger.plan

    def start(self, hello: dict, n_parties: int, n_rows: int) -> dict[str, object]:
        """Plan from the master's hello under this party's own budget; the hello reply's noisy fields.

        A second hello keeps the ledger and is refused if it plans otherwise.
        """
        if hello.get("privacy") != "secagg-dp":
            raise ProtocolError(f"party {self.party!r} is configured for privacy 'secagg-dp', the master "
                                f"asked for {hello.get('privacy', 'secagg')!r}; the party's own setting wins")
        try:
            plan = distributed_plan(self.epsilon, self.delta, {name: hello.get(name) for name in PLAN_TERMS},
                                    n_parties)
        except ParameterError as error:
            raise ProtocolError(f"party {self.party!r}: {error}") from None
        if self.ledger is None:
            releases, queries = self.restored_ledger
            self.ledger = PrivacyLedger(plan, releases_per_row=releases, queries=queries)
        elif self.ledger.plan != plan:
            raise ProtocolError(f"party {self.party!r} has released under another plan; its ledger continues "
                                "under that plan")
        noise = table(plan.count_sigma).draw(counter_key(self.noise_seed, "secagg_dp_count"), 1)
        return {"sigma": plan.sigma, "n_rows": max(int(n_rows + noise[0]), 0)}

    def charge(self, times: int) -> None:
        """Record a release the busiest row takes part in `times` times; refuse one past the plan."""
        assert self.ledger is not None, "hello makes the ledger"
        if times:
            try:
                self.ledger.charge(times, f"party {self.party!r}")
            except ParameterError as error:
                raise ProtocolError(str(error)) from None

    def noisy(self, counts: np.ndarray, round_id: int) -> np.ndarray:
        """`counts` (int64) plus this round's discrete Gaussian noise of the plan's sigma."""
        noise = table(self.plan.sigma).draw(counter_key(self.noise_seed, "secagg_dp_noise", round_id),
                                            counts.size).reshape(counts.shape)
        if self.audit is not None:
            self.audit.append((round_id, counts.copy(), noise))
        return counts.astype(np.int64) + noise

    def reach(self) -> int:
        """The largest |noise| on one count (the sampler's table)."""
        return table(self.plan.sigma).reach
