"""Data contracts run as Great Expectations 1.x suites on pandas frames, with a per-expectation report.

`build_suite` turns a `DataContract` into an `ExpectationSuite`; `validate_frame` runs it on a DataFrame in
an ephemeral GX context and returns a `ValidationReport` whose `raise_for_failure` stops bad input at the
edge (design principle 5) with a `ContractViolation` naming the institution, column, expectation and the
values found. GX is imported lazily (its import costs seconds) with analytics off and progress bars off.

dtype checks: GX 1.24's `expect_column_values_to_be_in_type_list` compares a column's dtype with the listed
names, but matches neither pandas 3's default `str` dtype nor `category`; for string and category contract
columns those dtypes are validated as `object`, so each value's Python type is checked instead. A float
column accepts integer dtypes too (an integer is a valid number; CSV readers give int64 for whole numbers).

Dates: GX sees a date or timestamp column parsed by `fedcore.data.columns.parse_dates` (the parser the
agents convert with), as pandas Timestamps in UTC, and every value it could not parse (or, in a `date`
column, one with a time of day) as its text. `expect_column_values_to_be_in_type_list([Timestamp])` then
counts the unparsable values, and `expect_column_values_to_be_between` checks the range on the parsed
instants. A column of numbers or booleans is left as it is, so its dtype fails.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from fedcore.contracts.model import DATE_DTYPES, ColumnSpec, DataContract, LabelSpec
from fedcore.errors import ContractViolation, InputError

if TYPE_CHECKING:
    from great_expectations.core import ExpectationSuite

MAX_EXAMPLES = 5
# GX is asked for more unexpected values than we show, so that duplicates can be dropped from the examples.
_PARTIAL_UNEXPECTED = 20
_META = "fedforest"
_MAX_SHOWN_SET = 10

INT_TYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "Int8Dtype",
             "Int16Dtype", "Int32Dtype", "Int64Dtype", "UInt8Dtype", "UInt16Dtype", "UInt32Dtype",
             "UInt64Dtype", "int"]
FLOAT_TYPES = ["float16", "float32", "float64", "Float32Dtype", "Float64Dtype", "float"] + INT_TYPES
BOOL_TYPES = ["bool", "BooleanDtype"]
STRING_TYPES = ["str"]
DATE_TYPES = ["Timestamp"]

EXIST = "expect_column_to_exist"
NOT_NULL = "expect_column_values_to_not_be_null"
UNIQUE = "expect_column_values_to_be_unique"
IN_SET = "expect_column_values_to_be_in_set"
BETWEEN = "expect_column_values_to_be_between"
TYPE_LIST = "expect_column_values_to_be_in_type_list"
ROW_COUNT = "expect_table_row_count_to_be_between"
COLUMN_SET = "expect_table_columns_to_match_set"


@dataclass
class ValidationReport:
    """The outcome of validating one institution's table: one row per expectation, in suite order."""

    institution: str
    contract: str
    version: str
    success: bool
    rows: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failures(self) -> list[dict[str, Any]]:
        """The rows whose expectation failed (rows not checked because of an earlier failure excluded)."""
        return [row for row in self.rows if row["success"] is False]

    def failure_lines(self) -> list[str]:
        """One sentence per failure: institution, column, expectation(arguments), what was found."""
        return [_failure_line(self.institution, row) for row in self.failures]

    def raise_for_failure(self) -> None:
        """Raise `ContractViolation` listing every failure; do nothing when the data kept its contract."""
        if not self.success:
            raise ContractViolation("; ".join(self.failure_lines()), self.institution, self.failures)


def _failure_line(institution: str, row: dict[str, Any]) -> str:
    where = f"column {row['column']!r}" if row["column"] is not None else "table"
    call = f"{row['expectation']}({row['expected']})" if row["expected"] else row["expectation"]
    return f"institution {institution!r}, {where}: {call} failed: {row['found']}"


# ---------------------------------------------------------------- building the suite


