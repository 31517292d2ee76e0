"""The discrete Gaussian noise of distributed DP: an integer sampler on counters, and the law of sums of it.

PPD-ERT's `secagg-dp` (issue #31; Kairouz, Liu and Steinke, "The Distributed Discrete Gaussian Mechanism",
ICML 2021) adds integer noise to counts that are then masked in an integer ring, so the noise must be an
integer. Each party draws its own, and the master sees only the sum over parties.

**The sampler** (`DiscreteGaussianTable`): the discrete Gaussian p(x) ~ exp(-x^2 / 2 sigma^2) is tabulated
once per sigma in decimal arithmetic (`decimal`: correctly rounded, the same on every machine) as 64-bit
integer widths w(x) = floor(p(x) 2^64) for x != 0, w(0) taking the rest so the widths sum to 2^64 exactly and
the table is symmetric; outcomes whose width is 0 (|x| beyond about 9.4 sigma) are not in it. A draw is one
64-bit word of Philox (`numpy.random.Philox`, keyed by `fedcore.randomness.counter_key`: the project's
counter-based generator) looked up among the cumulative widths. Integers only: the same noise on every CPU.
The sampler's law is exactly the table's, w(x) / 2^64 (within 2^-64 of the ideal discrete Gaussian per
outcome), and the accounting (`fedcore.privacy.distributed`) is of that law itself, not of an ideal one.

**Sums** (`sum_pmf`): the law of n independent draws added up (the noise a count carries summed over
parties, and over the coordinates a row moves), by the discrete Fourier transform of the table's law
raised to the n-th power, read where it exceeds `PMF_FLOOR` of its peak (the rest, below 1e-12 of the
peak, is left to the accountant's pessimistic infinity mass).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal, localcontext
from functools import lru_cache

import numpy as np

from fedcore.errors import ParameterError

RESOLUTION_BITS = 64
"""Each outcome's probability is a whole number of 2^-64: one Philox word per draw."""
TAIL_SIGMAS = 10
"""The table is computed out to 10 sigma: beyond about 9.4 sigma every width is 0 (p < 2^-64)."""
PMF_FLOOR = 1e-12
"""Where a sum's law is read: values below this fraction of its peak are dropped (floating-point noise of the
transform is about 1e-16 of the peak); the accountant counts what is dropped as infinite privacy loss."""
SUM_SIGMAS = 14
"""How far (in standard deviations of the sum) the transform's circle reaches: aliasing below e^-98."""


@dataclass(frozen=True)
class DiscreteGaussianTable:
    """The sampler of one sigma: its outcomes [-reach, reach] and their integer widths (sum 2^64)."""

    sigma: float
    reach: int
    """The largest |noise| the sampler can draw (the master bounds noisy sums by it)."""
    widths: tuple[int, ...]
    """w(-reach), ..., w(reach): Python ints summing to 2^64."""

    def pmf(self) -> np.ndarray:
        """The sampler's exact law as float64 probabilities over -reach..reach."""
        return np.array([w / 2.0 ** RESOLUTION_BITS for w in self.widths])

    @property
    def _thresholds(self) -> np.ndarray:
        return _thresholds(self.widths)

    def draw(self, key: np.ndarray, n: int) -> np.ndarray:
        """`n` draws (int64) from the Philox words under the 128-bit `key` (`counter_key`), from counter 0."""
        words = np.random.Philox(key=key).random_raw(n)
        if len(self.widths) > 32 and self.widths[self.reach] >> (64 - GUIDE_BITS):
            return _outcomes(self.widths, words) - self.reach  # the guide table: faster, the same outcomes
        return np.searchsorted(self._thresholds, words, side="right").astype(np.int64) - self.reach


GUIDE_BITS = 16
"""A word's top 16 bits name its bucket of the guide table (`_guide`): when the centre's width spans a
bucket (sigma below about 26,000) and the table is not tiny (over 32 outcomes, where a binary search is as
fast), most buckets hold at most one threshold, so most words are placed by two lookups and a comparison."""


@lru_cache(maxsize=32)
def _thresholds(widths: tuple[int, ...]) -> np.ndarray:
    """The cumulative widths but the last (2^64), uint64: a word below the i-th falls in outcome i."""
    cumulative, out = 0, []
    for width in widths[:-1]:
        cumulative += width
        out.append(cumulative)
    return np.array(out, dtype=np.uint64)


