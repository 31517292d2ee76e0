"""Distributed DP on secure sums (PPD-ERT `secagg-dp`): each party 1/P of the noise, the sum all of it.

With secure aggregation the master sees only the sum of the parties' count vectors, so each of P parties adds
discrete Gaussian noise of scale sigma (variance sigma^2, `fedcore.privacy.discrete_gaussian`) and every count
the master unmasks carries the sum of P draws: variance P sigma^2 (Kairouz, Liu and Steinke, ICML 2021).

**The plan** (`DistributedPlan`): a row takes part in at most `releases` releases (trees x levels), each the
count vector of its node under the k candidates, in which it moves k counts by 1 (add/remove-one neighbours:
one class of one branch per candidate). Before any of them, each party states its row count plus discrete
Gaussian noise of scale `count_sigma` (sigma sqrt(P): one draw, no masks), which the master needs to size
the ring and bound the sums. Both are in the plan and paid from the budget.

**Against the master** (`epsilon_total`): the noise on each of the n = releases x k counts a row moves is the
sum of P draws; these counts are independent and a row shifts each by 1, so the privacy loss depends only on
their total, which is the sum of n P draws shifted by n. The accountant (dp-accounting's privacy loss
distributions, `from_two_probability_mass_functions`) is given that sum's exact law (`sum_pmf`: the
sampler's own law, not an idealised Gaussian) and composes it with the noisy count's.

**Against the master with the other P - 1 parties** (`epsilon_coalition`): they know their own noise and can
subtract it, leaving this party's draws alone: 1/P of the variance, the sum of n draws. The same accountant
gives that epsilon; it is reported, not bounded by the budget (which is the guarantee against the master).

The calibration (`calibrate`) searches sigma, each guess rounded up to 4 significant digits (so master and
parties, computing alike, land on the same sigma), until the accountant's epsilon is at most the budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fedcore.errors import ParameterError
from fedcore.privacy.accounting import ReleasePlan, check_releases
from fedcore.privacy.discrete_gaussian import sum_pmf

MECHANISM = "distributed-discrete-gaussian"
DISCRETIZATION = 1e-4
"""The privacy-loss interval of these distributions (pessimistic rounding; two are composed)."""
SECANT_STEPS = 4
"""Secant steps of the calibration before it only steps up."""


def round_up(value: float) -> float:
    """`value` rounded up to 4 significant digits (so every role computing it lands on the same float)."""
    step = 10.0 ** (math.floor(math.log10(value)) - 3)
    return round(math.ceil(value / step - 1e-9) * step, 12)


def _shifted_pld(first: int, pmf: np.ndarray, shift: int):
    """The PLD of a release whose noise has law `pmf` (from outcome `first`), moved by `shift` by one row.

    dp-accounting's `from_two_probability_mass_functions` (pessimistic) on mu_lower = the law and mu_upper =
    the law moved by `shift`, its per-outcome loop done with whole arrays: every outcome's privacy loss
    log(upper / lower) rounded up to the interval, its upper mass summed per rounded loss; upper mass where
    lower has none is infinite loss. The rounded law becomes the PMF the library's own constructor
    (`create_from_rounded_probability`) makes of it: sparse up to its `_MAX_PMF_SPARSE_SIZE` losses, else
    dense, built here from the arrays (the library fills the dense one by a Python loop over every loss).
    """
    del first  # the loss depends on the law's shape only: outcomes are relative to its first one
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

    upper = pmf  # mu_upper at outcome first + shift + j is pmf[j]; mu_lower there is pmf[j + shift]
    lower = np.zeros_like(pmf)
    lower[:max(len(pmf) - shift, 0)] = pmf[shift:]
    finite = (upper > 0) & (lower > 0)
    infinity = float(upper[(upper > 0) & (lower == 0)].sum())
    rounded = np.ceil((np.log(upper[finite]) - np.log(lower[finite])) / DISCRETIZATION).astype(np.int64)
    values, where = np.unique(rounded, return_inverse=True)
    masses = np.bincount(where, weights=upper[finite])
    if values.size <= pld_pmf._MAX_PMF_SPARSE_SIZE:
        return PrivacyLossDistribution.create_from_rounded_probability(
            dict(zip(values.tolist(), masses.tolist(), strict=True)), infinity, DISCRETIZATION,
            pessimistic_estimate=True)
    dense = np.zeros(int(values[-1] - values[0]) + 1)
    dense[values - values[0]] = masses
    return PrivacyLossDistribution(pld_pmf.DensePLDPmf(DISCRETIZATION, int(values[0]), dense, infinity, True))


def gaussian_mu(epsilon: float, delta: float) -> float:
    """The mu of the Gaussian mechanism (sensitivity / sigma) whose exact delta at `epsilon` is `delta`.

    Balle and Wang (ICML 2018): delta = Phi(-epsilon / mu + mu / 2) - e^epsilon Phi(-epsilon / mu - mu / 2),
    solved by bisection. Only where the calibration starts; the accountant decides.
    """
    def phi(x: float) -> float:
        return 0.5 * math.erfc(-x / math.sqrt(2))

    low, high = 1e-6, 100.0
    for _ in range(100):
        mu = math.sqrt(low * high)
        spent = phi(-epsilon / mu + mu / 2) - math.exp(epsilon) * phi(-epsilon / mu - mu / 2)
        low, high = (mu, high) if spent < delta else (low, mu)
    return math.sqrt(low * high)


@lru_cache(maxsize=256)
def distributed_epsilon(sigma: float, count_sigma: float, counts: int, draws_per_count: int,
                        delta: float) -> float:
    """Epsilon at `delta` of a noisy row count and `counts` counts moved by 1, `draws_per_count` draws each.

    The master: draws_per_count = P; the master with the other parties: 1.
    """
    pld = _shifted_pld(*sum_pmf(count_sigma, 1), 1)
    if counts:
        pld = pld.compose(_shifted_pld(*sum_pmf(sigma, counts * draws_per_count), counts))
    return max(float(pld.get_epsilon_for_delta(delta)), 0.0)


@lru_cache(maxsize=64)
def calibrate(epsilon: float, delta: float, counts: int, parties: int) -> tuple[float, float]:
    """(sigma, count_sigma): each party's noise scale and its row count's, within the budget.

    From the continuous Gaussian's exact sigma for the same counts (`gaussian_mu`; the row count's noise is
    one more count of the same total scale), a few secant steps on epsilon ~ 1 / sigma (each rounded up to 4
    digits, `round_up`), then 0.5% steps up until the accountant's epsilon is at most the budget.
    """
    total = math.sqrt(counts + 1) / gaussian_mu(epsilon, delta)
    sigma = round_up(total / math.sqrt(parties))
    for step in range(40):
        count_sigma = round_up(sigma * math.sqrt(parties))
        spent = distributed_epsilon(sigma, count_sigma, counts, parties, delta)
        if step >= SECANT_STEPS or abs(spent / epsilon - 1) < 1e-3:
            if spent <= epsilon:
                return sigma, count_sigma
            sigma = round_up(sigma * 1.005)
        else:
            sigma = round_up(sigma * spent / epsilon * (1 + 5e-4))
    raise ParameterError(f"no discrete Gaussian noise up to sigma {sigma:g} keeps {counts} counts within "
                         f"epsilon {epsilon:g} at delta {delta:g}")


@dataclass(frozen=True)
class DistributedPlan(ReleasePlan):
    """A party's share of distributed discrete Gaussian noise on secure sums, planned for the whole model.

    `releases`: the most releases one row takes part in (trees x levels); `k`: the counts it moves in each
    (one per candidate); `parties`: how many parties' noise every unmasked count carries.
    """

    epsilon: float
    delta: float
    releases: int
    k: int
    parties: int

    def __post_init__(self) -> None:
        """Refuse a plan no release can follow."""
        check_releases(self.releases)
        for name in ("k", "parties"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ParameterError(f"a distributed DP plan needs {name} >= 1, got {value!r}")

    @property
    def sigma(self) -> float:
        """Each party's noise scale on every count it masks."""
        return calibrate(self.epsilon, self.delta, self.releases * self.k, self.parties)[0]

    @property
    def count_sigma(self) -> float:
        """The noise scale of the row count each party states in hello (sigma sqrt(P), rounded up)."""
        return calibrate(self.epsilon, self.delta, self.releases * self.k, self.parties)[1]

    def terms(self) -> dict:
        """The mechanism and its parameters: public, and the same for every party under the same plan."""
        return {"mechanism": MECHANISM, "sigma": self.sigma, "count_sigma": self.count_sigma,
                "counts_per_release": self.k, "parties": self.parties,
                "planned_releases_per_row": self.releases, "epsilon_budget": self.epsilon,
                "delta": self.delta}

    def totals_after(self, releases: int) -> dict[str, float]:
        """Against the master (`epsilon_total`); with the other parties too (`epsilon_coalition`)."""
        return totals(self.sigma, self.count_sigma, releases * self.k, self.parties, self.delta)


def totals(sigma: float, count_sigma: float, counts: int, parties: int, delta: float) -> dict[str, float]:
    """The accountant's epsilons for a row count and `counts` moved counts: the master's, the coalition's."""
    return {"epsilon_total": distributed_epsilon(sigma, count_sigma, counts, parties, delta),
            "epsilon_coalition": distributed_epsilon(sigma, count_sigma, counts, 1, delta)}


def recompute_distributed(stated: dict) -> dict[str, float]:
    """The accountant's totals for a stated distributed ledger, from its mechanism's parameters alone."""
    counts = int(stated["planned_releases_per_row"]) * int(stated["counts_per_release"])
    return totals(float(stated["sigma"]), float(stated["count_sigma"]), counts, int(stated["parties"]),
                  float(stated["delta"]))