def _gx():
    """great_expectations and its expectations module, imported on first use with analytics off."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    import great_expectations.expectations as gxe

    gx_logger = logging.getLogger("great_expectations")
    if gx_logger.level == logging.NOTSET:
        gx_logger.setLevel(logging.ERROR)
    # GX pins this one to INFO at import; it then logs a temporary docs folder on every ephemeral context.
    logging.getLogger("great_expectations.data_context.types.base").setLevel(logging.WARNING)
    return gx, gxe


def build_suite(contract: DataContract, include_label: bool = True) -> ExpectationSuite:
    """The contract as a GX ExpectationSuite.

    `include_label=False` for data that has no label (prediction).
    """
    gx, gxe = _gx()
    specs: list[tuple[str, dict[str, Any], str | None, str]] = []  # (class name, kwargs, column, expected)
    if contract.row_count is not None:
        low, high = contract.row_count
        specs.append(("ExpectTableRowCountToBeBetween", {"min_value": low, "max_value": high}, None,
                      _bounds_text(low, high)))
    if not contract.allow_extra_columns:
        specs.append(("ExpectTableColumnsToMatchSet",
                      {"column_set": contract.column_names, "exact_match": True}, None,
                      f"exactly the contract's {len(contract.column_names)} columns"))
    specs += _presence(contract.id_column, nullable=False)
    specs.append(("ExpectColumnValuesToBeUnique", {}, contract.id_column, ""))
    label = contract.label
    if label is not None and include_label:
        specs += _label_specs(label)
    for column in contract.columns:
        specs += _column_specs(column)
    expectations = []
    for index, (class_name, kwargs, column_name, expected) in enumerate(specs):
        if column_name is not None:
            kwargs = {"column": column_name, **kwargs}
        meta = {_META: {"index": index, "column": column_name, "expected": expected}}
        expectations.append(getattr(gxe, class_name)(**kwargs, meta=meta))
    # Passed to the constructor: `suite.add_expectation` needs an active data context in GX 1.24.
    suite = gx.ExpectationSuite(name=f"{contract.name}-v{contract.version}", expectations=expectations)
    if len(suite.expectations) != len(expectations):  # the constructor logs and drops invalid ones
        raise InputError(f"data contract {contract.name!r}: GX refused "
                         f"{len(expectations) - len(suite.expectations)} of its {len(expectations)} "
                         "expectations; check its values")
    return suite


def _label_specs(label: LabelSpec) -> list[tuple[str, dict, str, str]]:
    """The label's expectations: present and never null, then its classes, or a float in its range."""
    specs = _presence(label.column, nullable=False)
    if label.classes is not None:
        specs.append(("ExpectColumnValuesToBeInSet", {"value_set": list(label.classes)}, label.column,
                      _set_text(label.classes)))
    else:
        specs.append(("ExpectColumnValuesToBeInTypeList", {"type_list": FLOAT_TYPES}, label.column,
                      "dtype float"))
        if label.min is not None or label.max is not None:
            specs.append(("ExpectColumnValuesToBeBetween", {"min_value": label.min, "max_value": label.max},
                          label.column, _bounds_text(label.min, label.max)))
    return specs


def _column_specs(column: ColumnSpec) -> list[tuple[str, dict, str, str]]:
    """A feature column's expectations: presence, dtype, then its range and categories where declared."""
    specs = _presence(column.name, nullable=column.nullable)
    specs.append(("ExpectColumnValuesToBeInTypeList",
                  {"type_list": _type_list(column.dtype, column.categories)}, column.name,
                  f"dtype {column.dtype}"))
    if column.min is not None or column.max is not None:
        low: Any = column.min
        high: Any = column.max
        if column.dtype in DATE_DTYPES:  # compared as instants, as the view holds them
            from fedcore.data.columns import parse_instant

            low, high = (None if v is None else parse_instant(str(v)) for v in (low, high))
        specs.append(("ExpectColumnValuesToBeBetween", {"min_value": low, "max_value": high},
                      column.name, _bounds_text(column.min, column.max)))
    if column.categories is not None:
        specs.append(("ExpectColumnValuesToBeInSet", {"value_set": list(column.categories)}, column.name,
                      _set_text(column.categories)))
    return specs


def _presence(column: str, nullable: bool) -> list[tuple[str, dict, str, str]]:
    specs: list[tuple[str, dict, str, str]] = [("ExpectColumnToExist", {}, column, "")]
    if not nullable:
        specs.append(("ExpectColumnValuesToNotBeNull", {}, column, ""))
    return specs


