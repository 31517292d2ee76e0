"""Data contracts as YAML + dataclasses: what one institution's table must look like before training.

    name: bank
    version: "1"                 # a string; recorded in the model's lineage
    id_column: customer_id       # non-null and unique
    label: {column: responded, classes: ["no", "yes"]}     # or {column: y, min: 0, max: 100}
    row_count: {min: 1000, max: null}                      # optional
    allow_extra_columns: false   # false: a column the contract does not name is a violation
    columns:
      - {name: age, dtype: int, nullable: false, min: 0, max: 130}
      - {name: region, dtype: category, nullable: true, categories: [north, south]}
      - {name: opened, dtype: date, nullable: false, min: "2000-01-01", max: "2026-12-31"}
      - {name: last_login, dtype: timestamp, nullable: true, min: "2020-01-01T00:00:00Z", max: null}

`dtype` is one of float, int, string, category, bool, date, timestamp. `min`/`max` apply to float and int
(numbers) and to date and timestamp (ISO 8601 strings), `categories` to category. A `date` holds calendar
days (Parquet dates, `YYYY-MM-DD` strings); a `timestamp` holds instants (Parquet timestamps, ISO date-time
strings). Timezone rule: values and bounds with an offset (`Z`, `+02:00`) are converted to UTC, values
without one are read as UTC. Both train as days since 1970-01-01 UTC (`fedcore.data.columns`).

`load_contract` refuses anything else with a `ConfigError` naming the file and the field;
`infer_contract` drafts a contract from a sample table for the user to review.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from fedcore.config import read_yaml
from fedcore.errors import ConfigError, InputError

DTYPES = ("float", "int", "string", "category", "bool", "date", "timestamp")
NUMERIC_DTYPES = ("float", "int")
DATE_DTYPES = ("date", "timestamp")
"""Contract dtypes of dates: validated as dates, converted to days since epoch before training."""
# infer_contract: string columns with at most this many distinct values become categories.
MAX_INFERRED_CATEGORIES = 50
# infer_contract: numeric bounds are widened by this fraction of the observed range, then rounded outward.
RANGE_PADDING = 0.1
_TOP_KEYS = {"name", "version", "id_column", "label", "columns", "row_count", "allow_extra_columns"}
_COLUMN_KEYS = {"name", "dtype", "nullable", "min", "max", "categories"}
_LABEL_KEYS = {"column", "classes", "min", "max"}
Scalar = str | int | float | bool


@dataclass(frozen=True)
class LabelSpec:
    """The label column: its allowed classes (classification) or its min/max (regression)."""

    column: str
    classes: list[Scalar] | None = None
    min: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class ColumnSpec:
    """One feature column: dtype, whether it may hold missing values, its range or its categories."""

    name: str
    dtype: str
    nullable: bool = True
    min: float | str | None = None
    """A number (float, int), or an ISO 8601 string (date, timestamp)."""
    max: float | str | None = None
    categories: list[Scalar] | None = None


@dataclass(frozen=True)
class DataContract:
    """One dataset's contract: id column, label, feature columns and optional row-count bounds."""

    name: str
    version: str
    id_column: str
    columns: list[ColumnSpec]
    label: LabelSpec | None = None
    row_count: tuple[int | None, int | None] | None = None
    allow_extra_columns: bool = False

    @property
    def date_columns(self) -> list[str]:
        """The feature columns declared date or timestamp: converted to days since epoch before training."""
        return [c.name for c in self.columns if c.dtype in DATE_DTYPES]

    @property
    def column_names(self) -> list[str]:
        """Every column the contract names: id, label (if any), then the features."""
        return [self.id_column] + ([self.label.column] if self.label else []) + [c.name for c in self.columns]


# ---------------------------------------------------------------- loading


def load_contract(path: str | os.PathLike) -> DataContract:
    """Read and check a contract file; every problem is a ConfigError naming the file and the field."""
    path = Path(path)
    return parse_contract(read_yaml(path, "data contract"), str(path))


