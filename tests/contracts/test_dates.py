"""Contracts describe dates and timestamps: inferred from Parquet and CSV, validated, agreed (issue #30).

A Parquet date column, a CSV column of ISO dates and a timestamp with a timezone are drafted as `date` /
`timestamp` with whole-year bounds; validation counts an unparsable value and an out-of-range date by
column; the blocks' reports merge to the whole table's; agreement carries the bounds as days since epoch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcore.cli import main
from fedcore.contracts.agreement import shared_schema
from fedcore.contracts.expectations import validate_frame
from fedcore.contracts.merge import merge_reports
from fedcore.contracts.model import load_contract, parse_contract
from fedcore.errors import ConfigError


def dated_table(n_rows: int = 40) -> pd.DataFrame:
    """Customers with an account-opening date (Parquet date) and a last login in Berlin time."""
    rng = np.random.default_rng(0)
    days = pd.Timestamp("2019-03-04") + pd.to_timedelta(rng.integers(0, 2000, n_rows), unit="D")
    seen = days + pd.to_timedelta(rng.integers(0, 86_400, n_rows), unit="s")
    table = pd.DataFrame({"customer_id": [f"c{i:03d}" for i in range(n_rows)],
                          "opened": [d.date() for d in days],
                          "last_login": seen.tz_localize("Europe/Berlin"),
                          "y": rng.integers(0, 2, n_rows)})
    table.loc[3, "opened"] = None
    return table


def as_csv_text(table: pd.DataFrame) -> pd.DataFrame:
    """The same rows as a CSV export writes them: ISO date and date-time strings (with the offset)."""
    text = table.copy()
    text["opened"] = [None if d is None else d.isoformat() for d in table["opened"]]
    text["last_login"] = [t.isoformat() for t in table["last_login"]]
    return text


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_infer_then_check_describes_dates_and_timestamps_from_parquet_and_csv(capsys, tmp_path: Path,
                                                                              suffix: str) -> None:
    data = tmp_path / f"bank{suffix}"
    if suffix == ".parquet":
        dated_table().to_parquet(data)
    else:
        as_csv_text(dated_table()).to_csv(data, index=False)
    contract_path = tmp_path / "bank.yaml"
    assert _run(capsys, "contract", "infer", data, "--label", "y", "--out", contract_path)[0] == 0
    columns = {c.name: c for c in load_contract(contract_path).columns}
    assert (columns["opened"].dtype, columns["opened"].nullable) == ("date", True)
    assert (columns["opened"].min, columns["opened"].max) == ("2019-01-01", "2024-12-31")
    assert (columns["last_login"].dtype, columns["last_login"].min, columns["last_login"].max) == (
        "timestamp", "2019-01-01T00:00:00Z", "2025-01-01T00:00:00Z")
    code, out, err = _run(capsys, "contract", "check", data, "--contract", contract_path)
    assert (code, err) == (0, ""), out
    assert [line.split()[:3] for line in out.splitlines() if "(dtype date)" in line] == [
        ["ok", "opened", "expect_column_values_to_be_in_type_list(dtype"]]


CONTRACT = parse_contract({
    "name": "bank", "version": "1", "id_column": "customer_id", "label": {"column": "y", "classes": [0, 1]},
    "columns": [{"name": "opened", "dtype": "date", "min": "2019-01-01", "max": "2024-12-31"},
                {"name": "last_login", "dtype": "timestamp", "nullable": False,
                 "min": "2019-01-01T00:00:00+01:00", "max": "2025-01-01T00:00:00Z"}]})


def test_an_out_of_range_date_and_an_unparsable_one_fail_naming_the_column() -> None:
    table = as_csv_text(dated_table())
    assert validate_frame(table, CONTRACT, "north").success
    assert validate_frame(dated_table(), CONTRACT, "north").success  # the same rows as Parquet values
    late = table.copy()
    late.loc[[1, 5], "opened"] = ["2031-01-02", "2018-12-31"]
    assert validate_frame(late, CONTRACT, "north").failure_lines() == [
        "institution 'north', column 'opened': expect_column_values_to_be_between(min '2019-01-01', max "
        "'2024-12-31') failed: 2 unexpected values, e.g. ['2031-01-02', '2018-12-31']"]
    bad = table.copy()
    bad.loc[[1, 2], "opened"] = ["2021-02-30", "2021-02-03T10:00"]  # no such day; a time in a date column
    bad.loc[5, "last_login"] = "soon"
    report = validate_frame(bad, CONTRACT, "north")
    assert report.failure_lines() == [
        "institution 'north', column 'opened': expect_column_values_to_be_in_type_list(dtype date) failed: 2 "
        "values that are not a valid date, e.g. ['2021-02-30', '2021-02-03T10:00']",
        "institution 'north', column 'last_login': expect_column_values_to_be_in_type_list(dtype timestamp) "
        "failed: 1 value that is not a valid timestamp, e.g. ['soon']"]
    numbers = table.assign(opened=np.arange(len(table), dtype=float))
    assert validate_frame(numbers, CONTRACT, "north").failure_lines() == [
        "institution 'north', column 'opened': expect_column_values_to_be_in_type_list(dtype date) failed: "
        "found dtype float64"]


def test_a_timestamps_bounds_and_values_are_compared_in_utc() -> None:
    table = as_csv_text(dated_table())
    # the minimum 2019-01-01T00:00+01:00 is 2018-12-31T23:00Z; a value without an offset is read as UTC
    for value in ("2019-01-01T00:30:00+01:00", "2018-12-31T23:30:00", "2018-12-31T23:00:00Z"):
        early = table.assign(last_login=table["last_login"].where(table.index != 0, value))
        assert validate_frame(early, CONTRACT, "north").success, value
    earlier = table.assign(last_login=table["last_login"].where(table.index != 0, "2018-12-31T22:59:00Z"))
    assert [r["unexpected_count"] for r in validate_frame(earlier, CONTRACT, "north").failures] == [1]


def test_the_blocks_reports_of_a_dated_table_merge_to_the_whole_tables() -> None:
    table = as_csv_text(dated_table())
    table.loc[[1, 30], "opened"] = ["2021-02-30", "2031-05-06"]
    table.loc[33, "last_login"] = "soon"
    whole = validate_frame(table, CONTRACT, "north", max_examples=0)
    parts = [validate_frame(table.iloc[a:b].reset_index(drop=True), CONTRACT, "north", max_examples=0)
             for a, b in ((0, 20), (20, 40))]  # the unparsable date in one block, the late one in the other
    merged = merge_reports(parts, CONTRACT, len(table), duplicates=0)
    strip = [{k: v for k, v in row.items() if k != "examples"} for row in whole.rows]
    assert [{k: v for k, v in row.items() if k != "examples"} for row in merged.rows] == strip
    assert whole.failure_lines() == [
        "institution 'north', column 'opened': expect_column_values_to_be_in_type_list(dtype date) failed: 1 "
        "value that is not a valid date",
        "institution 'north', column 'last_login': expect_column_values_to_be_in_type_list(dtype timestamp) "
        "failed: 1 value that is not a valid timestamp"]


def test_agreement_carries_date_bounds_as_days_and_refuses_date_against_timestamp() -> None:
    other = parse_contract({
        "name": "bank", "version": "1", "id_column": "customer_id",
        "label": {"column": "y", "classes": [0, 1]},
        "columns": [{"name": "opened", "dtype": "date", "min": "2018-07-01", "max": "2024-12-31"},
                    {"name": "last_login", "dtype": "timestamp", "min": "2019-01-01", "max": "2026-01-01"}]})
    shared = shared_schema({"north": CONTRACT, "south": other})
    assert shared.feature_ranges() == {"opened": (17713.0, 20088.0),  # 2018-07-01 .. 2024-12-31
                                       "last_login": (17897.0 - 1 / 24, 20454.0)}  # 2019-01-01T00:00+01:00
    timestamp = parse_contract({**{"name": "bank", "version": "1", "id_column": "customer_id",
                                   "label": {"column": "y", "classes": [0, 1]}},
                                "columns": [{"name": "opened", "dtype": "timestamp"},
                                            {"name": "last_login", "dtype": "timestamp"}]})
    with pytest.raises(Exception, match="column 'opened': dtype 'timestamp', but 'north' declares 'date'"):
        shared_schema({"north": CONTRACT, "south": timestamp})


@pytest.mark.parametrize(("column", "message"), [
    ({"name": "d", "dtype": "date", "min": "2020-01-01T10:00"},
     "columns[0] ('d').min: must be an ISO 8601 date such as \"YYYY-MM-DD\", or null, found "
     "'2020-01-01T10:00'"),
    ({"name": "d", "dtype": "timestamp", "max": "yesterday"},
     "columns[0] ('d').max: must be an ISO 8601 timestamp such as \"YYYY-MM-DDThh:mm:ssZ\" (or a date), or "
     "null, found 'yesterday'"),
    ({"name": "d", "dtype": "date", "min": "2021-02-30"},
     "columns[0] ('d').min: must be an ISO 8601 date such as \"YYYY-MM-DD\", or null, found '2021-02-30'"),
    ({"name": "d", "dtype": "date", "min": "2021-02-03", "max": "2021-02-01"},
     "columns[0] ('d'): min '2021-02-03' is later than max '2021-02-01'"),
])
def test_bad_date_bounds_are_config_errors(column: dict, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_contract({"name": "b", "version": "1", "id_column": "id", "columns": [column]}, "c.yaml")
    assert str(refused.value) == f"c.yaml: {message}"


def test_an_unquoted_yaml_date_bound_reads_as_its_iso_text(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("name: b\nversion: '1'\nid_column: id\ncolumns:\n"
                    "  - {name: d, dtype: date, min: 2020-01-01, max: 2020-12-31}\n")
    assert (load_contract(path).columns[0].min, load_contract(path).columns[0].max) == ("2020-01-01",
                                                                                        "2020-12-31")
