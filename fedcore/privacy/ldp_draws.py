"""Label LDP's random draws by position: a row's permanent response, the report of (report, tree slot, row).

The words come from the counter-based `fedcore.philox` under the party's two secret keys
(`fedcore.randomness.counter_key` of its noise seed, "ldp_permanent" and "ldp_instant"):

* the permanent response of row r (Bloom, k-RR, OUE): the words of the stream at (r, 0, 0) under the
  permanent key;
* the instant report of row r in tree slot s at the party's t-th report (one per level it answers): the
  words of the stream at (r, s, t) under the instant key, 16 bits per report bit (`instant_report`).

Row r is the row's position in the party's canonical row order, so a row's words do not depend on which
other rows are drawn with it: a Dask block draws exactly its own rows' words (`fedcore.compute.dask_rows`),
the in-process party the same words for the same rows, and a row in no open node draws none. Bits come
from integer comparisons only (the same on every CPU): a bit with probability p is 1 when 63 random bits
fall below p * 2**63 (`threshold63`).
"""

from __future__ import annotations

import fractions

import numba as nb
import numpy as np

from fedcore import philox
from fedcore.errors import ParameterError

CERTAIN = np.uint64(1 << 63)
"""`threshold63(1.0)`: a comparison that always holds."""


def threshold63(probability: float) -> np.uint64:
    """`probability` * 2**63 as an integer.

    A word's top 63 bits fall below it with exactly this probability (every double >= 2**-10 is a multiple of
    2**-63; smaller ones are truncated, by less than 2**-63).
    """
    return np.uint64(int(fractions.Fraction(probability) * (1 << 63)))


def check_key(key: np.ndarray) -> np.ndarray:
    """A 128-bit key as `fedcore.randomness.counter_key` makes it (2 uint64), or ParameterError.

    Checked before any kernel sees it: numba would compile other integer types into other words.
    """
    key = np.asarray(key)
    if key.shape != (2,) or key.dtype != np.uint64:
        raise ParameterError(f"key must be 2 uint64 (fedcore.randomness.counter_key), got {key.dtype} "
                             f"{key.shape}")
    return np.ascontiguousarray(key)


_LOW47 = np.uint64((1 << 47) - 1)


@nb.njit(cache=True, inline="always")
def _quarters(word: np.uint64, permanent: np.ndarray, first: int, if_one: np.uint64, if_zero: np.uint64,
              out: np.ndarray) -> bool:
    """Report bits first .. first + 3 from the 16-bit quarters of `word`, highest first.

    Bit b is 1 when its quarter falls below the top 16 bits of its threshold (that of its permanent bit);
    returns whether any quarter equals them (a tie, which `_settle_ties` decides). Branch-free.
    """
    tie = False
    for quarter in range(4):
        b = first + quarter
        if b < permanent.shape[0]:
            chunk = (word >> np.uint64(48 - 16 * quarter)) & np.uint64(0xFFFF)
            top = (if_one if permanent[b] else if_zero) >> np.uint64(47)
            out[b] = chunk < top
            tie |= chunk == top
    return tie


