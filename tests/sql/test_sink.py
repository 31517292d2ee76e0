"""Predictions delivered into a PostgreSQL table: created if absent, one delivery per flow run of a model.

A failed delivery (a table of other columns, a user without write permission) is one line and leaves the
table as it was; two deliveries that both create the absent table both land.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest

from fedcore.data.delivery import PredictionBatches
from fedcore.data.sql import SqlSource, read_sql
from fedcore.data.sql_sink import deliver_predictions
from fedcore.errors import DataWriteError

pytestmark = pytest.mark.postgres
WHEN = datetime(2026, 11, 27, 8, 30, tzinfo=UTC)


def _predictions(n: int, offset: int = 0) -> pd.DataFrame:
    return pd.DataFrame({"customer_id": [f"C{i:03d}" for i in range(offset, offset + n)],
                         "prediction": ["churn" if i % 3 else "stay" for i in range(n)],
                         "proba_churn": [i / n for i in range(n)],
                         "proba_stay": [1 - i / n for i in range(n)]})


def _rows(database: str) -> pd.DataFrame:
    table = SqlSource(("url", database), query="SELECT * FROM scores ORDER BY run_id, customer_id")
    return read_sql(table, "test")


def test_a_retried_delivery_replaces_its_own_rows_and_other_runs_stay(database) -> None:
    sink = SqlSource(("url", database), table="scores")
    later = WHEN + timedelta(minutes=5)
    assert deliver_predictions(sink, _predictions(4, 10), "churn", "v0001", "run-a", "bank", WHEN) == 4
    assert deliver_predictions(sink, _predictions(4, 10), "churn", "v0001", "run-a", "bank", later) == 4
    rows = _rows(database)
    assert rows["customer_id"].tolist() == [f"C{i:03d}" for i in range(10, 14)], "the retry replaced run-a"
    assert list(rows.columns) == ["customer_id", "prediction", "proba_churn", "proba_stay", "model",
                                  "version", "run_id", "batch_sha256", "predicted_at"]
    assert set(rows["model"]) == {"churn"} and set(rows["version"]) == {"v0001"}
    assert (rows["predicted_at"] == pd.Timestamp(later)).all() and rows["batch_sha256"].nunique() == 1
    pd.testing.assert_frame_equal(rows[_predictions(1).columns], _predictions(4, 10), check_exact=True)
    deliver_predictions(sink, _predictions(3), "churn", "v0001", "run-b", "bank", WHEN)
    deliver_predictions(sink, _predictions(2), "upsell", "v0001", "run-a", "bank", WHEN)
    counts = _rows(database).groupby(["model", "run_id"]).size().to_dict()
    assert counts == {("churn", "run-a"): 4, ("churn", "run-b"): 3, ("upsell", "run-a"): 2}


def test_the_table_the_agent_creates_finds_a_runs_rows_by_an_index(database) -> None:
    """A sink table grows by a batch a run: the created table is indexed on (model, run_id) for the DELETE."""
    sink = SqlSource(("url", database), table="scores")
    deliver_predictions(sink, _predictions(3), "churn", "v0001", "run-a", "bank", WHEN)
    deliver_predictions(sink, _predictions(3), "churn", "v0001", "run-b", "bank", WHEN)
    indexes = read_sql(SqlSource(("url", database), query=(
        "SELECT indexdef FROM pg_indexes WHERE tablename = 'scores'")), "test")["indexdef"].tolist()
    assert [d.split(" USING ")[1] for d in indexes] == ["btree (model, run_id)"]


def test_a_retry_that_read_other_rows_leaves_exactly_its_new_rows_once(postgres, database) -> None:
    """The run's batch lost, gained and changed rows since its first attempt, which delivered them.

    The retry (same run id) replaces every row of its first attempt, under any version; other runs stay.
    """
    sink = SqlSource(("url", database), table="scores")
    deliver_predictions(sink, _predictions(3, 20), "churn", "v0001", "run-b", "bank", WHEN)
    deliver_predictions(sink, _predictions(5), "churn", "v0001", "run-a", "bank", WHEN)
    changed = pd.concat([_predictions(5).iloc[1:], _predictions(2, 10)], ignore_index=True)
    changed.loc[0, "proba_churn"] = 0.5
    assert deliver_predictions(sink, changed, "churn", "v0001", "run-a", "bank", WHEN) == 6
    rows = _rows(database)
    retried = rows.loc[rows["run_id"] == "run-a"].reset_index(drop=True)
    pd.testing.assert_frame_equal(retried[changed.columns], changed, check_exact=True)
    assert retried["batch_sha256"].nunique() == 1 and rows["run_id"].value_counts().to_dict() == {
        "run-a": 6, "run-b": 3}
    deliver_predictions(sink, _predictions(2, 30), "churn", "v0002", "run-a", "bank", WHEN)  # a new version
    rows = _rows(database)
    assert rows.groupby(["run_id", "version"]).size().to_dict() == {("run-a", "v0002"): 2,
                                                                    ("run-b", "v0001"): 3}
    assert deliver_predictions(sink, _predictions(0), "churn", "v0002", "run-a", "bank", WHEN) == 0
    assert _rows(database)["run_id"].tolist() == ["run-b"] * 3, "a retry that found no rows leaves none"
    deliver_predictions(sink, _predictions(2, 40), "churn", "v0002", "run-c", "bank", WHEN)
    no_parts = PredictionBatches.nothing()  # a Dask batch without rows: no part, no columns
    assert deliver_predictions(sink, no_parts, "churn", "v0002", "run-c", "bank", WHEN) == 0
    assert _rows(database)["run_id"].tolist() == ["run-b"] * 3
    absent = SqlSource(("url", database), table="other_scores")
    assert deliver_predictions(absent, _predictions(0), "churn", "v0002", "run-a", "bank", WHEN) == 0
    assert postgres.execute("SELECT to_regclass('other_scores') IS NULL", database.rsplit("/", 1)[1]) == [
        (True,)], "no rows: no table created"


def test_a_failed_delivery_leaves_the_table_as_it_was(database) -> None:
    sink = SqlSource(("url", database), table="scores")
    deliver_predictions(sink, _predictions(5), "churn", "v0001", "run-a", "bank", WHEN)
    other = _predictions(5).assign(prediction=1.5)  # a number where the table holds text
    with pytest.raises(DataWriteError) as refused:
        deliver_predictions(sink, other, "churn", "v0001", "run-a", "institution 'bank'", WHEN)
    message = str(refused.value)
    assert message.startswith("institution 'bank': cannot write predictions to table 'scores', nothing "
                              "written: ")
    assert message.endswith("; the table's columns must be the predictions' (id column, prediction, "
                            "proba_<class>, model, version, run_id, batch_sha256, predicted_at): name a "
                            "new table in predictions.sql.table")
    assert "\n" not in message
    pd.testing.assert_frame_equal(_rows(database)[_predictions(1).columns], _predictions(5), check_exact=True)


def test_a_user_without_write_permission_is_one_line_and_nothing_is_written(postgres, database) -> None:
    name = database.rsplit("/", 1)[1]
    sink = SqlSource(("url", database), table="scores")
    deliver_predictions(sink, _predictions(5), "churn", "v0001", "run-a", "bank", WHEN)
    if not postgres.execute("SELECT 1 FROM pg_roles WHERE rolname = 'reader'"):
        postgres.execute("CREATE ROLE reader LOGIN")
    postgres.execute("GRANT SELECT ON scores TO reader", name)
    reader = SqlSource(("url", postgres.url(name, user="reader", password="r3ader-pw")), table="scores")
    with pytest.raises(DataWriteError) as refused:
        deliver_predictions(reader, _predictions(2), "churn", "v0001", "run-a", "institution 'bank'", WHEN)
    assert str(refused.value) == (
        "institution 'bank': cannot write predictions to table 'scores', nothing written: permission denied "
        "for table scores; grant the database user of the --data URL CREATE on the schema and SELECT, INSERT "
        "and DELETE on 'scores'")
    assert len(_rows(database)) == 5
    elsewhere = SqlSource(reader.url, table="new_scores")  # PostgreSQL 15: no CREATE on public by default
    with pytest.raises(DataWriteError, match="permission denied for schema public; grant"):
        deliver_predictions(elsewhere, _predictions(2), "churn", "v0001", "run-a", "bank", WHEN)
    assert postgres.execute("SELECT to_regclass('new_scores') IS NULL", name) == [(True,)]


def test_two_deliveries_creating_the_absent_table_at_once_both_land_once(postgres, database) -> None:
    """Both find the table absent and create it; the one that loses appends in a fresh transaction.

    A third transaction holds the name (an uncommitted CREATE TABLE) until both deliveries wait on it, so
    they race every time; then it rolls back, one delivery creates the table, the other appends.
    """
    import adbc_driver_postgresql.dbapi as pg

    name = database.rsplit("/", 1)[1]
    sink = SqlSource(("url", database), table="scores")
    holder = pg.connect(database)
    try:
        with holder.cursor() as cursor:
            cursor.execute("CREATE TABLE scores (x int)")
        with ThreadPoolExecutor(2) as pool:
            runs = [pool.submit(deliver_predictions, sink, _predictions(n, 10 * n), "churn", "v0001",
                                f"run-{n}", "bank", WHEN) for n in (3, 4)]
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND " \
                      "wait_event_type = 'Lock'"
            deadline = time.monotonic() + 20
            while postgres.execute(waiting, name) != [(2,)] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert postgres.execute(waiting, name) == [(2,)], "both deliveries wait to create the table"
            holder.rollback()
            assert [run.result(timeout=20) for run in runs] == [3, 4]
    finally:
        holder.close()
    counts = _rows(database).groupby("run_id")["customer_id"].apply(list).to_dict()
    assert counts == {"run-3": ["C030", "C031", "C032"], "run-4": ["C040", "C041", "C042", "C043"]}


def test_only_a_create_that_found_the_table_made_is_taken_for_a_lost_race(postgres, database) -> None:
    """The other creator committed first (42P07, which ADBC's ingestion reports without its SQLSTATE).

    An append into a table of other columns fails with ADBC's same ALREADY_EXISTS status: not a race.
    """
    import adbc_driver_manager
    import adbc_driver_postgresql.dbapi as pg
    import pyarrow as pa

    from fedcore.data.sql_sink import lost_create_race

    postgres.execute("CREATE TABLE scores (x int8)", database.rsplit("/", 1)[1])
    errors = []
    with pg.connect(database) as conn:
        for mode, rows in (("create", pa.table({"x": [1]})), ("append", pa.table({"y": ["a"]}))):
            with conn.cursor() as cursor, pytest.raises(adbc_driver_manager.Error) as failed:
                cursor.adbc_ingest("scores", rows, mode=mode)
            conn.rollback()
            errors.append(failed.value)
    assert [lost_create_race(error) for error in errors] == [True, False]


def test_a_delivery_whose_create_finds_the_table_committed_by_another_appends_once(
        postgres, database, caplog) -> None:
    """The other creator commits after this delivery found the table absent, before its CREATE TABLE ran.

    An event trigger holds the late delivery's CREATE TABLE (its connection's application_name) on an
    advisory lock the test holds; meanwhile another delivery creates the table and commits. Released, the
    CREATE fails with 42P07 (`relation "scores" already exists`, which ADBC's ingestion reports as
    ALREADY_EXISTS without its SQLSTATE): the delivery rolls back and runs again once, appending. Both land
    once.
    """
    import logging

    import adbc_driver_postgresql.dbapi as pg

    name = database.rsplit("/", 1)[1]
    postgres.execute("""
        CREATE FUNCTION hold_late_create() RETURNS event_trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF current_setting('application_name') = 'late' THEN
                PERFORM pg_advisory_lock_shared(42);
                PERFORM pg_advisory_unlock_shared(42);
            END IF;
        END $$""", name)
    postgres.execute("CREATE EVENT TRIGGER hold_late_create ON ddl_command_start "
                     "WHEN TAG IN ('CREATE TABLE') EXECUTE FUNCTION hold_late_create()", name)
    late = SqlSource(("url", f"{database}?application_name=late"), table="scores")
    sink = SqlSource(("url", database), table="scores")
    holder = pg.connect(database, autocommit=True)
    try:
        with holder.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(42)")
        with ThreadPoolExecutor(1) as pool, caplog.at_level(logging.INFO, logger="fedcore.data.sql_sink"):
            run = pool.submit(deliver_predictions, late, _predictions(3, 30), "churn", "v0001", "run-3",
                              "bank", WHEN)
            waiting = ("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'late' AND "
                       "wait_event_type = 'Lock' AND query LIKE 'CREATE TABLE%'")
            deadline = time.monotonic() + 20
            while postgres.execute(waiting, name) != [(1,)] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert postgres.execute(waiting, name) == [(1,)], "the late delivery waits in its CREATE TABLE"
            other = deliver_predictions(sink, _predictions(4, 40), "churn", "v0001", "run-4", "bank", WHEN)
            assert other == 4, "the other delivery created the table and committed"
            with holder.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(42)")
            assert run.result(timeout=20) == 3
        assert "bank: table 'scores' was created by another delivery meanwhile: appending" in caplog.text
    finally:
        holder.close()
    counts = _rows(database).groupby("run_id")["customer_id"].apply(list).to_dict()
    assert counts == {"run-3": ["C030", "C031", "C032"], "run-4": ["C040", "C041", "C042", "C043"]}
