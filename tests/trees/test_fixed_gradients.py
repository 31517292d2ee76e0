"""Boosting's gradient grid and regression targets' (fedcore/trees/fixed_gradients.py): sums are exact.

Float64 sums of grid values (gradients, and regression targets: `fixed_targets`) in any order (numpy's
pairwise sum, a sequential loop, reversed, shuffled) equal the exact integer sum times the step; the packed
slots' integer sums decode to the same floats; hessians stay positive; a row count whose sums could not be
exact is refused with one line.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedcore.errors import ParameterError
from fedcore.trees.fixed_gradients import GradientGrid, exact_sums, fixed_targets, precision_bits, slot_widths


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


@pytest.mark.parametrize("scale", [1e-9, 1.0, 1e12])
def test_a_rounds_grid_has_exact_sums_and_values_off_any_grid_do_not(scale: float) -> None:
    """`exact_sums`, what a passive party checks of a relayed round: the label holder's grid passes."""
    rng = np.random.default_rng(5)
    gh = rng.normal(0, scale, (3, 4000, 2))
    gh[..., 1] = np.abs(gh[..., 1])
    grid, q = GradientGrid.of(gh, 4000)
    on_grid = grid.values(q)
    assert exact_sums(on_grid) and exact_sums(on_grid[:, :1]) and exact_sums(np.zeros((1, 9, 2)))
    assert exact_sums(np.zeros((2, 0, 2)))  # no rows: no sums
    assert not exact_sums(gh)  # full-precision floats: their sums round
    off = on_grid.copy()
    off[2, 17, 1] += math.ldexp(1.0, grid.h_exponent - 10)  # a hessian of the third tree, off the step
    assert not exact_sums(off)
    # the largest values one grid holds: 2^52 rows' worth at step 1 is exact, one more step is not
    assert exact_sums(np.full((1, 2, 2), 2.0**51)) and not exact_sums(np.array([[[2.0**52 + 1, 1.0]] * 2]))


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


@pytest.mark.parametrize("scale", [1e-9, 1.0, 3e5, 1e150, 1e300])
def test_regression_targets_on_their_grid_sum_exactly_in_any_order(scale: float) -> None:
    """Every weighted sum of the rounded targets is exact whatever the order, and rounding twice is once."""
    rng = np.random.default_rng(8)
    n = 3000
    y = rng.normal(0.5, 1.0, n) * scale
    top = math.frexp(float(np.max(np.abs(y))))[1]
    y[:2] = [0.0, -math.ldexp(1 - 2.0**-50, top)]  # rounds up to 2^top (inf at 1e300): clipped below it
    y[5] = np.nan
    fixed = fixed_targets(y)
    bits = precision_bits(n)
    exponent = math.frexp(float(np.nanmax(np.abs(y))))[1] - bits
    q = np.ldexp(fixed[np.isfinite(fixed)], -exponent)
    assert np.isnan(fixed[5]) and np.array_equal(q, np.round(q)) and np.abs(q).max() == 2**bits - 1
    assert np.abs(fixed - y)[np.isfinite(y)].max() <= 2.0**exponent  # a grid step at most (the clipped top)
    np.testing.assert_array_equal(fixed_targets(fixed), fixed)
    w = rng.integers(1, 4, n).astype(np.float64)  # bootstrap counts
    w[5] = 0.0
    values = np.where(np.isfinite(fixed), fixed, 0.0) * w
    exact = math.ldexp(int(sum(int(v) for v in np.ldexp(values, -exponent).tolist())), exponent)
    shuffled = values[rng.permutation(n)]
    assert {float(np.sum(values)), _sequential(values), _sequential(values[::-1]), _sequential(shuffled),
            float(np.sum(shuffled[:1000])) + float(np.sum(shuffled[1000:]))} == {exact}


def test_the_bound_holds_at_the_most_rows() -> None:
    """At 2^29 - 1 rows (24 bits each) n x the largest |q| stays below 2^53; one more row is refused."""
    n = 2**29 - 1
    assert n * (2 ** precision_bits(n) - 1) < 2**53
    with pytest.raises(ParameterError) as refused:
        fixed_targets(np.broadcast_to(1e300, 2**29))  # a view: no 4 GiB of targets
    assert str(refused.value) == ("a regression forest sums its targets exactly over at most 536,870,911 "
                                  "rows (2^53 / 2^24: 24 bits each), got 536,870,912: train on a sample of "
                                  "the rows")