def _type_list(dtype: str, categories: list | None) -> list[str]:
    """GX type names a column of this contract dtype may have (dtype names and Python value types)."""
    if dtype == "float":
        return FLOAT_TYPES
    if dtype == "int":
        return INT_TYPES
    if dtype == "bool":
        return BOOL_TYPES
    if dtype in DATE_DTYPES:
        return DATE_TYPES
    if dtype == "category" and categories:
        kinds = {type(value) for value in categories}
        names = [name for kind, group in ((str, STRING_TYPES), (bool, BOOL_TYPES), (int, INT_TYPES),
                                          (float, FLOAT_TYPES)) if kind in kinds for name in group]
        return list(dict.fromkeys(names))
    return STRING_TYPES


def _bounds_text(low: Any, high: Any) -> str:
    return ", ".join(f"{name} {value!r}" for name, value in (("min", low), ("max", high))
                     if value is not None)


def _set_text(values: list) -> str:
    shown = ", ".join(repr(v) for v in values[:_MAX_SHOWN_SET])
    if len(values) > _MAX_SHOWN_SET:
        return f"in [{shown}, ...] ({len(values)} values)"
    return f"in [{shown}]"


# ---------------------------------------------------------------- running it


def validate_frame(frame: pd.DataFrame, contract: DataContract, institution: str,
                   include_label: bool = True, max_examples: int = MAX_EXAMPLES) -> ValidationReport:
    """Validate one institution's table against its contract with GX; `max_examples=0` reports no values."""
    gx, _ = _gx()
    from great_expectations.data_context.types.base import ProgressBarsConfig

    start = time.perf_counter()  # after the one-off GX import
    suite = build_suite(contract, include_label=include_label)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"great_expectations(\.|$)")
        context = gx.get_context(mode="ephemeral")
        context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        batch_definition = (context.data_sources.add_pandas("fedforest")
                            .add_dataframe_asset(name=institution)
                            .add_batch_definition_whole_dataframe("whole"))
        batch = batch_definition.get_batch(batch_parameters={"dataframe": _gx_view(frame, contract)})
        result = batch.validate(suite, result_format={"result_format": "SUMMARY",
                                                      "partial_unexpected_count": _PARTIAL_UNEXPECTED})
    rows = _report_rows(result.results, frame, min(max(max_examples, 0), MAX_EXAMPLES))
    return ValidationReport(institution=institution, contract=contract.name, version=contract.version,
                            success=all(row["success"] is not False for row in rows), rows=rows,
                            seconds=time.perf_counter() - start)


def _gx_view(frame: pd.DataFrame, contract: DataContract) -> pd.DataFrame:
    """The frame as GX checks it (see the module doc).

    String and categorical dtypes of text columns as object (so GX checks value types), date columns parsed.
    """
    from fedcore.data.columns import may_hold_dates

    dates = {c.name: c.dtype for c in contract.columns if c.dtype in DATE_DTYPES
             and c.name in frame.columns and may_hold_dates(frame[c.name])}
    if dates:
        frame = frame.copy(deep=False)
        for name, dtype in dates.items():
            frame[name] = _date_view(frame[name], dtype)
    text_columns = [c.name for c in contract.columns if c.dtype in ("string", "category")]
    if contract.label is not None and contract.label.classes is not None:
        text_columns.append(contract.label.column)
    convert = [c for c in text_columns if c in frame.columns
               and (isinstance(frame[c].dtype, pd.CategoricalDtype)
                    or pd.api.types.is_string_dtype(frame[c].dtype))
               and not pd.api.types.is_object_dtype(frame[c].dtype)]
    if not convert:
        return frame
    view = frame.copy(deep=False)
    for column in convert:
        view[column] = frame[column].astype(object)
    return view


def _date_view(series: pd.Series, dtype: str) -> pd.Series:
    """Parsed dates as Timestamps (UTC), None where missing, the text of a value that is not a `dtype`."""
    from fedcore.data.columns import parse_dates

    parsed = parse_dates(series)
    bad = series.notna().to_numpy() & parsed.isna().to_numpy()
    if dtype == "date":
        bad |= (parsed.notna() & (parsed != parsed.dt.normalize())).to_numpy()
    view = parsed.astype(object).where(parsed.notna(), None)
    if bad.any():
        view[bad] = series[bad].astype(str).to_numpy()
    return view


