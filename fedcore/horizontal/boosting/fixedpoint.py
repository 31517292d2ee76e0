"""Gradients and hessians in fixed point, so that sums over parties are exact whatever the layout.

Every party quantises its rows' (g, h) to integers q = rint(g * 2**FRACTION_BITS) before it sums them; the
single-party run does the same, so integer sums (masked or plain, in any order) equal the one table's and
1, 2 or 3 parties grow the same bytes. The master turns the summed integers back into floats
(`dequantise`); a float64 holds every sum below 2**53 exactly and rounds larger ones the same way everywhere.
The secure-aggregation ring is 64 bits: a party refuses gradients whose sum over its rows could reach
2**62 / P in magnitude (`check_range`), so no sum over the P parties wraps.
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


def check_range(party: str, q: np.ndarray, n_parties: int) -> None:
    """Refuse fixed-point gradients whose sum over this party's rows could wrap the ring with P parties."""
    limit = (1 << (RING_BITS - 2)) // max(n_parties, 1)
    total = int(np.abs(q).sum(axis=-2, dtype=np.float64).max(initial=0.0))
    if total >= limit:
        raise ProtocolError(f"party {party!r}: its gradients sum to about 2**{np.log2(total):.0f} in fixed "
                            f"point, above the 2**{np.log2(limit):.0f} a {RING_BITS}-bit ring holds for "
                            f"{n_parties} parties; scale the label down (its contract's range)")
