"""The master's one-pass count checks (`fedcore/horizontal/counts.py`) on arrays, without a federation.

The federated hostile-count tests corrupt open node 0; here the first bad node is a later one, and unsigned
values of 2**63 and more are refused (not wrapped into range).
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.errors import ProtocolError
from fedcore.horizontal.counts import CountLedger, check_bit_sums


def _counts(dtype=np.uint16) -> np.ndarray:
    """(A=4, k=3, 2, C=5) class counts of 4 roots of 20 rows each, every candidate splitting them its way."""
    rng = np.random.default_rng(0)
    own = rng.multinomial(20, np.full(5, 0.2), size=4)  # (A, C) each root's class counts
    left = np.stack([[rng.integers(0, c + 1) for c in node] for node in own for _ in range(3)])
    left = left.reshape(4, 3, 5)
    return np.stack([left, own[:, None, :] - left], axis=2).astype(dtype)


@pytest.mark.parametrize("dtype", [np.uint16, np.int64])
def test_valid_counts_pass(dtype) -> None:
    counts = _counts(dtype)
    counts.flags.writeable = False  # as received: a read-only view of the message
    CountLedger().check("party 'a'", "c", counts, 20)


def test_the_first_bad_node_is_named() -> None:
    counts = _counts()
    counts[2, 1, 0, 3] += 1  # node 2's second candidate counts one row more
    counts[3, 2, 1, 0] += 1
    with pytest.raises(ProtocolError, match=r"^party 'a': c: the two branches of the 3 candidates of open "
                                            r"node 2 add up to different counts; every candidate splits "
                                            r"the same rows$"):
        CountLedger().check("party 'a'", "c", counts, 20)


def test_a_short_root_and_a_changed_child_are_named() -> None:
    counts = _counts()
    with pytest.raises(ProtocolError, match=r"^party 'a': c: the branches of root 0 add up to 20 rows, not "
                                            r"the 21 declared in hello$"):
        CountLedger().check("party 'a'", "c", counts, 21)
    ledger = CountLedger()
    ledger.check("party 'a'", "c", counts, 20)
    # nodes 1 and 3 split on candidates 0 and 2; all four children stay open
    ledger.advance(np.array([1, 3]), np.array([0, 0, 0, 2]), np.ones(4, bool))
    children = np.stack([counts[1, 0], counts[3, 2]]).reshape(4, 5)  # the next level's own counts
    nxt = np.zeros((4, 1, 2, 5), np.uint16)
    nxt[:, 0, 0] = children
    ledger.check("party 'a'", "c", nxt.copy(), 20)
    ledger = CountLedger()
    ledger.check("party 'a'", "c", counts, 20)
    ledger.advance(np.array([1, 3]), np.array([0, 0, 0, 2]), np.ones(4, bool))
    nxt[2, 0, 0, 0] += 1
    with pytest.raises(ProtocolError, match=r"^party 'a': c: open node 2 holds other counts than the branch "
                                            r"that made it"):
        ledger.check("party 'a'", "c", nxt, 20)


def test_a_huge_unsigned_count_is_out_of_range() -> None:
    counts = _counts(np.uint64)
    huge = 2**63 + 3
    counts[1, 0, 0, 0] = np.uint64(huge)
    with pytest.raises(ProtocolError, match=rf"^party 'a': c holds a count of {huge}, outside \[0, 20\], "):
        CountLedger().check("party 'a'", "c", counts, 20)


def test_bit_sums_name_their_first_bad_node() -> None:
    sizes = np.full((3, 2, 2), 4, np.uint8)
    bits = np.zeros((3, 2, 2, 6), np.uint8)
    bits[:, :, 0, :] = 2  # every candidate's branches add up to 4 bits per position
    bits[:, :, 1, :] = 2
    check_bit_sums("party 'b'", bits, sizes)
    unequal = bits.copy()
    unequal[2, 1, 0, 5] = 1
    with pytest.raises(ProtocolError, match=r"^party 'b': fet_bit_sums.bit_sums: the two branches of the "
                                            r"candidates of open node 2 add up to different bit sums"):
        check_bit_sums("party 'b'", unequal, sizes)
    outside = unequal.copy()
    outside[1, 0, 1, 0] = 5
    with pytest.raises(ProtocolError, match=r"^party 'b': fet_bit_sums.bit_sums at open node 1 holds a bit "
                                            r"sum outside \[0, its branch's size\]"):
        check_bit_sums("party 'b'", outside, sizes)
    wide = bits.astype(np.uint64)
    wide[1, 1, 1, 1] = np.uint64(2**64 - 1)  # -1 as int64: refused, not taken as a small sum
    with pytest.raises(ProtocolError, match="at open node 1 holds a bit sum outside"):
        check_bit_sums("party 'b'", wide, sizes.astype(np.uint64))