def parse_contract(raw: Any, source: str = "<contract>") -> DataContract:
    """Check an already-parsed contract mapping (see the module docstring); `source` names it in errors."""
    def fail(where: str, message: str) -> ConfigError:
        return ConfigError(f"{source}: {where}: {message}")

    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, found {type(raw).__name__}")
    _no_unknown_keys(raw, _TOP_KEYS, "the contract", fail)
    name = _text(raw, "name", "the contract", fail)
    version = raw.get("version")
    if isinstance(version, bool) or not isinstance(version, str | int) or str(version).strip() == "":
        raise fail("version", f"must be a string such as \"1\" (quote it), found {version!r}")
    id_column = _text(raw, "id_column", "the contract", fail)
    label = _parse_label(raw.get("label"), fail)
    raw_columns = raw.get("columns")
    if not isinstance(raw_columns, list):
        raise fail("columns", f"must be a list of column mappings, found {raw_columns!r}")
    columns = [_parse_column(item, index, fail) for index, item in enumerate(raw_columns)]
    seen = {id_column: "id_column"}
    if label is not None:
        if label.column in seen:
            raise fail("label.column", f"{label.column!r} is also the id column")
        seen[label.column] = "label.column"
    for index, column in enumerate(columns):
        if column.name in seen:
            raise fail(f"columns[{index}] ({column.name!r})",
                       f"the name is already used by {seen[column.name]}")
        seen[column.name] = f"columns[{index}]"
    allow_extra = raw.get("allow_extra_columns", False)
    if not isinstance(allow_extra, bool):
        raise fail("allow_extra_columns", f"must be true or false, found {allow_extra!r}")
    return DataContract(name=name, version=str(version), id_column=id_column, columns=columns, label=label,
                        row_count=_parse_row_count(raw.get("row_count"), fail),
                        allow_extra_columns=allow_extra)


def _no_unknown_keys(mapping: dict, allowed: set[str], where: str, fail) -> None:
    unknown = sorted(str(k) for k in set(mapping) - allowed)
    if unknown:
        raise fail(where, f"unknown field(s) {unknown}; allowed: {sorted(allowed)}")


def _text(mapping: dict, key: str, where: str, fail) -> str:
    value = mapping.get(key)
    if not isinstance(value, str) or not value.strip():
        raise fail(key if where == "the contract" else f"{where}.{key}",
                   f"must be a non-empty string, found {value!r}")
    return value


def _number(mapping: dict, key: str, where: str, fail) -> float | int | None:
    value = mapping.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise fail(f"{where}.{key}", f"must be a number or null, found {value!r}")
    return value


def _range(mapping: dict, where: str, fail) -> tuple[float | int | None, float | int | None]:
    low, high = _number(mapping, "min", where, fail), _number(mapping, "max", where, fail)
    if low is not None and high is not None and low > high:
        raise fail(where, f"min {low!r} is greater than max {high!r}")
    return low, high


def _date_range(mapping: dict, where: str, dtype: str, fail) -> tuple[str | None, str | None]:
    """A date or timestamp column's min/max: ISO 8601 strings (YAML's own dates accepted), min <= max."""
    from fedcore.data.columns import ISO_DATE, parse_instant

    bounds: list[str | None] = []
    for key in ("min", "max"):
        value = mapping.get(key)
        if isinstance(value, dt.date):  # YAML reads an unquoted 2020-01-01 as a date
            value = value.isoformat()
        if value is not None and (parse_instant(value) is None
                                  or dtype == "date" and not re.fullmatch(ISO_DATE, value.strip())):
            form = '"YYYY-MM-DD"' if dtype == "date" else '"YYYY-MM-DDThh:mm:ssZ" (or a date)'
            raise fail(f"{where}.{key}", f"must be an ISO 8601 {dtype} such as {form}, or null, found "
                                         f"{value!r}")
        bounds.append(None if value is None else value.strip())
    low, high = bounds
    first, last = (None if b is None else parse_instant(b) for b in bounds)
    if first is not None and last is not None and first > last:
        raise fail(where, f"min {low!r} is later than max {high!r}")
    return low, high


