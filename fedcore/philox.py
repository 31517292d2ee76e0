"""Philox4x64-10 (Salmon et al., SC 2011) in numba: the random words at a counter, under a secret key.

A counter-based generator: the four 64-bit words of counter (c0, c1, c2, c3) are a pure function of the
counter and the 128-bit key, so a party computes the words of any row it holds (c1 = row, c2 and c3 what
else addresses the draw, c0 = 0, 1, ... for its words) without drawing anybody else's, on any worker, in any
order. Integer arithmetic only: the same words on every CPU. Word i of the stream at (c1, c2, c3) is lane
i % 4 of counter (i // 4, c1, c2, c3): numpy's `np.random.Philox(key=key, counter=n - 1).random_raw(...)`
from n = c1 * 2**64 + c2 * 2**128 + c3 * 2**192 gives the same words (numpy counts before each block);
`tests/test_philox.py` checks it.

A kernel costs about as much per word as numpy's PCG64 `random_raw` (the 64 x 64 -> 128-bit products
are one machine instruction each, through `_mulhilo`).
"""

from __future__ import annotations

from typing import Any

import numba as nb
import numpy as np
from llvmlite import ir  # type: ignore[import-untyped]
from numba import types
from numba.extending import intrinsic

_M0 = np.uint64(0xD2E7470EE14C6C93)
_M1 = np.uint64(0xCA5A826395121157)
_W0 = np.uint64(0x9E3779B97F4A7C15)
_W1 = np.uint64(0xBB67AE8584CAA73B)
ROUNDS = 10
"""numpy's and Random123's default: the full-strength Philox4x64."""


def _mulhilo_ir(typingctx, a, b):
    """(high, low) 64-bit halves of the 128-bit product a * b of two uint64: one machine multiply."""
    signature = types.UniTuple(types.uint64, 2)(types.uint64, types.uint64)

    def codegen(context, builder, sig, args):
        wide = ir.IntType(128)
        product = builder.mul(builder.zext(args[0], wide), builder.zext(args[1], wide))
        high = builder.trunc(builder.lshr(product, ir.Constant(wide, 64)), ir.IntType(64))
        low = builder.trunc(product, ir.IntType(64))
        return context.make_tuple(builder, sig.return_type, (high, low))

    return signature, codegen


_mulhilo: Any = intrinsic(_mulhilo_ir)
"""`_mulhilo_ir` as numba calls it from compiled code: _mulhilo(a, b) -> (high, low)."""


@nb.njit(cache=True, inline="always")
def block(c0: np.uint64, c1: np.uint64, c2: np.uint64, c3: np.uint64, k0: np.uint64,
          k1: np.uint64) -> tuple[np.uint64, np.uint64, np.uint64, np.uint64]:
    """The four words of counter (c0, c1, c2, c3) under key (k0, k1): ten Philox rounds."""
    for r in range(ROUNDS):
        if r:
            k0 += _W0
            k1 += _W1
        high0, low0 = _mulhilo(_M0, c0)
        high1, low1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = high1 ^ c1 ^ k0, low1, high0 ^ c3 ^ k1, low0
    return c0, c1, c2, c3


@nb.njit(cache=True)
def word(key: np.ndarray, i: int, c1: np.uint64, c2: np.uint64, c3: np.uint64) -> np.uint64:
    """Word i of the stream at (c1, c2, c3) under `key`, alone (for draws of a varying length)."""
    return block(np.uint64(i // 4), c1, c2, c3, key[0], key[1])[i % 4]

