"""Gradients and hessians in fixed point, so that sums over parties are exact whatever the layout.

Every party quantises its rows' (g, h) to integers q = rint(g * 2**FRACTION_BITS) before it sums them; the
single-party run does the same, so integer sums (masked or plain, in any order) equal the one table's and
1, 2 or 3 parties grow the same bytes. The master turns the summed integers back into floats
(`dequantise`); a float64 holds every sum below 2**53 exactly and rounds larger ones the same way everywhere.
The secure-aggregation ring is 64 bits: a party refuses gradients whose sum over its rows could reach
2**62 / P in magnitude (`check_totals`), so no sum over the P parties wraps.
"""

from __future__ import annotations

import numpy as np

from fedcore.errors import ProtocolError

FRACTION_BITS = 24
"""Fraction bits of the fixed point: g and h are kept to 2**-24 (about 6e-8)."""
RING_BITS = 64
"""The ring horizontal boosting's histograms are masked in."""


def quantise(gh: np.ndarray) -> np.ndarray:
    """(g, h) per row as int64 fixed point (round half to even, the same on every CPU)."""
    return np.rint(np.ldexp(np.asarray(gh, dtype=np.float64), FRACTION_BITS)).astype(np.int64)


def dequantise(stats: np.ndarray) -> np.ndarray:
    """Summed (count, G, H) statistics as float64: the count as is, G and H scaled back."""
    out = np.asarray(stats, dtype=np.int64).astype(np.float64)
    out[..., 1:] = np.ldexp(out[..., 1:], -FRACTION_BITS)
    return out


def abs_totals(q: np.ndarray) -> np.ndarray:
    """Exact sums of |q| over the rows (axis -2) per leading slot and column, as Python ints (object array).

    Exact, so that the totals of blocks of rows add up to the whole table's whatever the blocks: each |q| is
    split into 32-bit halves summed apart in uint64 (no half-sum wraps below 2**32 rows).
    """
    a = np.abs(np.asarray(q, dtype=np.int64)).astype(np.uint64)  # |-2**63| wraps to 2**63: still exact
    low = (a & np.uint64(0xFFFFFFFF)).sum(axis=-2, dtype=np.uint64)
    high = (a >> np.uint64(32)).sum(axis=-2, dtype=np.uint64)
    totals = np.empty(low.size, dtype=object)
    for i, (h, lo) in enumerate(zip(high.ravel().tolist(), low.ravel().tolist(), strict=True)):
        totals[i] = (h << 32) + lo
    return totals.reshape(low.shape)


def check_totals(party: str, totals: np.ndarray, n_parties: int) -> None:
    """Refuse fixed-point values whose sum over this party's rows could wrap the ring with P parties.

    `totals`: the |q| totals of the party's rows (`abs_totals`; on Dask, its blocks' summed).
    """
    limit = (1 << (RING_BITS - 2)) // max(n_parties, 1)
    total = max(totals.ravel().tolist(), default=0)
    if total >= limit:
        raise ProtocolError(f"party {party!r}: its gradients sum to about 2**{np.log2(float(total)):.0f} "
                            f"in fixed point, above the 2**{np.log2(limit):.0f} a {RING_BITS}-bit ring holds "
                            f"for {n_parties} parties; scale the label down (its contract's range)")