def _value_list(value: Any, where: str, fail) -> list[Scalar]:
    if not isinstance(value, list) or not value:
        raise fail(where, f"must be a non-empty list, found {value!r}")
    for item in value:
        if not isinstance(item, Scalar) or (isinstance(item, float) and math.isnan(item)):
            raise fail(where, f"values must be strings, numbers or booleans, found {item!r}")
    keys = [(type(v), v) for v in value]  # typed: True == 1 in Python, but they are different classes
    if len(set(keys)) != len(keys):
        duplicated = sorted({repr(v) for v, key in zip(value, keys, strict=True) if keys.count(key) > 1})
        raise fail(where, f"values must be unique, found duplicates {', '.join(duplicated)}")
    return list(value)


def _parse_label(raw: Any, fail) -> LabelSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise fail("label", f"must be a mapping {{column, classes}} or {{column, min, max}}, found {raw!r}")
    _no_unknown_keys(raw, _LABEL_KEYS, "label", fail)
    column = _text(raw, "column", "label", fail)
    low, high = _range(raw, "label", fail)
    classes = raw.get("classes")
    if classes is not None:
        if low is not None or high is not None:
            raise fail("label", "give either classes (classification) or min/max (regression), not both")
        classes = _value_list(classes, "label.classes", fail)
    return LabelSpec(column=column, classes=classes, min=low, max=high)


def _parse_column(raw: Any, index: int, fail) -> ColumnSpec:
    where = f"columns[{index}]"
    if not isinstance(raw, dict):
        raise fail(where, f"must be a mapping with name and dtype, found {raw!r}")
    if isinstance(raw.get("name"), str):
        where = f"columns[{index}] ({raw['name']!r})"
    _no_unknown_keys(raw, _COLUMN_KEYS, where, fail)
    name = _text(raw, "name", f"columns[{index}]", fail)
    dtype = raw.get("dtype")
    if dtype not in DTYPES:
        raise fail(f"{where}.dtype", f"must be one of {', '.join(DTYPES)}, found {dtype!r}")
    nullable = raw.get("nullable", True)
    if not isinstance(nullable, bool):
        raise fail(f"{where}.nullable", f"must be true or false, found {nullable!r}")
    low, high = _date_range(raw, where, dtype, fail) if dtype in DATE_DTYPES else _range(raw, where, fail)
    if dtype not in NUMERIC_DTYPES + DATE_DTYPES and (low is not None or high is not None):
        raise fail(where, f"min/max apply to float, int, date and timestamp columns, not to dtype {dtype}")
    categories = raw.get("categories")
    if categories is not None:
        if dtype != "category":
            raise fail(where, f"categories apply to dtype category, not to dtype {dtype}")
        categories = _value_list(categories, f"{where}.categories", fail)
    return ColumnSpec(name=name, dtype=dtype, nullable=nullable, min=low, max=high, categories=categories)


def _parse_row_count(raw: Any, fail) -> tuple[int | None, int | None] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise fail("row_count", f"must be a mapping {{min, max}}, found {raw!r}")
    _no_unknown_keys(raw, {"min", "max"}, "row_count", fail)
    bounds = []
    for key in ("min", "max"):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise fail(f"row_count.{key}", f"must be a whole number >= 0 or null, found {value!r}")
        bounds.append(value)
    if bounds[0] is not None and bounds[1] is not None and bounds[0] > bounds[1]:
        raise fail("row_count", f"min {bounds[0]} is greater than max {bounds[1]}")
    return (bounds[0], bounds[1]) if bounds != [None, None] else None


# ---------------------------------------------------------------- dumping

HEADER = """\
# Data contract {name!r} version {version}{source}.
# REVIEW BEFORE USE: it is checked against every institution's data before training, and any
# violation stops the run. Drafted ranges are the sample's min/max widened by {padding:.0%} of the range
# and rounded outward to a power of ten (dates and timestamps: to whole years, in UTC); categories
# are the values seen in the sample. Tighten or widen them to what the data may legitimately hold,
# set row_count, and bump version when you edit.
"""


