"""Boosting's (g, h) and regression targets on a power-of-two grid, so that every sum of them is exact.

Each round the label holder rounds its rows' gradients to multiples of 2^e_g and hessians (upwards, so that a
positive hessian stays positive) to multiples of 2^e_h, where 2^(e + P) is the least power of two above the
round's largest |g| (h), and P = 53 - bit_length(n_rows) are the precision bits. Each row is then an integer
q with |q| <= 2^P times 2^e, and a sum over any of the n rows is an integer below 2^53 times 2^e: exact in
float64 whatever the order, the rows that share a block or the CPU, and equal to the integer sum an encrypted
histogram decrypts to. So plain and encrypted boosting (and one party or many) sum the same numbers.

Why a scale per round, not a fixed one: squared error's gradients m - y have no bound a loss gives (margins
can leave the labels' range), so a fixed scale would need a refusal mid-training; the round's own maximum
cannot overflow and keeps P bits relative to it (37 bits at 50,000 rows; XGBoost keeps float32 gradients, 24).
The exponents stay at the label holder. Packed for encryption, a row's slots are (q_g + 2^P, q_h): both
non-negative, at most 2^(P+1) and 2^P, so a bin's sums take at most 54 and 53 bits (`slot_widths`).

A regression forest's targets take the same grid once, when the label holder reads them (`fixed_targets`):
its histograms' sums of weight x target are then exact, so a vertical party's rows on Dask add up blocks'
histograms to the in-process ones bit for bit (issue #29).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedcore.errors import ParameterError
from fedcore.trees.criteria import GRADIENT

EXACT_BITS = 53
"""float64's integer range: every integer below 2^53 is exact."""
MIN_PRECISION_BITS = 24
"""The least precision accepted: float32's, what XGBoost keeps of each gradient (2^29 rows at most)."""


def precision_bits(n_rows: int, what: str = "boosting sums gradients") -> int:
    """P for `n_rows` rows: n_rows x 2^P < 2^53; ParameterError (naming `what`) if P < MIN_PRECISION_BITS."""
    bits = EXACT_BITS - max(int(n_rows), 1).bit_length()
    if bits < MIN_PRECISION_BITS:
        raise ParameterError(f"{what} exactly over at most {2**29 - 1:,} rows (2^53 / 2^24: "
                             f"24 bits each), got {n_rows:,}: train on a sample of the rows")
    return bits


def _exponent(values: np.ndarray, bits: int) -> int:
    """The exponent e with max|values| < 2^(e + bits) (-bits when all are zero)."""
    largest = float(np.max(np.abs(values))) if values.size else 0.0
    return (math.frexp(largest)[1] if largest > 0 else 0) - bits


@dataclass(frozen=True)
class GradientGrid:
    """One round's grid: precision bits and the exponents of g's and h's steps."""

    bits: int
    g_exponent: int
    h_exponent: int

    criterion = GRADIENT
    n_stats = 3

    @classmethod
    def of(cls, gh: np.ndarray, n_rows: int) -> tuple[GradientGrid, np.ndarray]:
        """The grid of a round's (g, h) (..., n_rows, 2) and their integers q (same shape, int64)."""
        bits = precision_bits(n_rows)
        grid = cls(bits, _exponent(gh[..., 0], bits), _exponent(gh[..., 1], bits))
        q = np.empty(gh.shape, np.int64)
        q[..., 0] = np.rint(np.ldexp(gh[..., 0], -grid.g_exponent))
        q[..., 1] = np.ceil(np.ldexp(gh[..., 1], -grid.h_exponent))
        return grid, q

    def values(self, q: np.ndarray) -> np.ndarray:
        """The grid's float64 (g, h) of integers q: what every mode sums."""
        out = np.empty(q.shape, np.float64)
        out[..., 0] = np.ldexp(q[..., 0].astype(np.float64), self.g_exponent)
        out[..., 1] = np.ldexp(q[..., 1].astype(np.float64), self.h_exponent)
        return out

    @property
    def g_offset(self) -> int:
        """What a packed gradient slot adds to q_g so that it is never negative."""
        return 1 << self.bits

    def slots(self, q: np.ndarray) -> np.ndarray:
        """Each row's packed slots (q_g + 2^P, q_h), (rows, 2) Python ints, from q (rows, 2)."""
        out = np.empty(q.shape, dtype=object)
        out[:, 0] = [v + self.g_offset for v in q[:, 0].tolist()]
        out[:, 1] = q[:, 1].tolist()
        return out

    def statistics(self, sums: np.ndarray) -> np.ndarray:
        """Per bin (slot sum of g, slot sum of h, rows) as Python ints -> (count, G, H) float64, exactly."""
        out = np.empty((len(sums), 3), dtype=np.float64)
        for row, (s_g, s_h, count) in enumerate(sums.tolist()):
            out[row] = (float(count), math.ldexp(float(s_g - count * self.g_offset), self.g_exponent),
                        math.ldexp(float(s_h), self.h_exponent))
        return out


