"""Master-side helpers: candidate feature sampling."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.vertical.master import sample_rows_without_replacement


@pytest.mark.parametrize("n,k", [(40, 6), (40, 5), (10, 9), (7, 7), (1000, 31), (3, 1)])
def test_rows_are_sorted_distinct_and_in_range(n: int, k: int) -> None:
    out = sample_rows_without_replacement(np.random.default_rng(0), 5000, n, k)
    assert out.shape == (5000, k)
    assert np.all(np.diff(out, axis=1) > 0)
    assert out.min() >= 0 and out.max() < n


@pytest.mark.parametrize("n,k", [(40, 6), (10, 9)])
def test_every_feature_is_equally_likely(n: int, k: int) -> None:
    out = sample_rows_without_replacement(np.random.default_rng(1), 20000, n, k)
    freq = np.bincount(out.ravel(), minlength=n) / 20000
    np.testing.assert_allclose(freq, k / n, atol=0.02)


def test_same_stream_same_draws() -> None:
    a = sample_rows_without_replacement(np.random.default_rng(5), 100, 40, 6)
    b = sample_rows_without_replacement(np.random.default_rng(5), 100, 40, 6)
    np.testing.assert_array_equal(a, b)