def dump_contract(contract: DataContract, source: str | None = None) -> str:
    """The contract as YAML under a header asking the user to review it; `load_contract` reads it back."""
    body: dict[str, Any] = {"name": contract.name, "version": contract.version,
                            "id_column": contract.id_column}
    if contract.label is not None:
        label: dict[str, Any] = {"column": contract.label.column}
        if contract.label.classes is not None:
            label["classes"] = list(contract.label.classes)
        else:
            label.update(min=contract.label.min, max=contract.label.max)
        body["label"] = label
    if contract.row_count is not None:
        body["row_count"] = {"min": contract.row_count[0], "max": contract.row_count[1]}
    body["allow_extra_columns"] = contract.allow_extra_columns
    body["columns"] = [_column_mapping(c) for c in contract.columns]
    header = HEADER.format(name=contract.name, version=contract.version, padding=RANGE_PADDING,
                           source=f", drafted from {source}" if source else "")
    return header + yaml.safe_dump(body, sort_keys=False, default_flow_style=None, width=100,
                                   allow_unicode=True)


def _column_mapping(column: ColumnSpec) -> dict[str, Any]:
    mapping: dict[str, Any] = {"name": column.name, "dtype": column.dtype, "nullable": column.nullable}
    if column.dtype in NUMERIC_DTYPES + DATE_DTYPES:
        mapping.update(min=column.min, max=column.max)
    if column.categories is not None:
        mapping["categories"] = list(column.categories)
    return mapping


# ---------------------------------------------------------------- inference


def infer_contract(frame: pd.DataFrame, name: str, id_column: str | None = None,
                   label: str | None = None) -> DataContract:
    """Draft a contract from a sample table (dtypes, nullability, widened ranges, seen categories) to edit."""
    if id_column is None:
        id_column = _guess_id_column(frame)
    for role, column in (("id", id_column), ("label", label)):
        if column is not None and column not in frame.columns:
            raise InputError(f"{role} column {column!r} not in the table; its columns are "
                             f"{', '.join(repr(str(c)) for c in list(frame.columns)[:10])}")
    if label is not None and label == id_column:
        raise InputError(f"the id column and the label are the same column {label!r}")
    columns = [_infer_column(frame[c], str(c)) for c in frame.columns if c not in (id_column, label)]
    return DataContract(name=name, version="1", id_column=id_column, columns=columns,
                        label=_infer_label(frame[label]) if label is not None else None)


def _guess_id_column(frame: pd.DataFrame) -> str:
    """The first column named like an id ('id', '*_id') whose values are unique and non-null."""
    for column in frame.columns:
        lowered = str(column).lower()
        if ((lowered == "id" or lowered.endswith("_id")) and frame[column].notna().all()
                and frame[column].is_unique):
            return str(column)
    raise InputError("no id column given and none found (a unique, non-null column named 'id' or '*_id'); "
                     "name it with --id")


def _infer_column(series: pd.Series, name: str) -> ColumnSpec:
    dtype = _contract_dtype(series)
    nullable = bool(series.isna().any())
    if dtype in NUMERIC_DTYPES:
        low, high = widen_range(pd.to_numeric(series.dropna()), integer=dtype == "int")
        return ColumnSpec(name, dtype, nullable, min=low, max=high)
    if dtype in DATE_DTYPES:
        first, last = year_range(series, dtype)
        return ColumnSpec(name, dtype, nullable, min=first, max=last)
    if dtype == "category":
        values = (series.cat.categories if isinstance(series.dtype, pd.CategoricalDtype)
                  else series.dropna().unique())
        return ColumnSpec(name, dtype, nullable, categories=_sorted_values(values) or None)
    return ColumnSpec(name, dtype, nullable)


