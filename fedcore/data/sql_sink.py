"""Predictions delivered into a PostgreSQL table: atomic and idempotent (`fedcore.data.delivery`).

One transaction creates the table if absent (else deletes the rows an earlier attempt of the same delivery
wrote) and appends the new ones (ADBC bulk ingestion, PostgreSQL's COPY), so a retried flow run leaves
exactly one copy and a failed write leaves the table as it was. The table is the institution's own
config's; the master's messages give values (model, version, run id), never a name.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import pandas as pd

from fedcore.data.delivery import DELIVERY_COLUMNS, prepare_delivery
from fedcore.data.sql import SqlSource, connect, connection_string, quote_table, reason
from fedcore.errors import DataWriteError

if TYPE_CHECKING:
    from fedcore.data.delivery import PredictionBatches

INSUFFICIENT_PRIVILEGE = "42501"
COPY_BATCH_ROWS = 16_384
"""Rows per batch handed to ADBC's COPY writer, each made as ADBC asks for it (`Delivery.reader`).

ADBC encodes a whole batch before it sends it: in small batches the server parses one while the driver
encodes the next (1M predictions: about 1.2 s instead of 1.8 s, `benchmarks/bench_sql.py`)."""


def deliver_predictions(sink: SqlSource, predictions: pd.DataFrame | PredictionBatches, model: str,
                        version: str, run_id: str, what: str, when: datetime | None = None) -> int:
    """Write `predictions` (IDs and predicted values) into `sink`'s table, run `run_id` of `model` `version`.

    Replaces the rows of the same delivery (`Delivery.key`: model, version, run id and the predictions'
    digest) in one transaction, streamed to COPY; returns the rows written.
    """
    import adbc_driver_manager

    assert sink.table is not None, "a sink is a table"
    delivery = prepare_delivery(predictions, model, version, run_id, what, when)
    schema, _, name = sink.table.rpartition(".")
    in_schema = schema or None
    url = connection_string(sink, what)
    with connect(sink, what, url) as conn:
        try:
            with conn.cursor() as cursor:
                # create only when absent: CREATE TABLE IF NOT EXISTS needs CREATE on the schema even then
                cursor.execute("SELECT to_regclass($1) IS NOT NULL", (quote_table(sink.table),))
                exists = cursor.fetchone()[0]
                if exists:
                    cursor.execute(f"DELETE FROM {quote_table(sink.table)} WHERE model = $1 AND version = $2 "
                                   "AND run_id = $3 AND batch_sha256 = $4", delivery.key)
                mode = "append" if exists else "create"
                cursor.adbc_ingest(name, delivery.reader(COPY_BATCH_ROWS), mode=mode,
                                   db_schema_name=in_schema)
            conn.commit()
        except adbc_driver_manager.Error as error:
            conn.rollback()
            raise DataWriteError(_refusal(sink, error, url, what)) from None
    return delivery.num_rows


def _refusal(sink: SqlSource, error: BaseException, url: str, what: str) -> str:
    """One line on why the delivery failed (nothing was written) and what the institution fixes."""
    head = f"{what}: cannot write predictions to table {sink.table!r}, nothing written: {reason(error, url)}"
    if getattr(error, "sqlstate", None) == INSUFFICIENT_PRIVILEGE or "permission denied" in str(error):
        return (f"{head}; grant the database user of {sink.connection_ref()} CREATE on the schema and "
                f"SELECT, INSERT and DELETE on {sink.table!r}")
    return (f"{head}; the table's columns must be the predictions' (id column, prediction, proba_<class>, "
            f"{', '.join(DELIVERY_COLUMNS)}): name a new table in predictions.sql.table")
