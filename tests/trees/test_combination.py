"""How trees combine (fedcore/trees/combination.py): a forest's mean, boosting's base + sum through a link."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.trees.combination import MEAN, TreeCombination


def test_a_forest_takes_the_mean_of_its_trees() -> None:
    values = np.random.default_rng(1).random((5, 7, 3))
    assert np.array_equal(MEAN.combine(values), values.mean(axis=1))
    assert MEAN.trees_per_round == 1


def test_boosting_adds_each_round_to_its_output_in_round_order() -> None:
    """Tree t adds to output t mod K, rounds in order, onto the base score; then the link."""
    values = np.arange(12, dtype=np.float64).reshape(2, 6, 1) / 8  # 2 rows, 3 rounds of K = 2 trees
    softmax = TreeCombination("sum", (0.5, -0.25), "softmax")
    margins = softmax.margins(values)
    expected = np.array([[0.5 + (0 + 2 + 4) / 8, -0.25 + (1 + 3 + 5) / 8],
                         [0.5 + (6 + 8 + 10) / 8, -0.25 + (7 + 9 + 11) / 8]])
    np.testing.assert_array_equal(margins, expected)
    exp = np.exp(expected - expected.max(axis=1, keepdims=True))
    np.testing.assert_allclose(softmax.combine(values), exp / exp.sum(axis=1, keepdims=True), rtol=1e-15)
    identity = TreeCombination("sum", (1.0,))
    np.testing.assert_array_equal(identity.combine(values[:, :2]), [[1 + 1 / 8], [1 + 13 / 8]])
    sigmoid = TreeCombination("sum", (0.0,), "sigmoid").combine(np.zeros((1, 1, 1)))
    np.testing.assert_array_equal(sigmoid, [[0.5, 0.5]])


def test_what_no_model_combines_by_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^trees combine by 'mean' or 'sum', got 'median'$"):
        TreeCombination("median")
    with pytest.raises(ValueError, match=r"^a sum of trees needs a base score per output$"):
        TreeCombination("sum")
