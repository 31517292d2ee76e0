"""A numeric column's bin edges from its values sorted once are the unsorted computation's, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.data.binning import edges_from_values


def _unsorted_edges(values: np.ndarray, max_bins: int) -> np.ndarray:
    """The definition: midpoints of the distinct values, or midpoint percentiles of the values as given."""
    distinct = np.unique(values)
    if len(distinct) <= max_bins:
        return (distinct[:-1] + distinct[1:]) / 2.0
    return np.unique(np.percentile(values, np.linspace(0, 100, max_bins + 1)[1:-1], method="midpoint"))


_rng = np.random.default_rng(7)
COLUMNS = {
    "continuous": _rng.normal(size=20_000),
    "rounded, with -0.0 and 0.0": np.round(_rng.normal(size=20_000), 2),
    "rounded, non-negative": np.abs(np.round(_rng.normal(size=5_000), 1)),
    "few values": _rng.integers(0, 5, 1_000).astype(np.float64),
    "zeros of both signs, few values": np.array([-0.0, 0.0, 1.0, 0.0, -0.0]),
    "infinities": np.array([np.inf, -np.inf, 0.0, 2.0, 2.0]),
    "one value": np.array([3.5]),
    "none": np.zeros(0),
    "many zeros of one sign": np.r_[np.zeros(900), _rng.exponential(size=300)],
    "many zeros of the other": np.r_[-np.zeros(900), _rng.exponential(size=300)],
}


@pytest.mark.parametrize("name", list(COLUMNS))
@pytest.mark.parametrize("max_bins", [2, 16, 255])
def test_edges_are_the_unsorted_computation_bit_for_bit(name: str, max_bins: int) -> None:
    values = COLUMNS[name]
    assert edges_from_values(values, max_bins).tobytes() == _unsorted_edges(values, max_bins).tobytes()

