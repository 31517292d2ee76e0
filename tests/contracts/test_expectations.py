"""Contracts run as Great Expectations suites: a clean table passes; every kind of violation is named.

GX is slow (import ~2-10 s, ~1 s per run), so one clean and one broken table are validated once per module.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedcore.contracts.expectations import (
    MAX_EXAMPLES,
    ContractViolation,
    ValidationReport,
    _examples,
    build_suite,
    validate_frame,
)
from fedcore.contracts.model import parse_contract
from fedcore.errors import InputError

CONTRACT = parse_contract({
    "name": "bank", "version": "3", "id_column": "customer_id",
    "label": {"column": "responded", "classes": ["no", "yes"]},
    "row_count": {"min": 50, "max": 1000},
    "columns": [
        {"name": "age", "dtype": "int", "nullable": False, "min": 18, "max": 120},
        {"name": "income", "dtype": "float", "nullable": True, "min": 0, "max": 1e6},
        {"name": "region", "dtype": "category", "nullable": True, "categories": ["north", "south", "east"]},
        {"name": "segment", "dtype": "category", "nullable": False, "categories": ["basic", "premium"]},
        {"name": "vip", "dtype": "bool", "nullable": False},
        {"name": "note", "dtype": "string", "nullable": True},
    ],
})


def clean_frame(n_rows: int = 60) -> pd.DataFrame:
    """A table that keeps CONTRACT: pandas 3 `str` columns, a pandas Categorical, a bool, missing values."""
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({
        "customer_id": [f"c{i:03d}" for i in range(n_rows)],
        "age": rng.integers(18, 121, n_rows),
        "income": rng.uniform(0, 1e6, n_rows),
        "region": rng.choice(["north", "south", "east"], n_rows),
        "segment": pd.Categorical(rng.choice(["basic", "premium"], n_rows)),
        "vip": rng.random(n_rows) < 0.2,
        "note": [f"note {i}" for i in range(n_rows)],
        "responded": rng.choice(["no", "yes"], n_rows),
    })
    frame.loc[[2, 9], ["income", "region", "note"]] = np.nan
    return frame


def broken_frame() -> pd.DataFrame:
    """40 rows (< 50) with every kind of violation, each in its own column."""
    frame = clean_frame(40)
    frame.loc[0, "customer_id"] = None  # null id
    frame.loc[2, "customer_id"] = "c001"  # duplicate id
    frame.loc[3:9, "age"] = [-4, 250, 999, 250, 130, 17, 500]  # 7 out of range, 6 distinct
    frame.loc[[4, 11], "region"] = "west"  # unknown category
    frame["segment"] = frame["segment"].cat.add_categories(["gold"])
    frame.loc[5, "segment"] = "gold"  # unknown category in a pandas Categorical
    frame.loc[6, "responded"] = "maybe"  # unknown class
    frame["vip"] = np.where(frame["vip"], "yes", "no")  # wrong dtype
    frame["zip"] = "12345"  # a column the contract does not name
    return frame.drop(columns=["income"])  # missing column


@pytest.fixture(scope="module")
def clean_report() -> ValidationReport:
    return validate_frame(clean_frame(), CONTRACT, "bank")


@pytest.fixture(scope="module")
def broken_report() -> ValidationReport:
    return validate_frame(broken_frame(), CONTRACT, "bank")


EXPECTED_FAILURES = [
    "institution 'bank', table: expect_table_row_count_to_be_between(min 50, max 1000) failed: found 40 rows",
    "institution 'bank', table: expect_table_columns_to_match_set(exactly the contract's 8 columns) failed: "
    "extra columns ['zip'] not in the contract: leave them out of the data (its query, file or table) or add "
    "them to the contract",
    "institution 'bank', column 'customer_id': expect_column_values_to_not_be_null failed: 1 null value",
    "institution 'bank', column 'customer_id': expect_column_values_to_be_unique failed: "
    "2 non-unique values, e.g. ['c001']",
    "institution 'bank', column 'responded': expect_column_values_to_be_in_set(in ['no', 'yes']) failed: "
    "1 unexpected value, e.g. ['maybe']",
    "institution 'bank', column 'age': expect_column_values_to_be_between(min 18, max 120) failed: "
    "7 unexpected values, e.g. [-4, 250, 999, 130, 17]",
    "institution 'bank', column 'income': expect_column_to_exist failed: not in the table",
    "institution 'bank', column 'region': expect_column_values_to_be_in_set(in ['north', 'south', 'east']) "
    "failed: 2 unexpected values, e.g. ['west']",
    "institution 'bank', column 'segment': expect_column_values_to_be_in_set(in ['basic', 'premium']) "
    "failed: 1 unexpected value, e.g. ['gold']",
    "institution 'bank', column 'vip': expect_column_values_to_be_in_type_list(dtype bool) failed: found "
    "dtype str",
]


def test_a_clean_table_passes(clean_report: ValidationReport) -> None:
    assert clean_report.success, clean_report.failure_lines()
    assert (clean_report.institution, clean_report.contract, clean_report.version) == ("bank", "bank", "3")
    assert all(row["success"] is True for row in clean_report.rows)
    assert len(clean_report.rows) == len(build_suite(CONTRACT).expectations) == 27
    clean_report.raise_for_failure()


def test_every_violation_is_named_with_institution_column_and_found_values(
        broken_report: ValidationReport) -> None:
    assert not broken_report.success
    assert broken_report.failure_lines() == EXPECTED_FAILURES
    with pytest.raises(ContractViolation) as caught:
        broken_report.raise_for_failure()
    assert str(caught.value) == "; ".join(EXPECTED_FAILURES)
    assert isinstance(caught.value, InputError)
    assert caught.value.institution == "bank" and caught.value.failures == broken_report.failures


def test_rows_hold_counts_and_at_most_five_repr_examples(broken_report: ValidationReport) -> None:
    rows = {(row["column"], row["expectation"]): row for row in broken_report.rows}
    age = rows["age", "expect_column_values_to_be_between"]
    assert (age["success"], age["unexpected_count"]) == (False, 7)
    assert age["examples"] == ["-4", "250", "999", "130", "17"]
    assert all(len(row["examples"]) <= MAX_EXAMPLES for row in broken_report.rows)
    assert set(rows["age", "expect_column_to_exist"]) == {
        "expectation", "column", "success", "unexpected_count", "examples", "expected", "found"}


def test_checks_that_depend_on_a_missing_or_mistyped_column_are_skipped(
        broken_report: ValidationReport) -> None:
    rows = {(row["column"], row["expectation"]): row for row in broken_report.rows}
    income = [row for row in broken_report.rows if row["column"] == "income"]
    assert [row["success"] for row in income] == [False, None, None]
    assert income[1]["found"] == "not checked: the column is missing"
    assert rows["vip", "expect_column_values_to_not_be_null"]["success"] is True


def test_examples_are_distinct_plain_reprs_capped() -> None:
    examples = _examples([np.float64(1.0), 1.0, np.int64(2), "a", None, 3, 4, 5], 5)
    assert examples == ["1.0", "2", "'a'", "None", "3"]
    assert _examples([1, 2], 0) == []


def test_suite_without_label_for_prediction_data() -> None:
    suite = build_suite(CONTRACT, include_label=False)
    columns = {e.configuration.kwargs.get("column") for e in suite.expectations}
    assert "responded" not in columns and "customer_id" in columns
    assert suite.name == "bank-v3"
