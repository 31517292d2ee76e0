"""Dates to days since epoch, and the categorical-size check (`fedcore.data.columns`).

Both simulators share them.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from fedcore.data.columns import DAYS, check_category_sizes, convert_dates, date_source, days_since_epoch
from fedcore.errors import InputError
from tests.conftest import write_any_table


def test_iso_date_strings_become_days_since_epoch() -> None:
    days = days_since_epoch(pd.Series(["1970-01-02", None, "2000-03-01", "1969-12-31"], name="d"))
    np.testing.assert_array_equal(days.to_numpy(), [1.0, np.nan, 11017.0, -1.0])
    assert days.name == "d" and days.dtype == np.float64


def test_times_are_fractions_of_a_utc_day_exact_to_the_microsecond() -> None:
    strings = pd.Series(["2021-01-01T12:00:00+02:00", "2021-01-01 10:00Z", "2021-01-01 10:00:00",
                         "1970-01-01T00:00:00.000001"])
    days = days_since_epoch(strings).to_numpy()
    assert days[0] == days[1] == days[2] == 18628 + 10 / 24  # offsets to UTC; naive values are read as UTC
    assert days[3] * 86_400_000_000 == 1.0


def test_parquet_date_forms_give_the_same_numbers_as_iso_strings() -> None:
    instants = ["2020-02-29 23:59:59.5", "1999-12-31 00:00:00", None]
    strings = pd.Series(["2020-03-01T00:59:59.5+01:00", "1999-12-31", None])
    expected = days_since_epoch(strings).to_numpy()
    naive_ns = pd.Series(pd.to_datetime(instants, format="ISO8601")).astype("datetime64[ns]")
    paris = (pd.Series(pd.to_datetime(instants, format="ISO8601")).dt.tz_localize("UTC")
             .dt.tz_convert("Europe/Paris"))
    objects = pd.Series([dt.datetime(2020, 2, 29, 23, 59, 59, 500000), dt.date(1999, 12, 31), None],
                        dtype=object)
    for form in (naive_ns, paris, objects):
        assert date_source(form) is not None
        np.testing.assert_array_equal(days_since_epoch(form).to_numpy(), expected)


@pytest.mark.parametrize(("values", "source"), [
    (["2021-01-01", None, "2021-12-31"], "ISO date strings"),
    (["2021-01-01", "2021-01-01T08:30", "2021-01-01 08:30:00.25-05:00"], "ISO datetime strings"),
    (pd.to_datetime(["2021-01-01"]), "datetime values"),
    ([dt.date(2021, 1, 1), None], "date and datetime values"),
    (["2021-01-01", "soon"], None),            # not every value is a date: stays a string column
    (["20210101", "20210102"], None),           # not ISO 8601's extended form
    (["2021-1-1"], None),
    (["paris", "lyon"], None),
    ([None, None], None),
    ([True, False, None], None),
    ([1.5, 2.5], None),
    (pd.Categorical(["2021-01-01", "2021-01-02"]), None),  # a declared categorical stays categorical
])
def test_date_source_detects_only_date_columns(values, source) -> None:
    assert date_source(pd.Series(values)) == source


def test_an_impossible_iso_date_is_refused() -> None:
    with pytest.raises(InputError, match=r"^column 'd' holds ISO dates, but 1 values are not valid dates "
                                         r"\('2021-02-30'\); correct or blank them$"):
        days_since_epoch(pd.Series(["2021-02-28", "2021-02-30"], name="d"))


def test_convert_dates_keeps_the_label_and_says_what_it_converted() -> None:
    table = pd.DataFrame({"d": ["2021-01-01", "2021-01-02"], "t": pd.to_datetime(["2021-01-01", None]),
                          "s": ["a", "b"], "y": ["2021-01-01", "2021-01-03"]})
    converted, conversions = convert_dates(table, keep=["y"])
    assert [c.to_dict() for c in conversions] == [
        {"column": "d", "from": "ISO date strings", "to": DAYS},
        {"column": "t", "from": "datetime values", "to": DAYS},
    ]
    assert converted["d"].tolist() == [18628.0, 18629.0]
    assert converted["s"].tolist() == ["a", "b"] and converted["y"].tolist() == ["2021-01-01", "2021-01-03"]
    assert table["d"].tolist() == ["2021-01-01", "2021-01-02"]  # the caller's table is left alone


def test_csv_and_parquet_of_one_table_convert_to_the_same_numbers(tmp_path) -> None:
    csv, parquet = write_any_table(tmp_path)
    from_csv, csv_conversions = convert_dates(pd.read_csv(csv), keep=["y"])
    from_parquet, parquet_conversions = convert_dates(pd.read_parquet(parquet), keep=["y"])
    assert [c.source for c in csv_conversions] == ["ISO date strings", "ISO datetime strings"]
    assert [c.source for c in parquet_conversions] == ["datetime values", "datetime values in Europe/Paris"]
    for column in ("signup", "last_seen"):
        pd.testing.assert_series_equal(from_csv[column], from_parquet[column])


def test_check_category_sizes_refuses_a_column_of_too_many_strings() -> None:
    table = pd.DataFrame({"note": [f"n{i}" for i in range(6)], "plan": ["a", "b"] * 3, "x": np.arange(6.0),
                          "y": [f"c{i}" for i in range(6)]})
    check_category_sizes(table, keep=["note", "y"], limit=5)
    with pytest.raises(InputError,
                       match=r"^column 'note' holds 6 distinct strings that are not ISO dates: too many "
                             r"for a categorical feature \(at most 5\); if it identifies rows pass it as "
                             r"the id column \(--id-column note\), else leave it out \(--drop note\)$"):
        check_category_sizes(table, keep=["y"], limit=5)


def test_declared_dates_convert_exactly_those_columns_and_refuse_numbers() -> None:
    table = pd.DataFrame({"opened": ["2020-01-02", None], "other": ["2020-01-03", "2020-01-04"],
                          "empty": [np.nan, np.nan], "n": [1.0, 2.0]})
    converted, notes = convert_dates(table, dates=["opened", "empty", "absent"])
    np.testing.assert_array_equal(converted["opened"].to_numpy(), [18263.0, np.nan])
    assert converted["empty"].isna().all() and converted["empty"].dtype == np.float64
    assert list(converted["other"]) == ["2020-01-03", "2020-01-04"], "an undeclared column is not guessed"
    assert [n.column for n in notes] == ["opened", "empty"]
    with pytest.raises(InputError) as refused:
        convert_dates(table, dates=["n"])
    assert str(refused.value) == (
        "column 'n' holds dtype float64, but its data contract (or, without one, the training table) makes "
        "it a date column: give it dates or ISO 8601 strings")


COLUMNS = {
    "date objects": [dt.date(2020, 1, 2), None, dt.date(2021, 5, 6), dt.date(2019, 3, 4), None,
                     dt.date(2022, 1, 1)],
    "iso strings": ["2020-01-02", None, "2021-05-06T10:00", "2019-03-04", "2018-01-01", None],
    "dates then strings": [dt.date(2020, 1, 2), dt.date(2021, 5, 6), None, "2019-03-04", "2018-01-01", None],
    "a word among dates": ["2020-01-02", "2021-05-06", "soon", "2019-03-04", None, "2018-01-01"],
    "all missing": [None] * 6,
    "words": ["a", "b", None, "c", "d", "e"],
    "numbers": [1.0, 2.0, np.nan, 4.0, 5.0, 6.0],
    "booleans": [True, False, True, True, False, True],
    "timestamps": pd.to_datetime(["2020-01-02", None, "2021-05-06", "2019-03-04", "2018-01-01", None]),
}


@pytest.mark.parametrize("cuts", [(), (3,), (1, 2), (2, 4), (5,), (0, 6)])
@pytest.mark.parametrize("column", COLUMNS)
def test_blocks_evidence_decides_dates_as_the_whole_column(column, cuts) -> None:
    """Dask blocks decide a table's date columns without a contract exactly as the whole table does."""
    from fedcore.data.columns import date_evidence, holds_dates

    whole = pd.Series(COLUMNS[column], name=column)
    bounds = [0, *cuts, len(whole)]
    parts = [whole.iloc[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    assert holds_dates([date_evidence(p) for p in parts]) == (date_source(whole) is not None)
