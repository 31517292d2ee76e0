"""An institution's table and prediction batch in PostgreSQL: read as the Parquet path reads the same rows.

Against the suite's throwaway server (tests/postgres.py). The refusals are one line naming the
institution and the fix, and never show the connection string's password.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcore.agents.data import institution_from_config
from fedcore.config import parse_config
from fedcore.contracts.model import dump_contract, infer_contract
from fedcore.data.sql import SqlSource, read_sql
from fedcore.errors import ConfigError, DataReadError
from tests.postgres import load_table

pytestmark = pytest.mark.postgres


def _frame(n: int = 50) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"customer_id": [f"C{i:04d}" for i in range(n)], "age": rng.integers(18, 90, n),
                          "balance": rng.normal(size=n), "plan": rng.choice(["basic", "pro"], n),
                          "member": rng.random(n) < 0.5, "churned": rng.integers(0, 2, n)})
    frame.loc[3, "balance"] = np.nan
    frame.loc[4, "plan"] = None
    return frame


def _config(tmp_path: Path, data, **bank) -> object:
    raw = {"federation": "f", "consortium_key": {"env": "UNUSED"}, "institutions": [
        {"name": "bank", "data": data, "id_column": "customer_id", "label": "churned", **bank}]}
    return parse_config(raw, tmp_path / "federation.yaml")


def test_a_table_reads_as_the_same_rows_from_parquet_read(database, tmp_path, monkeypatch) -> None:
    frame = _frame()
    load_table(database, "customers", frame)
    frame.to_parquet(tmp_path / "customers.parquet")
    expected = pd.read_parquet(tmp_path / "customers.parquet")
    from_table = read_sql(SqlSource(("url", database), table="customers"), "test")
    pd.testing.assert_frame_equal(from_table, expected, check_exact=True)
    assert list(from_table.dtypes) == list(expected.dtypes)
    query = SqlSource(("url", database), query="SELECT customer_id, balance FROM customers WHERE age >= 50")
    pd.testing.assert_frame_equal(read_sql(query, "test"),
                                  expected.loc[expected["age"] >= 50, ["customer_id", "balance"]]
                                  .reset_index(drop=True), check_exact=True)


def test_an_institution_reads_its_table_and_batch_from_the_database_and_keeps_its_contract(
        database, tmp_path, monkeypatch) -> None:
    frame = _frame()
    load_table(database, "customers", frame)
    load_table(database, "new_customers", frame.drop(columns=["churned"]).head(7))
    contract = infer_contract(frame, "bank", "customer_id", "churned")
    (tmp_path / "bank.yaml").write_text(dump_contract(contract))
    monkeypatch.setenv("BANK_DB_URL", database)
    (tmp_path / "db-url").write_text(database + "\n")
    config = _config(tmp_path, {"sql": {"url": {"env": "BANK_DB_URL"}, "table": "customers"}},
                     predict_data={"sql": {"url": {"file": "db-url"},
                                           "query": "SELECT * FROM new_customers ORDER BY customer_id"}},
                     contract="bank.yaml")
    frame.to_parquet(tmp_path / "customers.parquet")
    data = institution_from_config(config, "bank")
    pd.testing.assert_frame_equal(data.frame, pd.read_parquet(tmp_path / "customers.parquet"),
                                  check_exact=True)
    assert data.valid and data.validation is not None
    assert data.load_batch is not None
    assert data.load_batch()["customer_id"].tolist() == [f"C{i:04d}" for i in range(7)]


def test_an_unset_variable_a_wrong_server_and_a_missing_table_are_one_line_each(
        postgres, database, tmp_path, monkeypatch) -> None:
    config = _config(tmp_path, {"sql": {"url": {"env": "BANK_DB_URL"}, "table": "customers"}})
    monkeypatch.delenv("BANK_DB_URL", raising=False)
    with pytest.raises(ConfigError) as refused:
        institution_from_config(config, "bank")
    assert str(refused.value) == ("institution 'bank': environment variable BANK_DB_URL is not set: export "
                                  "it with the database's connection string "
                                  "(postgresql://user:password@host:port/database)")

    monkeypatch.setenv("BANK_DB_URL", postgres.url("no_such_db", password="hunter2-secret"))
    with pytest.raises(DataReadError) as refused:
        institution_from_config(config, "bank")
    assert str(refused.value) == (
        "institution 'bank': cannot connect to the database: Failed to connect: connection to server at "
        f"\"127.0.0.1\", port {postgres.port} failed: FATAL: database \"no_such_db\" does not exist; correct "
        "the connection string in environment variable BANK_DB_URL (server, port, database, user and "
        "password)")
    monkeypatch.setenv("BANK_DB_URL", "postgresql://bank:hunter2-secret@127.0.0.1:1/bank")
    with pytest.raises(DataReadError) as refused:
        institution_from_config(config, "bank")
    assert "hunter2" not in str(refused.value) and "\n" not in str(refused.value)
    assert str(refused.value).startswith("institution 'bank': cannot connect to the database: Failed to "
                                         "connect: connection to server at \"127.0.0.1\", port 1 failed: "
                                         "Connection refused")

    monkeypatch.setenv("BANK_DB_URL", database)
    with pytest.raises(DataReadError) as refused:
        institution_from_config(config, "bank")
    assert str(refused.value) == ("institution 'bank': table 'customers' does not exist in the database of "
                                  "environment variable BANK_DB_URL: create it, or name the right table in "
                                  "sql.table")


def test_a_connection_string_in_the_config_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigError) as refused:
        _config(tmp_path, {"sql": {"url": "postgresql://bank:pw@db/bank", "table": "customers"}})
    assert str(refused.value) == (f"{tmp_path}/federation.yaml: institution 'bank': data: sql.url must be "
                                  "{env: VARIABLE} or {file: path}, never the connection string itself")
    assert "pw" not in str(refused.value)
    with pytest.raises(ConfigError) as refused:
        _config(tmp_path, {"sql": {"url": {"env": "X"}, "table": "customers; DROP TABLE x"}})
    assert str(refused.value) == (f"{tmp_path}/federation.yaml: institution 'bank': data: sql.table "
                                  "'customers; DROP TABLE x' is not a table name like 'customers' or "
                                  "'bank.customers' (letters, digits, underscores)")


def test_a_query_returning_a_column_the_contract_does_not_know_fails_validation_by_name(
        database, tmp_path, monkeypatch) -> None:
    frame = _frame()
    load_table(database, "customers", frame.assign(segment="retail"))
    contract = infer_contract(frame, "bank", "customer_id", "churned")
    (tmp_path / "bank.yaml").write_text(dump_contract(contract))
    monkeypatch.setenv("BANK_DB_URL", database)
    config = _config(tmp_path, {"sql": {"url": {"env": "BANK_DB_URL"}, "query": "SELECT * FROM customers"}},
                     contract="bank.yaml")
    data = institution_from_config(config, "bank")
    assert not data.valid and data.validation is not None
    assert data.validation.failure_lines() == [
        "institution 'bank', table: expect_table_columns_to_match_set(exactly the contract's "
        f"{len(frame.columns)} columns) failed: extra columns ['segment'] not in the contract: leave them "
        "out of the data (its query, file or table) or add them to the contract"]
    agreeing = _config(tmp_path, {"sql": {"url": {"env": "BANK_DB_URL"},
                                          "query": f"SELECT {', '.join(frame.columns)} FROM customers"}},
                       contract="bank.yaml")
    assert institution_from_config(agreeing, "bank").valid


def test_a_predictions_sink_is_a_table_never_a_query(tmp_path) -> None:
    sink = {"sql": {"url": {"env": "BANK_DB_URL"}, "query": "SELECT 1"}}
    with pytest.raises(ConfigError) as refused:
        _config(tmp_path, "bank.parquet", predictions=sink)
    assert str(refused.value) == (f"{tmp_path}/federation.yaml: institution 'bank': predictions: unknown sql "
                                  "setting 'query'; known: ['url', 'table']")
    config = _config(tmp_path, "bank.parquet",
                     predictions={"sql": {"url": {"file": "secrets/db"}, "table": "bank.scores"}})
    inst = config.institution("bank")
    assert inst.predictions_sql == SqlSource(("file", f"{tmp_path}/secrets/db"), table="bank.scores")
    assert inst.predictions == tmp_path / "predictions" / "bank"


def test_a_numeric_column_is_refused_with_the_cast_to_use(postgres, database) -> None:
    postgres.execute("CREATE TABLE loans AS SELECT 'L1' AS loan_id, 1250.50::numeric AS amount",
                     database.rsplit("/", 1)[1])
    with pytest.raises(DataReadError) as refused:
        read_sql(SqlSource(("url", database), table="loans"), "institution 'bank'")
    assert str(refused.value) == ("institution 'bank': column 'amount' has PostgreSQL type numeric, which is "
                                  "read as text: read it through sql.query with a cast, e.g. SELECT "
                                  "amount::float8 AS amount, ...")
    cast = read_sql(SqlSource(("url", database), query="SELECT loan_id, amount::float8 AS amount FROM loans"),
                    "institution 'bank'")
    assert cast["amount"].tolist() == [1250.5]


def test_the_read_gathered_in_chunks_per_column_gives_the_frame_arrow_gives(
        postgres, database, monkeypatch) -> None:
    """Several of the driver's batches, gathered into several chunks per column, convert to Arrow's frame.

    Nulls in an integer and a boolean column, text, timestamps and dates, and text, date and timestamp
    columns whose first null comes in a later batch: the same values and dtypes as the whole Arrow table's
    `to_pandas()`, the text, date and timestamp columns built batch by batch (never gathered).
    """
    from fedcore.data.sql import owned_batches, read_arrow

    later = "CASE WHEN g > 200000 AND g % 11 = 0 THEN NULL ELSE"
    postgres.execute(
        "CREATE TABLE wide AS SELECT g AS id, CASE WHEN g % 7 = 0 THEN NULL ELSE g END AS n, "
        "g % 3 = 0 AS flag, CASE WHEN g % 5 = 0 THEN NULL ELSE g % 2 = 0 END AS maybe, 'c' || g AS name, "
        "g::float8 / 7 AS x, timestamptz '2026-01-01 00:00:00+00' + g * interval '1 second' AS at, "
        "date '2026-01-01' + g % 400 AS day, "
        f"{later} 'v' || g % 50 END AS plan, {later} date '2026-01-01' - g % 900 END AS since, "
        f"{later} timestamp '2026-01-01 00:00:00' + g * interval '1 minute' END AS seen "
        "FROM generate_series(1, 300000) AS g",
        database.rsplit("/", 1)[1])
    source = SqlSource(("url", database), table="wide")
    whole = read_arrow(source, "test", "id")
    assert whole.column(0).num_chunks > 1, "the driver sends several batches"
    for group, chunks in ((1, whole.column(0).num_chunks), (2**30, 1)):  # a chunk per batch; all in one
        monkeypatch.setattr("fedcore.data.sql.GROUP_BYTES", group)
        owned = read_arrow(source, "test", "id", into=owned_batches)
        assert {column.num_chunks for column in owned.columns} == {chunks}
        assert owned.equals(whole)
    monkeypatch.undo()
    gathered: list[list[str]] = []

    def gather(reader):
        gathered.append(reader.schema.names)
        return owned_batches(reader)

    monkeypatch.setattr("fedcore.data.sql.owned_batches", gather)
    frame, expected = read_sql(source, "test", "id"), whole.to_pandas()
    pd.testing.assert_frame_equal(frame, expected, check_exact=True)
    assert list(frame.dtypes) == list(expected.dtypes)
    assert str(expected["n"].dtype) == "float64" and str(expected["maybe"].dtype) == "object"
    assert gathered == [["flag", "maybe"]], "text, dates and timestamps are built batch by batch"
    assert [str(frame[c].dtype) for c in ("name", "plan", "at", "day", "since", "seen")] == [
        "str", "str", "datetime64[us, UTC]", "object", "object", "datetime64[us]"]
    first_null = int(frame["since"].isna().to_numpy().argmax())
    assert first_null >= len(whole.column(0).chunk(0)), "the first null is in a later batch"
    for name in ("plan", "since", "seen"):  # NaN, None and NaT where Arrow has them
        assert repr(frame[name].iloc[first_null]) == repr(expected[name].iloc[first_null]), name
