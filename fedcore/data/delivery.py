"""Delivering a run's predictions idempotently: the rows every sink writes and what a retry replaces.

Each delivered row gets the model, version, flow run id, the predictions' digest and the time. A sink keeps
one copy per (model, version, run id, digest) (`Delivery.key`): a retried run replaces its own rows, and a
master that replays an old run's id with other predictions replaces nothing of that run. The database sink
(`fedcore.data.sql_sink`) deletes the key's rows before appending; the Parquet dataset sink
(`fedcore.data.parquet_sink`) names the run's file by the key's digest (`Delivery.stem`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pandas as pd

from fedcore.errors import DataWriteError

if TYPE_CHECKING:
    import pyarrow as pa

DELIVERY_COLUMNS = ("model", "version", "run_id", "batch_sha256", "predicted_at")
"""The columns each delivered row gets besides the predictions: which model version, which run, when."""


@dataclass(frozen=True)
class Delivery:
    """One run's predictions with their delivery columns, ready for a sink."""

    rows: pa.Table
    model: str
    version: str
    run_id: str
    batch_sha256: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        """What a retry of the same delivery shares: (model, version, run id, predictions' digest)."""
        return self.model, self.version, self.run_id, self.batch_sha256

    @property
    def stem(self) -> str:
        """A file name stem for the delivery, chosen by the agent: a digest of `key` (no master text)."""
        return hashlib.sha256("\0".join(self.key).encode()).hexdigest()[:32]


def prepare_delivery(frame: pd.DataFrame, model: str, version: str, run_id: str, what: str,
                     when: datetime | None = None) -> Delivery:
    """`frame` (IDs and predictions) as Arrow with the delivery columns, refused if it already has one."""
    import pyarrow as pa

    clash = [c for c in DELIVERY_COLUMNS if c in frame.columns]
    if clash:
        raise DataWriteError(f"{what}: the predictions already have a column {clash[0]!r}, which the "
                             f"delivery adds ({', '.join(DELIVERY_COLUMNS)}): rename the id column")
    n = len(frame)
    stamp = pd.Timestamp(when or datetime.now(UTC)).tz_convert("UTC")
    rows = pa.Table.from_pandas(frame, preserve_index=False)
    batch = rows_sha256(rows)
    for column, value in zip(DELIVERY_COLUMNS[:4], (model, version, run_id, batch), strict=True):
        rows = rows.append_column(column, pa.repeat(pa.scalar(value, pa.string()), n))
    rows = rows.append_column("predicted_at", pa.repeat(pa.scalar(stamp, pa.timestamp("us", tz="UTC")), n))
    return Delivery(rows, model, version, run_id, batch)


def rows_sha256(rows: pa.Table) -> str:
    """SHA-256 of the rows in Arrow's IPC stream format: equal rows, columns and types give equal digests."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema.remove_metadata()) as writer:
        writer.write_table(rows.replace_schema_metadata(None))
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()
