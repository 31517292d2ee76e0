"""A model's total differential-privacy budget: noise calibrated to it, and what was spent, by dp-accounting.

A DP mode's `epsilon` and `delta` are the budget of the whole trained model, per row (add/remove-one
neighbours), not of one query (issue #31). Before training, a party plans its releases (`GaussianPlan`: how
many times at most one row can take part in a release, and each release's L2 sensitivity) and calibrates one
noise scale to the budget; while training it records what it released (`PrivacyLedger`) and refuses a release
beyond the plan. Both the calibration and the total come from Google's `dp-accounting` (Apache-2.0), its
privacy-loss-distribution (PLD) accountant, never from hand-written composition.

Gaussian releases compose exactly: n releases of L2 sensitivity s with noise sigma are, for any row, one
Gaussian mechanism of noise multiplier sigma / (s sqrt(n)) (the sum of the privacy losses of independent
Gaussians is Gaussian). The accountant is therefore asked about that one mechanism, which is exact and fast;
the ledger keeps the releases themselves for the report.

The PLD accountant discretises the privacy loss pessimistically (`DISCRETIZATION`): the epsilon it reports
for a delta is an upper bound of the true one, and a noise scale calibrated with it is at least the one
needed.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from functools import lru_cache
from typing import Generic, TypeVar

import numpy as np

from fedcore.errors import ParameterError
from fedcore.privacy.remembered import gaussian_delta, remembered

DEFAULT_DELTA = 1e-6
"""The default delta of a DP mode's (epsilon, delta) budget: far below 1 / rows for any table fedforest trains
(delta is the probability the epsilon guarantee fails for a row)."""
MAX_DELTA = 1e-2
DISCRETIZATION = 1e-2
"""The PLD accountant's value discretisation interval. Pessimistic; 1e-2 calibrates a Gaussian in about a
second and gives the same noise scale as finer intervals to 9 digits (1e-4 takes minutes)."""


_HINT = "smaller epsilon = more noise and stronger privacy, larger = less noise (typical values 0.1 to 10)"

ZIGGURAT_R = 3.6541528853610088
"""The start r of the tail of NumPy's 256-step normal ziggurat (`ziggurat_nor_r`)."""
GAUSSIAN_NOISE_BOUND = ZIGGURAT_R + 53 * math.log(2) / ZIGGURAT_R
"""No value `Generator.standard_normal` returns (any bit generator) exceeds this in magnitude, about 13.71.

NumPy's `random_standard_normal` (numpy/random/src/distributions/distributions.c) returns below r from the
ziggurat's layers, and beyond r only from its tail: r + xx with xx = -log(1 - U) / r (`log1p(-U)` in newer
versions), U a multiple of 2^-53 in [0, 1), so 1 - U >= 2^-53 and xx <= 53 ln 2 / r. The horizontal master
refuses noisy counts further than this many noise scales from any count a party could hold
(`fedcore.horizontal.counts`)."""


def check_epsilon(epsilon: object, what: str = "epsilon") -> float:
    """Return `epsilon` as a float, refusing anything that is not a finite number > 0."""
    valid = (isinstance(epsilon, numbers.Real) and not isinstance(epsilon, (bool, np.bool_))
             and math.isfinite(epsilon) and epsilon > 0)  # type: ignore[operator]
    if not valid:
        raise ParameterError(f"{what} must be a finite number > 0, got {epsilon!r}: {_HINT}")
    return float(epsilon)  # type: ignore[arg-type]


def check_delta(delta: object, what: str = "delta") -> float:
    """`delta` as a float in (0, MAX_DELTA]; anything else refused, saying why."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not math.isfinite(delta) \
            or not 0 < delta <= MAX_DELTA:
        raise ParameterError(f"{what} must be a number in (0, {MAX_DELTA:g}], got {delta!r}: the probability "
                             f"that the epsilon guarantee fails for a row; keep it far below 1 / rows "
                             f"(default {DEFAULT_DELTA:g})")
    return float(delta)


def _accountant():
    from dp_accounting import pld

    return pld.PLDAccountant(value_discretization_interval=DISCRETIZATION)


@lru_cache(maxsize=1)
def _answers_version() -> str:
    """What the kept answers (`fedcore.privacy.remembered`) were computed by: this module's accountant."""
    from importlib.metadata import version

    return f"dp-accounting {version('dp-accounting')}, PLD {DISCRETIZATION!r}, calibration tol 1e-6 v1"