def _report_rows(results: list, frame: pd.DataFrame, max_examples: int) -> list[dict[str, Any]]:
    results = sorted(results, key=lambda r: r.expectation_config.meta[_META]["index"])
    present = set(frame.columns)
    wrong_type = {r.expectation_config.meta[_META]["column"] for r in results
                  if r.expectation_config.type == TYPE_LIST and not r.success} & present
    rows = []
    for r in results:
        kind, meta = r.expectation_config.type, r.expectation_config.meta[_META]
        column = meta["column"]
        row = {"expectation": kind, "column": column, "success": bool(r.success), "unexpected_count": None,
               "examples": [], "expected": meta["expected"], "found": ""}
        error = _exception_message(r.exception_info)
        if column is not None and kind != EXIST and column not in present:
            row.update(success=None, found="not checked: the column is missing")
        elif kind in (BETWEEN, IN_SET) and column in wrong_type:
            row.update(success=None, found="not checked: the column has the wrong dtype")
        elif error is not None:
            row.update(success=False, found=f"GX could not check it: {error}")
        else:
            _fill_found(row, r.result, frame, max_examples)
        rows.append(row)
    return rows


def _exception_message(info: dict) -> str | None:
    """The exception GX caught while checking one expectation, if any (its two layouts both handled)."""
    if not info:
        return None
    entries = [info] if "raised_exception" in info else [v for v in info.values() if isinstance(v, dict)]
    for entry in entries:
        if entry.get("raised_exception"):
            return " ".join(str(entry.get("exception_message") or "unknown error").split())
    return None


def _fill_found(row: dict[str, Any], result: dict, frame: pd.DataFrame, max_examples: int) -> None:
    kind, column = row["expectation"], row["column"]
    count = result.get("unexpected_count")
    if count is not None:
        row["unexpected_count"] = int(count)
        row["examples"] = _examples(result.get("partial_unexpected_list") or [], max_examples)
    if kind == EXIST:
        row["found"] = "" if row["success"] else "not in the table"
    elif kind == ROW_COUNT:
        row["found"] = f"found {result.get('observed_value')} rows"
    elif kind == COLUMN_SET:
        extra = result.get("details", {}).get("mismatched", {}).get("unexpected", [])
        # Missing columns are reported by expect_column_to_exist; this row is about extra columns only.
        row["success"] = not extra
        row["found"] = (f"extra columns {extra} not in the contract: leave them out of the data (its query, "
                        "file or table) or add them to the contract" if extra else "")
    elif kind == TYPE_LIST and count is None:
        row["found"] = f"found dtype {frame[column].dtype}"
    else:
        row["found"] = counted_found(kind, count if not row["success"] else 0, row["examples"],
                                     row["expected"])


def counted_found(kind: str, count: int | None, examples: Sequence[str] = (), expected: str = "") -> str:
    """What a row-wise expectation found: "" when it passed, else "<count> <what>" with any examples.

    `expected` is the row's expectation text: a date column's type check counts values that are no date.
    """
    if not count:
        return ""
    what = {NOT_NULL: "null value", UNIQUE: "non-unique value", TYPE_LIST: "value of another type"}
    noun = what.get(kind, "unexpected value")
    found = f"{count} {noun if count == 1 else noun.replace('value', 'values')}"
    dtype = expected.removeprefix("dtype ")
    if kind == TYPE_LIST and dtype in DATE_DTYPES:
        found = f"{count} {'value that is not a' if count == 1 else 'values that are not a'} valid {dtype}"
    if kind != NOT_NULL and examples:
        found += f", e.g. [{', '.join(examples)}]"
    return found


def _examples(values: list, limit: int) -> list[str]:
    """At most `limit` distinct unexpected values, repr'd as plain Python values, in order of appearance."""
    shown: list[str] = []
    for value in values:
        if isinstance(value, pd.Timestamp):  # a parsed date (see `_date_view`) as its ISO text
            value = value.isoformat() if value != value.normalize() else value.date().isoformat()
        text = repr(value.item() if isinstance(value, np.generic) else value)
        if text not in shown:
            shown.append(text)
        if len(shown) >= limit:
            break
    return shown[:limit]
