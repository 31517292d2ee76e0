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
    from collections.abc import Iterator

    import pyarrow as pa

DELIVERY_COLUMNS = ("model", "version", "run_id", "batch_sha256", "predicted_at")
"""The columns each delivered row gets besides the predictions: which model version, which run, when."""


@dataclass(frozen=True)
class Delivery:
    """One run's predictions and the values of their delivery columns, ready for a sink."""

    predictions: pa.Table
    model: str
    version: str
    run_id: str
    batch_sha256: str
    predicted_at: pd.Timestamp

    @property
    def key(self) -> tuple[str, str, str, str]:
        """What a retry of the same delivery shares: (model, version, run id, predictions' digest)."""
        return self.model, self.version, self.run_id, self.batch_sha256

    @property
    def stem(self) -> str:
        """A file name stem for the delivery, chosen by the agent: a digest of `key` (no master text)."""
        return hashlib.sha256("\0".join(self.key).encode()).hexdigest()[:32]

    @property
    def num_rows(self) -> int:
        """The rows delivered."""
        return self.predictions.num_rows

    @property
    def schema(self) -> pa.Schema:
        """The delivered rows' columns: the predictions', then DELIVERY_COLUMNS."""
        import pyarrow as pa

        delivery = [pa.field(name, scalar.type) for name, scalar in zip(DELIVERY_COLUMNS, self._scalars(),
                                                                          strict=True)]
        return pa.schema([*self.predictions.schema.remove_metadata(), *delivery])

    @property
    def rows(self) -> pa.Table:
        """The predictions with their delivery columns, whole."""
        import pyarrow as pa

        return pa.Table.from_batches(list(self.batches(max(self.num_rows, 1))), self.schema)

    def batches(self, max_rows: int) -> Iterator[pa.RecordBatch]:
        """The rows in batches of at most `max_rows`, each batch's delivery columns made as it is asked for.

        A sink that streams (PostgreSQL's COPY) never holds the repeated columns of every row at once.
        """
        import pyarrow as pa

        schema = self.schema
        repeated = [pa.repeat(scalar, min(max_rows, self.num_rows)) for scalar in self._scalars()]
        for batch in self.predictions.to_batches(max_chunksize=max_rows):
            columns = [*batch.columns, *(column.slice(0, batch.num_rows) for column in repeated)]
            yield pa.RecordBatch.from_arrays(columns, schema=schema)

    def _scalars(self) -> list[pa.Scalar]:
        """The values of DELIVERY_COLUMNS, typed."""
        import pyarrow as pa

        texts = [pa.scalar(value, pa.string()) for value in self.key]
        return [*texts, pa.scalar(self.predicted_at, pa.timestamp("us", tz="UTC"))]

def prepare_delivery(frame: pd.DataFrame, model: str, version: str, run_id: str, what: str,
                     when: datetime | None = None) -> Delivery:
    """`frame` (IDs and predictions) as Arrow with its delivery values; a delivery column in it is refused."""
    import pyarrow as pa

    clash = [c for c in DELIVERY_COLUMNS if c in frame.columns]
    if clash:
        raise DataWriteError(f"{what}: the predictions already have a column {clash[0]!r}, which the "
                             f"delivery adds ({', '.join(DELIVERY_COLUMNS)}): rename the id column")
    stamp = pd.Timestamp(when or datetime.now(UTC)).tz_convert("UTC")
    predictions = pa.Table.from_pandas(frame, preserve_index=False)
    return Delivery(predictions, model, version, run_id, rows_sha256(predictions), stamp)


def rows_sha256(rows: pa.Table) -> str:
    """SHA-256 of the rows in Arrow's IPC stream format: equal rows, columns and types give equal digests."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema.remove_metadata()) as writer:
        writer.write_table(rows.replace_schema_metadata(None))
    return hashlib.sha256(memoryview(sink.getvalue())).hexdigest()  # the buffer itself, not a copy of it
