"""Per-party feature binning: quantile bins for numbers, native categories, a missing-value bin.

Bin edges never leave the party that computed them. Codes are uint8: 0..max_bins-1 for values and
MISSING_BIN (255) for missing values (and, at prediction time, unknown categories).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedcore.data.numbers import numeric_values
from fedcore.errors import ParameterError

MISSING_BIN = 255
MAX_BINS = 255


def is_categorical_dtype(series: pd.Series) -> bool:
    """Strings, objects, pandas categoricals and booleans are treated as categorical features."""
    dtype = series.dtype
    return (
        isinstance(dtype, pd.CategoricalDtype)
        or pd.api.types.is_bool_dtype(dtype)
        or pd.api.types.is_object_dtype(dtype)
        or pd.api.types.is_string_dtype(dtype)
    )


def category_strings(series: pd.Series) -> pd.Series:
    """Category values as strings (missing stays missing), the form stored in partial models."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        series = series.astype(object)
    return series.astype("string")


@dataclass
class ColumnBinning:
    """How one column maps to bin codes: `edges` for numbers, `categories` for categoricals."""

    name: str
    is_categorical: bool
    edges: np.ndarray | None = None
    categories: list[str] | None = None

    @property
    def n_bins(self) -> int:
        """Number of value bins (the missing bin excluded)."""
        return len(self._categories()) if self.is_categorical else len(self._edges()) + 1

    def threshold_value(self, bin_index: int) -> float:
        """The raw threshold equivalent to `bin <= bin_index` for a numeric column."""
        edges = self._edges()
        return float(edges[bin_index]) if bin_index < len(edges) else float("inf")

    def transform(self, series: pd.Series) -> np.ndarray:
        """Bin codes (uint8) of `series`."""
        if self.is_categorical:
            strings = category_strings(series)  # a Series: pandas takes it, pandas-stubs want an Index
            vocabulary = pd.Index(self._categories())
            codes = vocabulary.get_indexer(strings).astype(np.int16)  # type: ignore[arg-type]
            codes[codes < 0] = MISSING_BIN  # unknown / missing: -1
            return codes.astype(np.uint8)
        values = numeric_values(series)
        codes = np.searchsorted(self._edges(), values, side="left").astype(np.uint8)
        codes[np.isnan(values)] = MISSING_BIN
        return codes

    def _edges(self) -> np.ndarray:
        assert self.edges is not None, "a numeric column's binning has its edges"
        return self.edges

    def _categories(self) -> list[str]:
        assert self.categories is not None, "a categorical column's binning has its categories"
        return self.categories


def subsample_indices(n_values: int, subsample: int, seed: int) -> np.ndarray | None:
    """Which of a column's `n_values` non-NaN values (row order) its edges come from; None: all of them.

    A column of more than `subsample` values is cut to a `rng.choice` of them. The in-process fit indexes
    its array with these; a party on Dask gathers just these values from its blocks
    (`fedcore.compute.dask_binning`), so both fit the same edges bit for bit.
    """
    if n_values > subsample:
        return np.random.default_rng(seed).choice(n_values, subsample, replace=False)
    return None


def edges_from_values(values: np.ndarray, max_bins: int) -> np.ndarray:
    """A numeric column's edges from its (subsampled) non-NaN values.

    Midpoints between the distinct values when there are at most `max_bins`, else midpoint percentiles.
    Both are taken from the values sorted once: percentiles of a sorted copy select the same order
    statistics as of the values (half the time: no partition of unsorted values), and equal floats are the
    same bits except 0.0 and -0.0, so a column holding both keeps the unsorted path, bit for bit as before.
    """
    ordered = np.sort(values)
    zeros = np.signbit(ordered[np.searchsorted(ordered, 0.0, "left"):np.searchsorted(ordered, 0.0, "right")])
    if zeros.any() and not zeros.all():
        return _edges(values, np.unique(values), max_bins)
    fresh = np.ones(len(ordered), np.bool_)
    np.not_equal(ordered[1:], ordered[:-1], out=fresh[1:])
    return _edges(ordered, ordered[fresh], max_bins)


def _edges(values: np.ndarray, distinct: np.ndarray, max_bins: int) -> np.ndarray:
    """`edges_from_values` given the values (in any order) and their distinct ones, ascending."""
    if len(distinct) <= max_bins:
        return (distinct[:-1] + distinct[1:]) / 2.0
    percentiles = np.linspace(0, 100, max_bins + 1)[1:-1]
    return np.unique(np.percentile(values, percentiles, method="midpoint"))


def column_seed(name: str, seed: int) -> int:
    """The subsample seed of column `name`: from its name and the binning seed only."""
    return (zlib.crc32(name.encode()) ^ int(seed)) & 0xFFFFFFFF


def check_max_bins(max_bins: int) -> None:
    """Refuse a `max_bins` outside [2, MAX_BINS]."""
    if not 2 <= max_bins <= MAX_BINS:
        raise ParameterError(f"max_bins must be between 2 and {MAX_BINS}, got {max_bins}")


def categorical_binning(name: str, categories: list[str], max_bins: int) -> ColumnBinning:
    """A categorical column's binning from its sorted distinct strings, refused beyond `max_bins`."""
    if len(categories) > max_bins:
        raise ParameterError(
            f"column {name!r} has {len(categories)} categories; at most max_bins={max_bins} are "
            "supported. Group rare categories, or convert the column to numbers if it is ordinal."
        )
    return ColumnBinning(name=name, is_categorical=True, categories=categories)


def fit_column(series: pd.Series, max_bins: int = MAX_BINS, subsample: int = 200_000,
               seed: int = 0) -> ColumnBinning:
    """Learn the binning of one column; the subsample seed depends only on the column name and `seed`."""
    check_max_bins(max_bins)
    name = str(series.name)
    if is_categorical_dtype(series):
        categories = sorted(category_strings(series).dropna().unique().tolist())
        return categorical_binning(name, categories, max_bins)
    values = numeric_values(series)
    values = values[~np.isnan(values)]
    chosen = subsample_indices(len(values), subsample, column_seed(name, seed))
    edges = edges_from_values(values if chosen is None else values[chosen], max_bins)
    return ColumnBinning(name=name, is_categorical=False, edges=edges)


class PartyBinner:
    """Bins every column of one party's table; fitted and applied only where the data lives."""

    def __init__(self, max_bins: int = MAX_BINS, subsample: int = 200_000, random_state: int = 0) -> None:
        """At most `max_bins` bins per column; numeric edges from a `subsample` of rows (`random_state`)."""
        self.max_bins = max_bins
        self.subsample = subsample
        self.random_state = random_state
        self.columns: list[ColumnBinning] = []

    def fit(self, frame: pd.DataFrame) -> PartyBinner:
        """Learn one ColumnBinning per column."""
        self.columns = [fit_column(frame[c], self.max_bins, self.subsample, self.random_state)
                        for c in frame.columns]
        return self

    def transform(self, frame: pd.DataFrame) -> np.ndarray:
        """Codes as a Fortran-ordered (n_rows, n_columns) uint8 matrix (column scans are contiguous)."""
        out = np.empty((len(frame), len(self.columns)), dtype=np.uint8, order="F")
        for j, column in enumerate(self.columns):
            out[:, j] = column.transform(frame[column.name])
        return out

    @property
    def is_categorical(self) -> np.ndarray:
        """Boolean mask of categorical columns."""
        return np.array([c.is_categorical for c in self.columns], dtype=np.bool_)
