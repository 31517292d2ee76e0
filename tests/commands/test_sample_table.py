"""`fedforest sample-table`.

The README tour's table, as CSV or Parquet, the same for the same seed, read by `simulate` as the tour says
(an ID column, an ISO date, strings, booleans and missing values).
"""

from __future__ import annotations

import pandas as pd
import pytest

from fedcore.cli import main
from fedcore.data.io import read_table
from fedcore.simulation import prepare_input


def test_csv_and_parquet_hold_the_same_customers(tmp_path, capsys) -> None:
    assert main(["sample-table", "--out", str(tmp_path / "c.csv"), "--rows", "300", "--seed", "3"]) == 0
    assert main(["sample-table", "--out", str(tmp_path / "c.parquet"), "--rows", "300", "--seed", "3"]) == 0
    assert "--label responded --id-column customer_id" in capsys.readouterr().out
    csv, parquet = pd.read_csv(tmp_path / "c.csv"), pd.read_parquet(tmp_path / "c.parquet")
    assert len(csv) == len(parquet) == 300 and list(csv.columns) == list(parquet.columns)
    assert csv["customer_id"].is_unique and set(csv["responded"]) == {"yes", "no"}
    assert csv["premium"].dtype == float and csv["premium"].notna().all() and csv.isna().any().any()
    pd.testing.assert_series_equal(csv["customer_since"], parquet["customer_since"])


def test_simulate_reads_it_as_the_tour_says(tmp_path) -> None:
    path = tmp_path / "customers.csv"
    assert main(["sample-table", "--out", str(path), "--rows", "200"]) == 0
    table, columns = prepare_input(read_table(path), "responded", id_column="customer_id")
    assert [d["column"] for d in columns["dates"]] == ["customer_since"] and columns["id"] == "customer_id"
    assert "customer_id" not in table.columns and pd.api.types.is_float_dtype(table["customer_since"])


def test_same_seed_same_table_other_seed_other_table(tmp_path) -> None:
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        assert main(["sample-table", "--out", str(tmp_path / f"{name}.csv"), "--rows", "50",
                     "--seed", str(seed)]) == 0
    a, b, c = ((tmp_path / f"{name}.csv").read_bytes() for name in "abc")
    assert a == b != c


@pytest.mark.parametrize(("argv", "message"), [
    (["--out", "t.xlsx"], "fedforest: error: --out t.xlsx: the file must end in .csv or .parquet"),
    (["--out", "t.csv", "--rows", "5"], "fedforest: error: --rows must be between 20 and 10000000, got 5"),
    (["--out", "t.csv", "--seed", "-1"], "fedforest: error: --seed must be 0 or more, got -1"),
])
def test_bad_input_is_one_line(tmp_path, capsys, monkeypatch, argv, message) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["sample-table", *argv]) == 1
    assert capsys.readouterr().err.strip() == message and not list(tmp_path.iterdir())
