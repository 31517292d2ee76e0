"""Horizontal boosting's fixed point: exact |q| totals that blocks add up, and the ring's range refusal."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.errors import ProtocolError
from fedcore.horizontal.boosting.fixedpoint import RING_BITS, abs_totals, check_totals


def test_abs_totals_are_exact_and_blocks_of_rows_add_up_to_the_table() -> None:
    rng = np.random.default_rng(0)
    q = rng.integers(-(2**62), 2**62, size=(2, 1000, 3), dtype=np.int64)
    q[0, 0, 0] = -(2**63)  # its absolute value does not fit int64: still exact
    want = np.array([[sum(abs(int(v)) for v in q[s, :, c]) for c in range(3)] for s in range(2)],
                    dtype=object)
    assert (abs_totals(q) == want).all()
    blocks = [abs_totals(q[:, a:b]) for a, b in ((0, 1), (1, 400), (400, 1000))]
    assert (sum(blocks[1:], blocks[0]) == want).all()
    assert max(want.ravel()) > 2**64  # beyond any 64-bit accumulator


def test_totals_the_ring_cannot_hold_for_the_parties_are_refused() -> None:
    limit = (1 << (RING_BITS - 2)) // 3
    check_totals("a", np.array([[limit - 1]], dtype=object), 3)
    with pytest.raises(ProtocolError, match=r"^party 'a': its gradients sum to about 2\*\*60 in fixed point, "
                                            r"above the 2\*\*60 a 64-bit ring holds for 3 parties; scale the "
                                            r"label down \(its contract's range\)$"):
        check_totals("a", np.array([[1, limit]], dtype=object), 3)
