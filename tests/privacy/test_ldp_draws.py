"""LDP's draws by position (fedcore.privacy.ldp_draws) against their documented rules, on numpy's Philox.

Row r's permanent bits come from the words of stream (r, 0, 0) under the permanent key; its instant report in
tree slot s at report t from stream (r, s, t) under the instant key: bit b is 1 when the 63 bits made of
quarter b % 4 of word b // 4 (highest first) and the top 47 bits of word ceil(n_bits / 4) + b fall below the
bit's threshold. The kernels read the second word only on a tie of the first 16 bits: forced here.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.privacy import ldp_draws
from fedcore.privacy.ldp import LabelLDP
from fedcore.randomness import counter_key
from tests.test_philox import numpy_words

KEY = counter_key(5, "ldp_instant")


def reference_instant(permanent: np.ndarray, row: int, slot: int, report: int, if_one: int,
                      if_zero: int) -> list[int]:
    n_bits = len(permanent)
    n_words = -(-n_bits // 4)
    words = [int(w) for w in numpy_words(KEY, row, slot, report, n_words + n_bits)]
    bits = []
    for b in range(n_bits):
        quarter = (words[b // 4] >> (48 - 16 * (b % 4))) & 0xFFFF
        uniform = (quarter << 47) | (words[n_words + b] >> 17)
        bits.append(int(uniform < (if_one if permanent[b] else if_zero)))
    return bits


def _instant(permanent: np.ndarray, first_row: int, slot: int, report: int, if_one: int,
             if_zero: int) -> np.ndarray:
    """Each row's report by the per-row kernel the party's sums draw with (`rowwork.ldp_report_sums`)."""
    out = np.empty(permanent.shape, dtype=np.uint8)
    for i in range(permanent.shape[0]):
        ldp_draws.instant_report(permanent[i], KEY, np.uint64(first_row + i), np.uint64(slot),
                                 np.uint64(report), np.uint64(if_one), np.uint64(if_zero), out[i])
    return out


@pytest.mark.parametrize("n_bits", [2, 5, 32, 64])
def test_instant_reports_follow_the_rule(n_bits) -> None:
    permanent = np.random.default_rng(n_bits).integers(0, 2, (40, n_bits), dtype=np.uint8)
    if_one, if_zero = int(ldp_draws.threshold63(0.8)), int(ldp_draws.threshold63(0.2))
    got = _instant(permanent, 1000, 3, 9, if_one, if_zero)
    for i in range(40):
        assert got[i].tolist() == reference_instant(permanent[i], 1000 + i, 3, 9, if_one, if_zero)


def test_a_tie_of_the_first_16_bits_is_decided_by_47_more() -> None:
    n_bits, row, slot, report = 32, 77, 1, 4
    words = [int(w) for w in numpy_words(KEY, row, slot, report, 8 + n_bits)]
    permanent = np.zeros((1, n_bits), dtype=np.uint8)
    permanent[0, 13] = 1  # bit 13 alone compares with if_one: quarter 1 of word 3
    quarter, tail = (words[3] >> 32) & 0xFFFF, words[8 + 13] >> 17
    if_zero = int(ldp_draws.threshold63(0.3))
    outcomes = []
    for low in (0, tail, tail + 1, (1 << 47) - 1):  # the same top 16 bits: the tail decides
        if_one = (quarter << 47) | low
        got = _instant(permanent, row, slot, report, if_one, if_zero)[0]
        assert got.tolist() == reference_instant(permanent[0], row, slot, report, if_one, if_zero)
        outcomes.append(int(got[13]))
    assert outcomes == [0, 0, 1, 1]


def test_permanent_bits_follow_the_rule() -> None:
    key = counter_key(5, "ldp_permanent")
    labels = np.random.default_rng(1).integers(0, 5, 30)
    bloom_ldp = LabelLDP(mechanism="bloom", n_bits=16, n_hashes=2, keep_probability=0.4)
    bloom = bloom_ldp.class_patterns(5)
    keep = int(ldp_draws.threshold63(0.4))
    got = bloom_ldp.permanent_bits(labels, 5, key, first_row=50)
    for i, label in enumerate(labels):
        words = [int(w) for w in numpy_words(key, 50 + i, 0, 0, 16)]
        expected = [int(bloom[label, b]) if w >> 1 < keep else w & 1 for b, w in enumerate(words)]
        assert got[i].tolist() == expected
    krr = LabelLDP(mechanism="krr", report_epsilon=1.0)
    keep = int(ldp_draws.threshold63(krr._krr_keep(5)))
    got = krr.permanent_bits(labels, 5, key, first_row=50)
    for i, label in enumerate(labels):
        words = [int(w) for w in numpy_words(key, 50 + i, 0, 0, 2)]  # no rejection at these odds (5 / 2**64)
        other = words[1] % 4
        expected = label if words[0] >> 1 < keep else other + (other >= label)
        assert got[i].tolist() == np.eye(5, dtype=int)[expected].tolist()
