"""Make the feature columns of any table usable by both engines.

Dates become numbers, strings must be categorical-sized.

Dates are decided once, here, for both settings: a date or datetime column becomes one float64 column
of **days since 1970-01-01 UTC** (times of day as fractions of a day, missing stays NaN), under the
same name. One monotone number keeps trends and order splittable by a single threshold and keeps the
column count, so vertical parties are dealt the same columns. Timezone-aware values are converted to
UTC; naive values are read as UTC. The same instants give bit-identical numbers whichever way they
arrive:
- a pandas datetime64 column (a Parquet timestamp), naive or timezone-aware;
- an object column of `datetime.date` / `datetime.datetime` values (a Parquet date);
- a string column whose non-missing values all have the ISO 8601 form `YYYY-MM-DD`, optionally with a
  time `[T ]hh:mm[:ss[.fff]]` and an offset (`Z`, `+hh:mm`): a CSV date. A column that has this form
  but holds an impossible date (2021-02-30) is refused, naming the value; any other string stays a string.

Every other string (or object) column is categorical in both engines; it may hold at most
`MAX_CATEGORIES` distinct values (the vertical engine's bin limit), else it is refused with the fix.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedcore.data.binning import MAX_BINS, category_strings, is_categorical_dtype
from fedcore.errors import InputError

DAYS = "days since 1970-01-01 UTC (times of day as fractions of a day)"
MICROSECONDS_PER_DAY = 86_400_000_000
MAX_CATEGORIES = MAX_BINS
ISO_DATE = r"\d{4}-\d{2}-\d{2}"
ISO_DATETIME = ISO_DATE + r"(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?(?:Z|[+-]\d{2}(?::?\d{2})?)?)?"


@dataclass(frozen=True)
class DateConversion:
    """One date column turned into numbers: its name and what it held."""

    column: str
    source: str

    def to_dict(self) -> dict[str, str]:
        """JSON-ready form for the simulator's result."""
        return {"column": self.column, "from": self.source, "to": DAYS}


def date_source(series: pd.Series) -> str | None:
    """What kind of dates `series` holds ("ISO date strings", "datetime values", ...), or None."""
    if pd.api.types.is_datetime64_any_dtype(series.dtype):
        zone = getattr(series.dtype, "tz", None)
        return "datetime values" + (f" in {zone}" if zone is not None else "")
    if isinstance(series.dtype, pd.CategoricalDtype) or not is_categorical_dtype(series):
        return None
    present = series.dropna()
    if present.empty or pd.api.types.is_bool_dtype(series.dtype):
        return None
    if all(isinstance(v, dt.date) for v in present):
        return "date and datetime values"
    if not all(isinstance(v, str) for v in present):
        return None
    text = present.astype(str)
    if not text.str.fullmatch(ISO_DATETIME).all():
        return None
    return "ISO date strings" if text.str.fullmatch(ISO_DATE).all() else "ISO datetime strings"


def utc_datetimes(series: pd.Series) -> pd.Series:
    """Dates of any supported form as naive UTC datetime64 values; an impossible ISO date is an InputError."""
    if not pd.api.types.is_datetime64_any_dtype(series.dtype):
        text = all(isinstance(v, str) for v in series.dropna())
        parsed = pd.to_datetime(series, utc=True, errors="coerce", format="ISO8601" if text else None)
        _refuse_unparsed(series, parsed)
        series = parsed
    if series.dt.tz is not None:
        series = series.dt.tz_convert("UTC").dt.tz_localize(None)
    return series


def _refuse_unparsed(series: pd.Series, parsed: pd.Series) -> None:
    """Refuse a date column with a value that looks like a date but is none (2021-02-30)."""
    bad = series.notna() & parsed.isna()
    if bad.any():
        shown = ", ".join(repr(str(v)) for v in series[bad].unique()[:3])
        raise InputError(f"column {series.name!r} holds ISO dates, but {int(bad.sum())} values are not valid "
                         f"dates ({shown}); correct or blank them")


def days_since_epoch(series: pd.Series) -> pd.Series:
    """Dates as float64 days since 1970-01-01 UTC (NaN where missing), exact to the microsecond."""
    micros = utc_datetimes(series).dt.as_unit("us").to_numpy()
    missing = np.isnat(micros)
    days = micros.view(np.int64).astype(np.float64) / MICROSECONDS_PER_DAY
    days[missing] = np.nan
    return pd.Series(days, index=series.index, name=series.name)


def convert_dates(table: pd.DataFrame,
                  keep: Collection[str] = ()) -> tuple[pd.DataFrame, list[DateConversion]]:
    """`table` with every date column (except those in `keep`) as days since epoch, and what was converted."""
    conversions = []
    converted = table.copy()
    for column in table.columns:
        source = None if column in keep else date_source(table[column])
        if source is not None:
            converted[column] = days_since_epoch(table[column])
            conversions.append(DateConversion(str(column), source))
    return converted, conversions


def check_category_sizes(table: pd.DataFrame, keep: Collection[str] = (),
                         limit: int = MAX_CATEGORIES) -> None:
    """Refuse a categorical column (strings, objects) of over `limit` distinct values, saying the fix."""
    for column in table.columns:
        if column in keep or not is_categorical_dtype(table[column]):
            continue
        distinct = category_strings(table[column]).nunique(dropna=True)
        if distinct > limit:
            raise InputError(
                f"column {column!r} holds {distinct} distinct strings that are not ISO dates: too many for a "
                f"categorical feature (at most {limit}); if it identifies rows pass it as the id column "
                f"(--id-column {column}), else leave it out (--drop {column})")
