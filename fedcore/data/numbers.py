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
    if pd.api.types.is_bool_dtype(series.dtype):
        series = series.astype("float64")
    values = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    infinite = int(np.isinf(values).sum())
    if infinite:
        raise InputError(f"{what} {series.name!r} holds {infinite} infinite "
                         f"value{'s' if infinite > 1 else ''} (inf or -inf): replace them with missing "
                         "values, which every engine handles, or with finite numbers")
    return values


def check_finite_columns(frame: pd.DataFrame, where: str = "", skip: Collection[str] = ()) -> None:
    """Refuse a table whose numeric or boolean columns (other than `skip`) hold inf or -inf.

    The error names the first such column (`where` says whose table, e.g. "party 'bank'").
    """
    for name in frame.columns:
        series = frame[name]
        if name not in skip and (pd.api.types.is_numeric_dtype(series.dtype)
                                 or pd.api.types.is_bool_dtype(series.dtype)):
            numeric_values(series, f"{where} column".strip())