@lru_cache(maxsize=64)
def gaussian_noise_multiplier(epsilon: float, delta: float) -> float:
    """The noise multiplier z (sigma / L2 sensitivity) of one Gaussian mechanism spending (epsilon, delta).

    dp-accounting's `calibrate_dp_mechanism` over its PLD accountant: the smallest z (to its search's
    tolerance, rounded up) whose epsilon at `delta` is at most `epsilon`. The search starts from a quarter of
    the classical z = sqrt(2 ln(1.25 / delta)) / epsilon (more than the need below it: a bracket starting near
    0 makes the PLD of its first guesses span millions of values and take minutes). An answer kept on disk
    by an earlier process is reused once it passes the exact bound (`fedcore.privacy.remembered`).
    """
    def calibrate() -> float:
        from dp_accounting import dp_event, mechanism_calibration

        lower = 0.25 * math.sqrt(2 * math.log(1.25 / delta)) / epsilon
        return float(mechanism_calibration.calibrate_dp_mechanism(
            _accountant, dp_event.GaussianDpEvent, epsilon, delta,
            mechanism_calibration.LowerEndpointAndGuess(lower, 2 * lower), tol=1e-6))

    return remembered("gaussian_noise_multiplier", (epsilon, delta), calibrate,
                      lambda z: gaussian_delta(epsilon, z) <= delta, _answers_version())


@lru_cache(maxsize=256)
def gaussian_epsilon(noise_multiplier: float, delta: float, count: int = 1) -> float:
    """Epsilon at `delta` of `count` composed Gaussian releases of noise multiplier z (sigma / sensitivity).

    dp-accounting's PLD accountant composes the event `count` times (for Gaussians it does so exactly, as
    one Gaussian of multiplier z / sqrt(count)). An answer kept on disk by an earlier process is reused once
    it passes the exact bound (`fedcore.privacy.remembered`).
    """
    def account() -> float:
        from dp_accounting import dp_event

        accountant = _accountant()
        accountant.compose(dp_event.GaussianDpEvent(noise_multiplier), count)
        return float(accountant.get_epsilon(delta))

    return remembered("gaussian_epsilon", (noise_multiplier, delta, count), account,
                      lambda e: gaussian_delta(e, noise_multiplier / math.sqrt(count)) <= delta,
                      _answers_version())


class ReleasePlan:
    """A party's releases, planned before training: the budget, and how many one row can take part in.

    Each mode's plan (`GaussianPlan` here, `fedcore.privacy.distributed.DistributedPlan`) says what its noise
    is (`terms`) and what the accountant makes of a row's releases (`totals_after`); `PrivacyLedger` charges
    any of them.
    """

    epsilon: float
    delta: float
    releases: int

    def terms(self) -> dict:
        """The mechanism and its parameters: public, and the same for every party under the same plan."""
        raise NotImplementedError

    def totals_after(self, releases: int) -> dict[str, float]:
        """What the accountant says a row that took part in `releases` releases spent: `epsilon_total`..."""
        raise NotImplementedError

    def epsilon_after(self, releases: int) -> float:
        """Epsilon at the plan's delta of a row that took part in `releases` releases."""
        return self.totals_after(releases)["epsilon_total"]

    def summary(self) -> dict:
        """The plan's data-independent ledger: its terms and the accountant's totals for all its releases.

        `epsilon_total` bounds what any row spends (at most the budget); no data went into it, so a party
        may state it to the master (`fedcore.horizontal.ledgers`), which recomputes it from the terms.
        """
        return {**self.terms(), **self.totals_after(self.releases)}


def check_releases(releases: object) -> None:
    """Refuse a plan with no releases (a count that is not an integer >= 1)."""
    if isinstance(releases, bool) or not isinstance(releases, int) or releases < 1:
        raise ParameterError(f"a DP plan needs at least one release, got {releases!r}")