@nb.njit(cache=True)
def _settle_ties(permanent: np.ndarray, key: np.ndarray, row: np.uint64, slot: np.uint64, report: np.uint64,
                 if_one: np.uint64, if_zero: np.uint64, out: np.ndarray) -> None:
    """Decide the bits whose quarter tied its threshold's top 16 bits: by the 47 bits below.

    Those are the top 47 bits of word ceil(n_bits / 4) + b of the stream, for bit b: the 63 random bits
    (quarter, then those) fall below the threshold exactly when a fresh 63-bit word would.
    """
    n_bits = permanent.shape[0]
    n_words = (n_bits + 3) // 4
    for b in range(n_bits):
        threshold = if_one if permanent[b] else if_zero
        word = philox.word(key, b // 4, row, slot, report)
        chunk = (word >> np.uint64(48 - 16 * (b % 4))) & np.uint64(0xFFFF)
        if chunk == threshold >> np.uint64(47):
            low = philox.word(key, n_words + b, row, slot, report) >> np.uint64(17)
            out[b] = low < (threshold & _LOW47)


@nb.njit(cache=True, inline="always")
def instant_report(permanent: np.ndarray, key: np.ndarray, row: np.uint64, slot: np.uint64, report: np.uint64,
                   if_one: np.uint64, if_zero: np.uint64, out: np.ndarray) -> None:
    """The instant report of one row's permanent bits at (row, slot, report), into `out` (0 / 1).

    Bit b is 1 with probability threshold / 2**63, the threshold of its permanent bit: bits 4w .. 4w + 3
    compare the 16-bit quarters of word w of the stream at (row, slot, report) (`_quarters`), and a quarter
    equal to its threshold's top 16 bits (probability 2**-16) is decided by 47 more bits (`_settle_ties`):
    exactly as likely as comparing 63 fresh bits, at a quarter of the words. Certain thresholds (k-RR: the
    report is the permanent response) draw no word.
    """
    n_bits = permanent.shape[0]
    if if_one == CERTAIN and if_zero == 0:
        for b in range(n_bits):
            out[b] = permanent[b]
        return
    tie = False
    for g in range((n_bits + 15) // 16):  # a Philox block: 4 words, 16 bits
        w0, w1, w2, w3 = philox.block(np.uint64(g), row, slot, report, key[0], key[1])
        tie |= _quarters(w0, permanent, 16 * g, if_one, if_zero, out)
        tie |= _quarters(w1, permanent, 16 * g + 4, if_one, if_zero, out)
        tie |= _quarters(w2, permanent, 16 * g + 8, if_one, if_zero, out)
        tie |= _quarters(w3, permanent, 16 * g + 12, if_one, if_zero, out)
    if tie:
        _settle_ties(permanent, key, row, slot, report, if_one, if_zero, out)


@nb.njit(cache=True, inline="always")
def _permanent_words(key: np.ndarray, row: np.uint64, words: np.ndarray) -> None:
    """Row `row`'s permanent words into `words`, one per report bit; Bloom and OUE read the same words.

    Word b is word b of the stream at (row, 0, 0) under `key`, four to a Philox block.
    """
    zero = np.uint64(0)
    n_bits = words.shape[0]
    for g in range((n_bits + 3) // 4):
        block = philox.block(np.uint64(g), row, zero, zero, key[0], key[1])
        for lane in range(min(4, n_bits - 4 * g)):
            words[4 * g + lane] = block[lane]


@nb.njit(cache=True, parallel=True)
def permanent_bloom(labels: np.ndarray, bloom: np.ndarray, first_row: int, key: np.ndarray,
                    keep: np.uint64, out: np.ndarray) -> None:
    """The Bloom mechanism's permanent responses of rows first_row, first_row + 1, ... into `out`.

    Bit b keeps the class's Bloom bit when the top 63 bits of word b (`_permanent_words`) fall below `keep`;
    otherwise it is the word's lowest bit, a fair coin independent of that choice.
    """
    n_bits = bloom.shape[1]
    for i in nb.prange(labels.shape[0]):
        words = np.empty(n_bits, dtype=np.uint64)
        _permanent_words(key, np.uint64(first_row + i), words)
        for b in range(n_bits):
            w = words[b]
            out[i, b] = bloom[labels[i], b] if (w >> np.uint64(1)) < keep else w & np.uint64(1)


@nb.njit(cache=True, parallel=True)
def permanent_krr(labels: np.ndarray, n_classes: int, first_row: int, key: np.ndarray, keep: np.uint64,
                  out: np.ndarray) -> None:
    """k-RR's permanent responses (one-hot rows) of rows first_row, first_row + 1, ... into `out` (zeroed).

    Word 0 keeps the true class when its top 63 bits fall below `keep`; otherwise the next words draw one of
    the n_classes - 1 other classes, uniformly: a word below the largest multiple of n_classes - 1 that fits
    64 bits gives word % (n_classes - 1), a word above it (probability < n_classes / 2**64) is skipped.
    """
    others = max(n_classes - 1, 1)
    zero = np.uint64(0)
    for i in nb.prange(labels.shape[0]):
        row = np.uint64(first_row + i)
        label = labels[i]
        reported = label
        if not (philox.word(key, 0, row, zero, zero) >> np.uint64(1)) < keep:
            other = uniform_index(key, row, others)
            reported = other + 1 if other >= label else other
        out[i, reported] = 1


@nb.njit(cache=True, inline="always")
def uniform_index(key: np.ndarray, row: np.uint64, n: int) -> np.int64:
    """A uniform index in [0, n) for row `row` from words 1, 2, ... of its stream at (row, 0, 0).

    A word below the largest multiple of n that fits 64 bits gives word % n; a word above it (probability
    < n / 2**64) is skipped. Word 0 is the keep-or-not draw of k-RR.
    """
    count = np.uint64(n)
    largest = np.uint64(0xFFFFFFFFFFFFFFFF) - (np.uint64(0) - count) % count  # 2**64 - 1 - 2**64 % n
    zero = np.uint64(0)
    j = 1
    w = philox.word(key, j, row, zero, zero)
    while w > largest:
        j += 1
        w = philox.word(key, j, row, zero, zero)
    return np.int64(w % count)


@nb.njit(cache=True, parallel=True)
def permanent_unary(labels: np.ndarray, patterns: np.ndarray, first_row: int, key: np.ndarray,
                    if_one: np.uint64, if_zero: np.uint64, out: np.ndarray) -> None:
    """Unary encoding's (OUE's) permanent responses of rows first_row, first_row + 1, ... into `out`.

    Bit b is 1 when the top 63 bits of word b (`_permanent_words`, as `permanent_bloom`'s) fall below
    `if_one` where the class's pattern has a 1, below `if_zero` where it has a 0: each bit independently.
    """
    n_bits = patterns.shape[1]
    for i in nb.prange(labels.shape[0]):
        words = np.empty(n_bits, dtype=np.uint64)
        _permanent_words(key, np.uint64(first_row + i), words)
        for b in range(n_bits):
            threshold = if_one if patterns[labels[i], b] else if_zero
            out[i, b] = (words[b] >> np.uint64(1)) < threshold