def exact_sums(gh: np.ndarray) -> bool:
    """Whether every sum of a round's (g, h) (trees, rows, 2) over rows of a tree, in any order, is exact.

    True when each tree's g (and h) are integer multiples of a power of two 2^s with rows x max|g| below
    2^53 x 2^s: what a round's grid gives (q 2^e with |q| <= 2^P, rows x 2^P < 2^53). A passive party
    checks the round relayed to it, so that its sums over its rows, in process or over blocks on a Dask
    cluster, are the same numbers whatever the order.
    """
    n_rows = gh.shape[-2]
    if n_rows == 0:
        return True
    for values in np.moveaxis(np.asarray(gh, np.float64), -1, -2).reshape(-1, n_rows):
        nonzero = np.abs(values[values != 0])
        if nonzero.size:
            mantissa, exponent = np.frexp(nonzero)
            digits = np.ldexp(mantissa, EXACT_BITS).astype(np.int64)  # value = digits 2^(exponent - 53)
            lowest = exponent - EXACT_BITS + np.frexp((digits & -digits).astype(np.float64))[1] - 1
            if n_rows * math.ldexp(float(nonzero.max()), -int(lowest.min())) >= 2.0**EXACT_BITS:
                return False
    return True


TARGETS = "a regression forest sums its targets"
"""What `fixed_targets` says when a table has too many rows for exact sums (`precision_bits`)."""


def fixed_targets(y: np.ndarray) -> np.ndarray:
    """Regression targets rounded to the grid of their table: every forest's sums of them are exact.

    With P = `precision_bits(n)` for the n = len(y) rows and 2^(e + P) the least power of two above max|y|,
    each target becomes q 2^e, q = round(y / 2^e) an integer with |q| < 2^P (the top is clipped to 2^P - 1,
    so the grid of the rounded targets is the same: rounding twice is rounding once). A forest's node weighs
    at most n (its bootstrap draws, n_draws <= n, or n rows of weight 1), so any sum of weight x target,
    over any rows in any order, is an integer of magnitude below n 2^P < 2^53 times 2^e: exact in float64
    (as long as it is finite: |y| below about 2^(1024 - log2 n)), and the same on one machine or summed
    over blocks of rows on a Dask cluster. Missing targets stay NaN.
    """
    y = np.asarray(y, np.float64)
    bits = precision_bits(len(y), TARGETS)
    finite = y[np.isfinite(y)]
    exponent = _exponent(finite, bits)
    top = float(2**bits - 1)
    return np.ldexp(np.clip(np.rint(np.ldexp(y, -exponent)), -top, top), exponent)


def slot_widths(n_rows: int) -> tuple[int, int]:
    """A packed row's slot bits and top value for `n_rows` rows: sums over every row fit (no carry)."""
    bits = precision_bits(n_rows)
    return ((1 << (bits + 1)) * max(n_rows, 1)).bit_length(), 1 << bits
