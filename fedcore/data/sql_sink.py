"""Predictions delivered into a PostgreSQL table: atomic and idempotent (`fedcore.data.delivery`).

One transaction creates the table if absent (else deletes the rows an earlier attempt of the same flow run
delivered for the model, whatever they were) and appends the new ones (ADBC bulk ingestion, PostgreSQL's
COPY), so a retried flow run leaves exactly its new rows, once, and a failed write leaves the table as it
was. Two deliveries that find the table absent at once both create it: the one that loses runs again in a
fresh transaction, appending. The table is the institution's own config's; the master's messages give
values (model, version, run id), never a name.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pandas as pd

from fedcore.data.delivery import DELIVERY_COLUMNS, prepare_delivery
from fedcore.data.sql import SqlSource, connect, connection_string, quote_table, reason
from fedcore.errors import DataWriteError

if TYPE_CHECKING:
    from fedcore.data.delivery import Delivery, PredictionBatches

log = logging.getLogger(__name__)

INSUFFICIENT_PRIVILEGE = "42501"
DUPLICATE_TABLE = "42P07"
CATALOG_NAME_INDEXES = ("pg_type_typname_nsp_index", "pg_class_relname_nsp_index")
"""The unique indexes a CREATE TABLE racing another one of the same name violates."""
COPY_BATCH_ROWS = 16_384
"""Rows per batch handed to ADBC's COPY writer, each made as ADBC asks for it (`Delivery.reader`).

ADBC encodes a whole batch before it sends it: in small batches the server parses one while the driver
encodes the next (1M predictions: about 1.2 s instead of 1.8 s, `benchmarks/bench_sql.py`)."""


def deliver_predictions(sink: SqlSource, predictions: pd.DataFrame | PredictionBatches, model: str,
                        version: str, run_id: str, what: str, when: datetime | None = None) -> int:
    """Write `predictions` (IDs and predicted values) into `sink`'s table, run `run_id` of `model` `version`.

    Replaces the rows of the same flow run of the model (`Delivery.key`), whichever rows or version an
    earlier attempt delivered, in one transaction, streamed to COPY; returns the rows written. A delivery
    that created the table while another did too runs once more, appending (`lost_create_race`).
    """
    import adbc_driver_manager

    assert sink.table is not None, "a sink is a table"
    delivery = prepare_delivery(predictions, model, version, run_id, what, when)
    url = connection_string(sink, what)
    with connect(sink, what, url) as conn:
        for attempt in (1, 2):
            try:
                _replace_rows(conn, sink.table, delivery)
                break
            except adbc_driver_manager.Error as error:
                conn.rollback()
                if attempt == 2 or not lost_create_race(error):
                    raise DataWriteError(_refusal(sink, error, url, what)) from None
                log.info("%s: table %r was created by another delivery meanwhile: appending to it", what,
                         sink.table)
    return delivery.num_rows


def _replace_rows(conn: Any, table: str, delivery: Delivery) -> None:
    """One transaction: create `table` if absent (rows to add), else delete the run's earlier rows; append.

    A table this creates gets an index on (model, run_id), so the DELETE of a later delivery finds its run's
    rows without reading the whole table.
    """
    schema, _, name = table.rpartition(".")
    with conn.cursor() as cursor:
        # create only when absent: CREATE TABLE IF NOT EXISTS needs CREATE on the schema even then
        cursor.execute("SELECT to_regclass($1) IS NOT NULL", (quote_table(table),))
        exists = cursor.fetchone()[0]
        if exists:
            cursor.execute(f"DELETE FROM {quote_table(table)} WHERE model = $1 AND run_id = $2",
                           delivery.key)
        if delivery.num_rows:  # no rows: no table to create, nothing to append
            cursor.adbc_ingest(name, delivery.reader(COPY_BATCH_ROWS), mode="append" if exists else "create",
                               db_schema_name=schema or None)
            if not exists:  # the agent made it: every later delivery's DELETE finds its run by this index
                cursor.execute(f"CREATE INDEX ON {quote_table(table)} (model, run_id)")
    conn.commit()


def lost_create_race(error: Exception) -> bool:
    """Whether a CREATE TABLE failed because another transaction created the same table meanwhile.

    PostgreSQL says duplicate_table (42P07; ADBC's ALREADY_EXISTS) when the other committed first, and a
    unique violation of its catalog's name index when both created at once (the second waits, then fails).
    ADBC's bulk ingestion reports neither with a SQLSTATE, and its ALREADY_EXISTS status also means a
    column an append did not find: only its failed CREATE with either of those counts.
    """
    from adbc_driver_manager import AdbcStatusCode

    if getattr(error, "sqlstate", None) == DUPLICATE_TABLE:
        return True
    text = str(error)
    return "Failed to create table" in text and (
        getattr(error, "status_code", None) == AdbcStatusCode.ALREADY_EXISTS
        or any(f'"{index}"' in text for index in CATALOG_NAME_INDEXES))


def _refusal(sink: SqlSource, error: BaseException, url: str, what: str) -> str:
    """One line on why the delivery failed (nothing was written) and what the institution fixes."""
    head = f"{what}: cannot write predictions to table {sink.table!r}, nothing written: {reason(error, url)}"
    if getattr(error, "sqlstate", None) == INSUFFICIENT_PRIVILEGE or "permission denied" in str(error):
        return (f"{head}; grant the database user of {sink.connection_ref()} CREATE on the schema and "
                f"SELECT, INSERT and DELETE on {sink.table!r}")
    return (f"{head}; the table's columns must be the predictions' (id column, prediction, proba_<class>, "
            f"{', '.join(DELIVERY_COLUMNS)}): name a new table in predictions.sql.table")
