"""The numba Philox4x64-10 (fedcore.philox) gives numpy's Philox words at every counter."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore import philox


def numpy_words(key: np.ndarray, c1: int, c2: int, c3: int, n: int) -> np.ndarray:
    """The words of numpy's Philox from counter (0, c1, c2, c3).

    numpy counts up before each block: it starts one below.
    """
    counter = (c1 << 64) + (c2 << 128) + (c3 << 192)
    return np.random.Philox(key=key, counter=(counter - 1) % (1 << 256)).random_raw(n)


def blocks(key: np.ndarray, c1: int, c2: int, c3: int, n: int) -> np.ndarray:
    """The first n words at (c1, c2, c3), block by block as the LDP draws take them (`philox.block`)."""
    counters = (np.uint64(c1), np.uint64(c2), np.uint64(c3))
    words = [philox.block(np.uint64(g), *counters, key[0], key[1]) for g in range((n + 3) // 4)]
    return np.array([w for four in words for w in four], dtype=np.uint64)[:n]


TOP = (1 << 64) - 1


@pytest.mark.parametrize("c1, c2, c3", [(0, 0, 0), (1, 0, 0), (12345, 7, 3), (TOP, TOP, 2),
                                        (1 << 40, 0, TOP)])
@pytest.mark.parametrize("n", [1, 4, 13, 64])
def test_words_are_numpys_philox_at_the_counter(c1, c2, c3, n) -> None:
    key = np.random.default_rng(n + c3).integers(0, 1 << 64, 2, dtype=np.uint64)
    out = blocks(key, c1, c2, c3, n)
    expected = numpy_words(key, c1, c2, c3, n)
    np.testing.assert_array_equal(out, expected)
    one_by_one = [philox.word(key, i, np.uint64(c1), np.uint64(c2), np.uint64(c3)) for i in range(n)]
    assert one_by_one == list(expected)


def test_another_key_or_counter_gives_other_words() -> None:
    key = np.array([1, 2], dtype=np.uint64)
    words = [numpy_words(key, 5, 0, 0, 8), numpy_words(np.array([1, 3], np.uint64), 5, 0, 0, 8),
             numpy_words(key, 6, 0, 0, 8), numpy_words(key, 5, 1, 0, 8), numpy_words(key, 5, 0, 1, 8)]
    ours = []
    for k, c in ((key, (5, 0, 0)), (np.array([1, 3], np.uint64), (5, 0, 0)), (key, (6, 0, 0)),
                 (key, (5, 1, 0)), (key, (5, 0, 1))):
        ours.append(blocks(k, *c, 8))
    np.testing.assert_array_equal(np.array(ours), np.array(words))
    assert len({w.tobytes() for w in ours}) == 5
