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

A data contract may declare the date columns instead (dtype `date` or `timestamp`): then exactly those are
converted (`convert_dates(..., dates=...)`), in the training table and every prediction batch alike, and
no other column is guessed. `parse_dates` is the one parser behind both and behind contract validation.

Every other string (or object) column is categorical in both engines; it may hold at most
`MAX_CATEGORIES` distinct values (the vertical engine's bin limit), else it is refused with the fix.
"""

from __future__ import annotations

import datetime as dt
import re
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


def parse_dates(series: pd.Series) -> pd.Series:
    """Dates of any supported form as naive UTC datetime64 values, NaT where missing or not a date.

    Never raises: validation counts the values it could not parse, conversion refuses them.
    """
    if not pd.api.types.is_datetime64_any_dtype(series.dtype):
        text = all(isinstance(v, str) for v in series.dropna())
        series = pd.to_datetime(series, utc=True, errors="coerce", format="ISO8601" if text else None)
    if series.dt.tz is not None:
        series = series.dt.tz_convert("UTC").dt.tz_localize(None)
    return series


def utc_datetimes(series: pd.Series) -> pd.Series:
    """Dates of any supported form as naive UTC datetime64 values; an impossible ISO date is an InputError."""
    parsed = parse_dates(series)
    if not pd.api.types.is_datetime64_any_dtype(series.dtype):
        _refuse_unparsed(series, parsed)
    return parsed


def may_hold_dates(series: pd.Series) -> bool:
    """Whether `series` may hold dates: datetime64, objects, strings, or no values (an empty CSV column).

    Numbers and booleans are no dates.
    """
    return (pd.api.types.is_datetime64_any_dtype(series.dtype) or pd.api.types.is_object_dtype(series.dtype)
            or (pd.api.types.is_string_dtype(series.dtype)
                and not isinstance(series.dtype, pd.CategoricalDtype))
            or bool(series.isna().all()))


def parse_instant(text: str) -> pd.Timestamp | None:
    """An ISO 8601 date or date-time (a contract's min/max) as a naive UTC Timestamp; None if it is none."""
    if not isinstance(text, str) or not re.fullmatch(ISO_DATETIME, text.strip()):
        return None
    parsed = parse_dates(pd.Series([text.strip()], dtype=object)).iloc[0]
    return None if pd.isna(parsed) else parsed


def instant_days(text: str) -> float:
    """An ISO date or date-time as days since 1970-01-01 UTC, the number a date column trains as."""
    return float(days_since_epoch(pd.Series([text], dtype=object)).iloc[0])


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


def guess_date_columns(table: pd.DataFrame, keep: Collection[str] = ()) -> list[str]:
    """The columns (except `keep`) that hold dates (`date_source`): what is converted without a contract."""
    return [str(c) for c in table.columns if c not in keep and holds_dates([date_evidence(table[c])])]


@dataclass(frozen=True)
class DateEvidence:
    """What one part of a column (a block of rows) says about the whole column holding dates.

    `typed`: a datetime dtype (the same in every part); else its `present` values, whether all of them are
    date/datetime objects and whether all are ISO 8601 strings (both true of a part without values).
    """

    typed: bool
    present: int
    all_dates: bool
    all_iso: bool


def date_evidence(series: pd.Series) -> DateEvidence:
    """`series`'s evidence, which `holds_dates` combines over the parts of a column (`date_source`'s rule)."""
    if pd.api.types.is_datetime64_any_dtype(series.dtype):
        return DateEvidence(True, len(series), True, False)
    if isinstance(series.dtype, pd.CategoricalDtype) or not is_categorical_dtype(series) \
            or pd.api.types.is_bool_dtype(series.dtype):
        return DateEvidence(False, 0, False, False)
    present = series.dropna()
    strings = all(isinstance(v, str) for v in present)
    iso = strings and bool(present.astype(str).str.fullmatch(ISO_DATETIME).all())
    return DateEvidence(False, len(present), all(isinstance(v, dt.date) for v in present), iso)


def holds_dates(parts: Collection[DateEvidence]) -> bool:
    """Whether a column whose parts gave `parts` holds dates (`date_source` of the whole is not None)."""
    if any(p.typed for p in parts):
        return True
    if not any(p.present for p in parts):
        return False
    return all(p.all_dates for p in parts) or all(p.all_iso for p in parts)


def convert_dates(table: pd.DataFrame, keep: Collection[str] = (),
                  dates: Collection[str] | None = None) -> tuple[pd.DataFrame, list[DateConversion]]:
    """`table` with its date columns as days since epoch, and what was converted.

    `dates`: exactly these columns (a contract's declared dates; one absent from `table` is skipped), each
    refused unless it holds dates; None: every column that holds dates, except those in `keep`.
    """
    columns = guess_date_columns(table, keep) if dates is None else [c for c in dates if c in table.columns]
    conversions = []
    converted = table.copy()
    for column in columns:
        series = table[column]
        if not may_hold_dates(series):
            raise InputError(f"column {column!r} holds dtype {series.dtype}, but its data contract (or, "
                             "without one, the training table) makes it a date column: give it dates or ISO "
                             "8601 strings")
        converted[column] = days_since_epoch(series)
        conversions.append(DateConversion(str(column), date_source(series) or "no values"))
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
