"""The candidate features' ranking (`fedcore.horizontal.growth.ranked_features`) against a stable argsort.

Every horizontal draw of candidate features ranks uniform keys; the compiled selection must pick what the
stable argsort it replaced picked, in the same order, ties (equal keys) going to the lower feature index.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.horizontal.growth import ranked_features


@pytest.mark.parametrize(("shape", "k"), [((1000, 16), 4), ((50, 3), 3), ((7, 5), 9), ((0, 4), 2),
                                          ((300, 40), 6)])
def test_the_first_k_of_a_stable_argsort(shape, k) -> None:
    keys = np.random.default_rng(0).random(shape)
    keys[::3, 1] = keys[::3, 0]  # exact ties
    keys = np.round(keys, 1)  # and many more
    ranked = ranked_features(keys, k)
    assert ranked.dtype == np.int64
    assert np.array_equal(ranked, np.argsort(keys, axis=1, kind="stable")[:, :k])


def test_nan_keys_are_refused() -> None:
    keys = np.zeros((2, 3))
    keys[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"^feature keys must not be NaN$"):
        ranked_features(keys, 2)
