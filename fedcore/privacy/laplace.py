"""Global differential privacy by the Laplace mechanism, and an accountant that composes the budget.

A party adds Laplace(0, sensitivity / epsilon) noise to each count it reports, so one sample changes
any answer's distribution by at most a factor e^epsilon. Budgets compose by basic sequential
composition: the total epsilon is the sum over all queries answered.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numba as nb
import numpy as np

from fedcore.errors import ParameterError

_HINT = "smaller epsilon = more noise and stronger privacy, larger = less noise (typical values 0.1 to 10)"

LAPLACE_NOISE_BOUND = 53 * math.log(2)
"""No noise `laplace_counts` adds (nor NumPy's `Generator.laplace`, any bit generator) exceeds this many
scales in magnitude, about 36.74: its uniform u is a multiple of 2^-53 in (0, 1), and the noise is
scale * log(u + u) below 1/2 (u + u >= 2^-52), else -scale * log(2 - u - u), which float64 computes as at
least 2^-53 (2 - u rounds to 1 at u = 1 - 2^-53). The horizontal master refuses noisy counts further than
this from any count a party could hold (`fedcore.horizontal.counts`)."""


def check_epsilon(epsilon: float, what: str = "epsilon") -> float:
    """Return `epsilon` as a float, refusing anything that is not a finite number > 0."""
    valid = (isinstance(epsilon, numbers.Real) and not isinstance(epsilon, (bool, np.bool_))
             and math.isfinite(epsilon) and epsilon > 0)
    if not valid:
        raise ParameterError(f"{what} must be a finite number > 0, got {epsilon!r}: {_HINT}")
    return float(epsilon)


def laplace_counts(counts: np.ndarray, epsilon: float, rng: np.random.Generator,
                   sensitivity: float = 1.0) -> np.ndarray:
    """Counts plus independent Laplace(0, sensitivity / epsilon) noise, as float64 of the same shape.

    The noise is exactly `rng.laplace(0, scale, counts.shape)`, value for value, and leaves `rng` where that
    call would; it is computed in one compiled pass from the generator's raw words (`_add_laplace`).
    """
    epsilon = check_epsilon(epsilon)
    sensitivity = check_epsilon(sensitivity, "sensitivity")
    counts = np.asarray(counts, dtype=np.float64)
    scale = sensitivity / epsilon
    if not isinstance(rng.bit_generator, np.random.PCG64):  # the raw-word path assumes PCG64's next_double
        return counts + rng.laplace(0.0, scale, size=counts.shape)
    state = rng.bit_generator.state
    out = np.ascontiguousarray(counts, dtype=np.float64).reshape(-1).copy()
    if not _add_laplace(out, rng.bit_generator.random_raw(out.size), scale):
        rng.bit_generator.state = state  # a uniform of exactly 0 (p = 2^-53 per draw): NumPy redraws it
        return counts + rng.laplace(0.0, scale, size=counts.shape)
    return out.reshape(counts.shape)


@nb.njit(cache=True, parallel=True)
def _add_laplace(out: np.ndarray, words: np.ndarray, scale: float) -> bool:
    """Add NumPy's `random_laplace(0, scale)` of each raw PCG64 word to `out`.

    A word's uniform is next_double: its top 53 bits. False when a word gives the uniform 0, which NumPy
    rejects and redraws (the caller falls back).
    """
    zeros = 0  # a prange reduction: a plain flag set inside the loop would stay thread-private
    for i in nb.prange(out.shape[0]):
        u = (words[i] >> np.uint64(11)) * (1.0 / 9007199254740992.0)
        if u >= 0.5:
            out[i] += 0.0 - scale * math.log(2.0 - u - u)
        elif u > 0.0:
            out[i] += 0.0 + scale * math.log(u + u)
        else:
            zeros += 1
    return zeros == 0


@dataclass
class PrivacyAccountant:
    """Records the queries answered under the Laplace mechanism and composes their budget."""

    mechanism: str = "laplace"
    spends: list[tuple[float, int]] = field(default_factory=list)

    def spend(self, epsilon: float, queries: int = 1) -> None:
        """Record `queries` answers, each at `epsilon`."""
        epsilon = check_epsilon(epsilon)
        if not isinstance(queries, numbers.Integral) or isinstance(queries, (bool, np.bool_)) or queries < 1:
            raise ParameterError(f"queries must be an integer >= 1, got {queries!r}")
        self.spends.append((epsilon, int(queries)))

    @property
    def queries(self) -> int:
        """Number of queries answered so far."""
        return sum(n for _, n in self.spends)

    def total_epsilon(self) -> float:
        """Total budget by basic sequential composition: the sum of epsilon over every query."""
        return math.fsum(epsilon * n for epsilon, n in self.spends)

    def to_dict(self) -> dict:
        """JSON-ready summary; epsilon_per_query is None when no query was answered or epsilons differ."""
        distinct = {epsilon for epsilon, _ in self.spends}
        return {
            "mechanism": self.mechanism,
            "queries": self.queries,
            "epsilon_per_query": distinct.pop() if len(distinct) == 1 else None,
            "total_epsilon": self.total_epsilon(),
        }
