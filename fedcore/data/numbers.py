"""A column's numbers as both engines read them: float64, missing values NaN, infinities refused.

Infinity is not a value a tree can split on usefully (a threshold between a finite value and inf lands at
inf, and midpoints of -inf and inf are NaN), and it is almost always an upstream error (a division by
zero). So every engine, the simulator, the agents and prediction refuse it in the same words, naming the
column, instead of training on it quietly: replace infinities with missing values (which every engine
handles) or with finite numbers.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pandas as pd

from fedcore.errors import InputError


def numeric_values(series: pd.Series, what: str = "column") -> np.ndarray:
    """A numeric or boolean column as float64, missing values as NaN; InputError if it holds inf or -inf."""
    values = _floats(series)
    infinite = int(np.isinf(values).sum())
    if infinite:
        raise infinity_error(what, series.name, infinite)
    return values


def _floats(series: pd.Series) -> np.ndarray:
    """A numeric or boolean column as float64, missing values as NaN."""
    if pd.api.types.is_bool_dtype(series.dtype):
        series = series.astype("float64")
    return pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def infinity_error(what: str, column: object, count: int) -> InputError:
    """The refusal of a column holding `count` infinities (`what`: whose column, e.g. "party 'x' column")."""
    return InputError(f"{what} {column!r} holds {count} infinite value{'s' if count > 1 else ''} (inf or "
                      "-inf): replace them with missing values, which every engine handles, or with finite "
                      "numbers")


def infinite_counts(frame: pd.DataFrame, skip: Collection[str] = ()) -> dict[str, int]:
    """How many inf or -inf each numeric or boolean column (other than `skip`) holds, in column order.

    Counts add up over blocks of rows, so a table read in blocks is checked as the whole table
    (`fedcore.compute.dask_table`).
    """
    counts: dict[str, int] = {}
    for name in frame.columns:
        series = frame[name]
        if name not in skip and (pd.api.types.is_numeric_dtype(series.dtype)
                                 or pd.api.types.is_bool_dtype(series.dtype)):
            counts[name] = int(np.isinf(_floats(series)).sum())
    return counts


def refuse_infinite(counts: dict[str, int], where: str = "") -> None:
    """Raise `infinity_error` for the first column of `counts` holding an infinity."""
    for name, count in counts.items():
        if count:
            raise infinity_error(f"{where} column".strip(), name, count)


def check_finite_columns(frame: pd.DataFrame, where: str = "", skip: Collection[str] = ()) -> None:
    """Refuse a table whose numeric or boolean columns (other than `skip`) hold inf or -inf.

    The error names the first such column (`where` says whose table, e.g. "party 'bank'").
    """
    refuse_infinite(infinite_counts(frame, skip), where)
