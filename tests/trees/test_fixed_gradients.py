"""Boosting's gradient grid (fedcore/trees/fixed_gradients.py): sums are exact, in any order and decrypted.

Float64 sums of grid values in any order (numpy's pairwise sum, a sequential loop, reversed, shuffled) equal
the exact integer sum times the step; the packed slots' integer sums decode to the same floats; hessians stay
positive; a row count whose sums could not be exact is refused with one line.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedcore.errors import ParameterError
from fedcore.trees.fixed_gradients import GradientGrid, precision_bits, slot_widths


def _sequential(values: np.ndarray) -> float:
    total = 0.0
    for v in values.tolist():
        total += v
    return total


@pytest.mark.parametrize("scale", [1e-3, 1.0, 7.5e4])
def test_grid_sums_are_exact_in_any_order(scale: float) -> None:
    rng = np.random.default_rng(3)
    n = 5000
    gh = np.stack([rng.normal(0, scale, n), rng.uniform(0, 0.25 * scale, n)], axis=1)[None]
    gh[0, :7, 1] = 1e-16  # logistic's hessian floor: on the grid, still positive
    grid, q = GradientGrid.of(gh, n)
    assert grid.bits == 53 - n.bit_length()
    assert np.abs(q).max() <= 2**grid.bits and np.all(q[0, :, 1] >= 1)
    values = grid.values(q)[0]
    for column, exponent in ((0, grid.g_exponent), (1, grid.h_exponent)):
        exact = math.ldexp(int(q[0, :, column].sum()), exponent)
        shuffled = values[rng.permutation(n), column]
        sums = {float(np.sum(values[:, column])), _sequential(values[:, column]),
                _sequential(values[::-1, column]), _sequential(shuffled), float(np.sum(shuffled[:1234]))
                + float(np.sum(shuffled[1234:]))}
        assert sums == {exact}
        assert abs(exact - math.fsum(gh[0, :, column].tolist())) <= n * 2.0**exponent  # rounding only
    # the packed slots' integer sums decode to the same float sums (what the label holder decrypts)
    slots = grid.slots(q[0])
    rows = rng.permutation(n)[:777]
    sums = np.array([[sum(slots[rows, 0].tolist()), sum(slots[rows, 1].tolist()), len(rows)]], dtype=object)
    decoded = grid.statistics(sums)[0]
    assert decoded.tolist() == [777.0, _sequential(values[rows, 0]), _sequential(values[rows, 1])]
    assert min(slots[:, 0].tolist()) >= 0 and max(slots[:, 0].tolist()) <= 2 ** (grid.bits + 1)


def test_all_zero_gradients_and_unit_hessians_stay_exact() -> None:
    gh = np.zeros((2, 10, 2))
    gh[:, :, 1] = 1.0  # squared error's hessian
    grid, q = GradientGrid.of(gh, 10)
    assert np.array_equal(grid.values(q), gh)


def test_slot_widths_hold_every_rows_sum() -> None:
    n = 50_000
    bits, top = slot_widths(n)
    assert top == 2 ** precision_bits(n) and (2 ** (precision_bits(n) + 1) * n) < 2**bits


def test_too_many_rows_for_exact_sums_are_refused() -> None:
    assert precision_bits(2**29 - 1) == 24
    with pytest.raises(ParameterError) as refused:
        precision_bits(2**29)
    assert str(refused.value) == ("boosting sums gradients exactly over at most 536,870,911 rows (2^53 / "
                                  "2^24: 24 bits each), got 536,870,912: train on a sample of the rows")