@dataclass(frozen=True)
class GaussianPlan(ReleasePlan):
    """A party's Gaussian releases, planned before training, and the noise that keeps them within the budget.

    `releases`: the most releases any one row can take part in (FET: trees x levels, one per level of every
    tree); `sensitivity`: each release's L2 sensitivity (how far one row moves the vector of one release).
    """

    epsilon: float
    delta: float
    releases: int
    sensitivity: float

    def __post_init__(self) -> None:
        """Refuse a plan no release can follow: no releases or a sensitivity that is not a number > 0."""
        check_releases(self.releases)
        if not (isinstance(self.sensitivity, (int, float)) and math.isfinite(self.sensitivity)
                and self.sensitivity > 0):
            raise ParameterError(f"a release's L2 sensitivity must be a number > 0, got {self.sensitivity!r}")

    @property
    def sigma(self) -> float:
        """The noise standard deviation of every release: z(epsilon, delta) x sensitivity x sqrt(releases)."""
        multiplier = gaussian_noise_multiplier(self.epsilon, self.delta)
        return multiplier * self.sensitivity * math.sqrt(self.releases)

    def totals_after(self, releases: int) -> dict[str, float]:
        """Epsilon at the plan's delta of a row that took part in `releases` releases (0 for none)."""
        return {"epsilon_total": gaussian_total(self.sigma, self.sensitivity, releases, self.delta)}

    def sigma_for(self, sensitivity: float, releases: int) -> float:
        """The noise of a release of L2 `sensitivity` that counts as `releases` of the plan's releases.

        `releases` Gaussian releases of noise multiplier m = sigma / sensitivity compose to one of multiplier
        m / sqrt(releases) (see the module doc): that multiplier, times the release's own sensitivity.
        """
        return self.sigma / self.sensitivity * sensitivity / math.sqrt(releases)

    def terms(self) -> dict:
        """The mechanism and its parameters: public, and the same for every party under the same plan."""
        return {"mechanism": "gaussian", "sigma": self.sigma, "l2_sensitivity": self.sensitivity,
                "planned_releases_per_row": self.releases, "epsilon_budget": self.epsilon,
                "delta": self.delta}


def gaussian_total(sigma: float, sensitivity: float, releases: int, delta: float) -> float:
    """Epsilon at `delta` of `releases` Gaussian releases of noise `sigma`, L2 `sensitivity` (0 for none)."""
    if releases == 0:
        return 0.0
    return gaussian_epsilon(sigma / (sensitivity * math.sqrt(releases)), delta)


def recompute_gaussian(stated: dict) -> dict[str, float]:
    """The accountant's totals for a stated Gaussian ledger, from its mechanism's parameters alone."""
    return {"epsilon_total": gaussian_total(float(stated["sigma"]), float(stated["l2_sensitivity"]),
                                            int(stated["planned_releases_per_row"]), float(stated["delta"]))}


PlanT = TypeVar("PlanT", bound=ReleasePlan)


@dataclass
class PrivacyLedger(Generic[PlanT]):
    """What one party released under its plan: the releases each row took part in, at most the plan's.

    `charge(rows_in_release)` records one release (its noise is the plan's sigma) that the busiest row took
    part in `rows_in_release` times (FET: once per tree of the batch it is still growing in), and refuses it,
    before anything is released, when that would take a row past the plan.
    """

    plan: PlanT
    releases_per_row: int = 0
    """The most releases one row has taken part in (a worst-case row's count: every row's is at most this)."""
    queries: int = 0

    def charge(self, times: int, what: str) -> None:
        """Record a release the busiest row takes part in `times` times; refuse one past the plan."""
        if times < 0:
            raise ParameterError(f"{what}: a row takes part in a release at least 0 times, got {times}")
        if self.releases_per_row + times > self.plan.releases:
            raise ParameterError(
                f"{what}: the privacy budget (epsilon {self.plan.epsilon:g}, delta {self.plan.delta:g}) is "
                f"spent: a row would take part in {self.releases_per_row + times} releases, its plan has "
                f"{self.plan.releases}; nothing more is released")
        self.releases_per_row += times
        self.queries += 1

    def epsilon_spent(self) -> float:
        """Epsilon at the plan's delta of what the busiest row took part in so far (0 before any release)."""
        return self.plan.epsilon_after(self.releases_per_row)

    def to_dict(self) -> dict:
        """The party's own report: the plan's terms, what the busiest row took part in and its epsilon.

        Data-dependent (the busiest row's releases): it stays with the party; what it states to the master
        is the plan's `summary`.
        """
        return {**self.plan.terms(), "releases_per_row": self.releases_per_row, "queries": self.queries,
                **self.plan.totals_after(self.releases_per_row)}