def _contract_dtype(series: pd.Series) -> str:
    """Contract dtype from the pandas dtype; object columns by what their values are."""
    from fedcore.data.columns import date_source

    dtype = series.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        return "category"
    source = date_source(series)
    if source is not None:  # the forms `convert_dates` converts: what trains as a date is declared one
        calendar = source == "ISO date strings" or source == "date and datetime values" and not any(
            isinstance(v, dt.datetime) for v in series.dropna())
        return "date" if calendar else "timestamp"
    if pd.api.types.is_bool_dtype(dtype):
        return "bool"
    if pd.api.types.is_integer_dtype(dtype):
        return "int"
    if pd.api.types.is_float_dtype(dtype):
        return "float"
    if pd.api.types.is_object_dtype(dtype) or pd.api.types.is_string_dtype(dtype):
        kind = pd.api.types.infer_dtype(series, skipna=True)
        if kind in ("boolean", "integer", "floating", "mixed-integer-float"):
            return {"boolean": "bool", "integer": "int"}.get(kind, "float")
        if kind in ("string", "empty"):
            distinct = series.nunique(dropna=True)
            return "category" if 0 < distinct <= MAX_INFERRED_CATEGORIES else "string"
    raise InputError(f"column {series.name!r} has dtype {dtype} ({pd.api.types.infer_dtype(series)} values), "
                     f"which a contract cannot describe; convert it to numbers, strings or booleans first")


def _infer_label(series: pd.Series) -> LabelSpec:
    # the same classification/regression rule as `fedforest simulate`
    from fedcore.data.labels import infer_task

    if infer_task(series) == "classification":
        return LabelSpec(str(series.name), classes=_sorted_values(series.dropna().unique()))
    low, high = widen_range(pd.to_numeric(series.dropna()),
                            integer=pd.api.types.is_integer_dtype(series.dtype))
    return LabelSpec(str(series.name), min=low, max=high)


def _sorted_values(values) -> list[Scalar]:
    """Distinct values as plain Python scalars (YAML-safe), sorted by type name then value."""
    plain = {v.item() if isinstance(v, np.generic) else v for v in values}
    return sorted(plain, key=lambda v: (type(v).__name__, v))


def year_range(series: pd.Series, dtype: str) -> tuple[str | None, str | None]:
    """A date column's observed UTC min/max rounded outward to whole years, as ISO strings (None if empty).

    For example dates in 2019-03-04..2024-11-30 become "2019-01-01".."2024-12-31"; a timestamp column's
    bounds are instants ("2019-01-01T00:00:00Z".."2025-01-01T00:00:00Z").
    """
    from fedcore.data.columns import utc_datetimes

    values = utc_datetimes(series).dropna()
    if values.empty:
        return None, None
    first, last = values.min().year, values.max().year
    if dtype == "date":
        return f"{first:04d}-01-01", f"{last:04d}-12-31"
    return f"{first:04d}-01-01T00:00:00Z", f"{last + 1:04d}-01-01T00:00:00Z"


def widen_range(values: pd.Series, integer: bool = False) -> tuple[float | int | None, float | int | None]:
    """Observed min/max widened by 10% of the range, then rounded outward to the range's power of ten.

    For example ages 18..95 (range 77, step 10) become 10..110; values in -3.2..3.5 become -4..5. The
    bounds never cross zero when the data does not (a non-negative column keeps min >= 0), and an
    empty or all-missing column has no bounds.
    """
    if values.empty:
        return None, None
    low, high = float(values.min()), float(values.max())
    span = high - low if high > low else max(abs(high), 1.0)
    step = 10.0 ** math.floor(math.log10(span))
    if integer:
        step = max(step, 1.0)
    lower = math.floor((low - RANGE_PADDING * span) / step) * step
    upper = math.ceil((high + RANGE_PADDING * span) / step) * step
    if low >= 0:
        lower = max(lower, 0.0)
    if high <= 0:
        upper = min(upper, 0.0)
    if integer:
        return int(lower), int(upper)
    digits = max(0, -math.floor(math.log10(step)))
    return round(lower, digits), round(upper, digits)