WIDE = np.int64(-(1 << 62))
"""The base of a bucket that holds more than one threshold: its words are searched."""


@lru_cache(maxsize=32)
def _guide(widths: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per bucket of words (top GUIDE_BITS bits): (base, split); a word's outcome is base + (word >= split).

    A bucket with no threshold in it: split its first word, base one less than the thresholds below it; with
    one: that threshold, base the thresholds below the bucket; with more: base WIDE (`_outcomes` searches).
    """
    thresholds = _thresholds(widths)
    shift = np.uint64(64 - GUIDE_BITS)
    first = np.arange(1 << GUIDE_BITS, dtype=np.uint64) << shift
    last = first + ((np.uint64(1) << shift) - np.uint64(1))
    below = np.searchsorted(thresholds, first, side="left").astype(np.int64)  # thresholds < first word
    upto = np.searchsorted(thresholds, last, side="right").astype(np.int64)  # thresholds <= last word
    inside = upto - below
    split = np.where(inside == 1, thresholds[np.minimum(below, thresholds.size - 1)], first)
    base = np.where(inside == 0, below - 1, below)
    return np.where(inside > 1, WIDE, base), split


def _outcomes(widths: tuple[int, ...], words: np.ndarray) -> np.ndarray:
    """Each word's outcome index, int64: how many thresholds are <= it (numpy's searchsorted, side right).

    Most buckets hold at most one threshold (`_guide`): one comparison places their words; the few words of
    buckets holding more (the tails) are searched. Exact, at about a quarter of the binary search's time.
    """
    base, split = _guide(widths)
    bucket = words >> np.uint64(64 - GUIDE_BITS)
    out = base[bucket] + (words >= split[bucket])
    wide = np.flatnonzero(out < 0)
    if wide.size:
        out[wide] = np.searchsorted(_thresholds(widths), words[wide], side="right")
    return out


@lru_cache(maxsize=32)
def table(sigma: float) -> DiscreteGaussianTable:
    """The sampler of the discrete Gaussian of scale `sigma` (> 0), computed in 40-digit decimals."""
    if not (isinstance(sigma, float) and math.isfinite(sigma) and sigma > 0):
        raise ParameterError(f"a discrete Gaussian's sigma must be a number > 0, got {sigma!r}")
    with localcontext() as context:
        context.prec = 40
        two_variance = 2 * Decimal(sigma) ** 2
        limit = math.ceil(TAIL_SIGMAS * sigma) + 1
        mass = [(-Decimal(x * x) / two_variance).exp() for x in range(limit + 1)]
        total = mass[0] + 2 * sum(mass[1:])
        scale = Decimal(2) ** RESOLUTION_BITS / total
        side = [int(m * scale) for m in mass[1:]]  # floor: the values are positive
    while side and side[-1] == 0:
        side.pop()
    centre = 2 ** RESOLUTION_BITS - 2 * sum(side)
    widths = (*reversed(side), centre, *side)
    return DiscreteGaussianTable(sigma, len(side), widths)


@lru_cache(maxsize=64)
def sum_pmf(sigma: float, n: int) -> tuple[int, np.ndarray]:
    """The law of the sum of `n` draws of `table(sigma)`: (first outcome, probabilities from it on).

    n = 1 is the table's own law; larger n the transform's, where it exceeds `PMF_FLOOR` of its peak.
    """
    one = table(sigma)
    if n == 1:
        return -one.reach, one.pmf()
    half = min(n * one.reach, math.ceil(SUM_SIGMAS * sigma * math.sqrt(n)) + one.reach)
    size = 1 << (2 * half + 1).bit_length()
    ring = np.zeros(size)
    outcomes = np.arange(-one.reach, one.reach + 1)
    ring[outcomes % size] = one.pmf()
    law = np.fft.irfft(np.fft.rfft(ring) ** n, size)
    values = law[np.arange(-half, half + 1) % size]
    kept = np.flatnonzero(values > PMF_FLOOR * values.max())
    first, last = int(kept[0]), int(kept[-1])
    return first - half, np.maximum(values[first:last + 1], 0.0)
