"""Delivering a run's predictions idempotently: the rows every sink writes and what a retry replaces.

Each delivered row gets the model, version, flow run id, the predictions' digest and the time. A sink keeps
one delivery per flow run of a model (`Delivery.key`: model and run id; Prefect keeps a flow run's id
across its retries): a retried run replaces all its own rows, even when it read other rows than its first
attempt (a batch that gained or lost rows meanwhile) or predicted with another version, and never leaves
two copies. The database sink (`fedcore.data.sql_sink`) deletes the key's rows before appending, in one
transaction; the Parquet dataset sink (`fedcore.data.parquet_sink`) names the run's file by the key's
digest (`Delivery.stem`). The run id is the master's, a checked value (`fedcore.agents.storage.run_id`):
it never becomes a name or SQL text, but a master replaying an old run's id replaces that run's rows with
the predictions it asks for now (docs/design.md).

The predictions arrive as a stream of record batches read twice (`PredictionBatches`): a frame the agent
predicted, or the part files its Dask workers wrote, which are never held whole. The digest is taken over
the rows re-chunked into BATCH_ROWS-row batches, so it does not depend on how the rows arrive.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from fedcore.errors import DataWriteError

if TYPE_CHECKING:
    import pyarrow as pa

DELIVERY_COLUMNS = ("model", "version", "run_id", "batch_sha256", "predicted_at")
"""The columns each delivered row gets besides the predictions: which model version, which run, when."""
BATCH_ROWS = 65_536
"""Rows per batch of the IPC stream the digest hashes (the last batch fewer), however the rows arrive."""


@dataclass(frozen=True)
class PredictionBatches:
    """Predictions (IDs and predicted values) as record batches that `read` gives again for each pass."""

    schema: pa.Schema
    read: Callable[[], Iterable[pa.RecordBatch]]

    @classmethod
    def of_frame(cls, frame: pd.DataFrame) -> PredictionBatches:
        """A frame predicted in the agent's process, as one Arrow table."""
        import pyarrow as pa

        table = pa.Table.from_pandas(frame, preserve_index=False)
        return cls(plain_schema(table.schema), table.to_batches)

    @classmethod
    def nothing(cls) -> PredictionBatches:
        """No predictions and no columns: a Dask batch without rows, which writes no part.

        Delivered, it only removes the rows an earlier attempt of the run delivered.
        """
        import pyarrow as pa

        return cls(pa.schema([]), lambda: [])

    @classmethod
    def of_parts(cls, files: Sequence[Path], what: str) -> PredictionBatches:
        """Parquet part files (a Dask worker's block each), in order, read BATCH_ROWS rows at a time.

        Every part must have the first one's columns and types: one stream has one schema.
        """
        import pyarrow.parquet as pq

        assert files, "a stream of parts has at least one part"
        schema = plain_schema(pq.read_schema(files[0]))

        def read() -> Iterator[pa.RecordBatch]:
            for file in files:
                with pq.ParquetFile(file) as part:
                    if plain_schema(part.schema_arrow) != schema:
                        raise DataWriteError(f"{what}: the prediction part {str(file)!r} has other columns "
                                             f"or types than {str(files[0])!r}, nothing written: the "
                                             "Dask workers must run the agent's fedforest version")
                    yield from part.iter_batches(batch_size=BATCH_ROWS)

        return cls(schema, read)


@dataclass(frozen=True)
class Delivery:
    """One run's predictions and the values of their delivery columns, ready for a sink."""

    predictions: PredictionBatches
    num_rows: int
    model: str
    version: str
    run_id: str
    batch_sha256: str
    predicted_at: pd.Timestamp

    @property
    def key(self) -> tuple[str, str]:
        """What every attempt of one flow run's delivery shares, whatever rows it read: (model, run id)."""
        return self.model, self.run_id

    @property
    def stem(self) -> str:
        """A file name stem for the delivery, chosen by the agent: a digest of `key` (no master text)."""
        return hashlib.sha256("\0".join(self.key).encode()).hexdigest()[:32]

    @property
    def schema(self) -> pa.Schema:
        """The delivered rows' columns: the predictions', then DELIVERY_COLUMNS."""
        import pyarrow as pa

        delivery = [pa.field(name, scalar.type) for name, scalar in zip(DELIVERY_COLUMNS, self._scalars(),
                                                                          strict=True)]
        return pa.schema([*self.predictions.schema, *delivery])

    def batches(self, max_rows: int) -> Iterator[pa.RecordBatch]:
        """The rows in batches of `max_rows` (the last fewer), each with its delivery columns.

        Each batch is made as it is asked for: a sink that streams never holds the rows, or the repeated
        columns of every row, at once.
        """
        import pyarrow as pa

        schema = self.schema
        repeated = [pa.repeat(scalar, min(max_rows, self.num_rows)) for scalar in self._scalars()]
        for batch in rechunk(self.predictions, max_rows):
            columns = [*batch.columns, *(column.slice(0, batch.num_rows) for column in repeated)]
            yield pa.RecordBatch.from_arrays(columns, schema=schema)

    def reader(self, max_rows: int) -> pa.RecordBatchReader:
        """`batches(max_rows)` as a stream a writer pulls from (ADBC's COPY)."""
        import pyarrow as pa

        return pa.RecordBatchReader.from_batches(self.schema, self.batches(max_rows))

    def _scalars(self) -> list[pa.Scalar]:
        """The values of DELIVERY_COLUMNS, typed."""
        import pyarrow as pa

        texts = [pa.scalar(value, pa.string())
                 for value in (self.model, self.version, self.run_id, self.batch_sha256)]
        return [*texts, pa.scalar(self.predicted_at, pa.timestamp("us", tz="UTC"))]


def prepare_delivery(predictions: pd.DataFrame | PredictionBatches, model: str, version: str, run_id: str,
                     what: str, when: datetime | None = None) -> Delivery:
    """`predictions` (IDs and predicted values) with their delivery values; a delivery column is refused.

    Reads the predictions once, for their digest and row count (`rows_sha256`).
    """
    if isinstance(predictions, pd.DataFrame):
        predictions = PredictionBatches.of_frame(predictions)
    clash = [c for c in DELIVERY_COLUMNS if c in predictions.schema.names]
    if clash:
        raise DataWriteError(f"{what}: the predictions already have a column {clash[0]!r}, which the "
                             f"delivery adds ({', '.join(DELIVERY_COLUMNS)}): rename the id column")
    stamp = pd.Timestamp(when or datetime.now(UTC)).tz_convert("UTC")
    digest, rows = rows_sha256(predictions)
    return Delivery(predictions, rows, model, version, run_id, digest, stamp)


def rows_sha256(predictions: PredictionBatches) -> tuple[str, int]:
    """SHA-256 of the rows as an Arrow IPC stream of BATCH_ROWS-row batches, and the row count.

    Equal rows, columns and types give equal digests however the rows are chunked (one frame, a part per
    Dask block); streamed into the hash, one batch at a time.
    """
    import pyarrow as pa

    digest, rows = hashlib.sha256(), 0
    with pa.ipc.new_stream(_HashSink(digest), predictions.schema) as writer:
        for batch in rechunk(predictions, BATCH_ROWS):
            writer.write_batch(batch)
            rows += batch.num_rows
    return digest.hexdigest(), rows


def rechunk(predictions: PredictionBatches, rows: int) -> Iterator[pa.RecordBatch]:
    """The predictions in contiguous batches of exactly `rows` rows (the last fewer), in `schema`.

    Each batch is copied out of the pieces that make it (`pa.concat_batches`), so its buffers, and so
    its IPC bytes, do not depend on the batches the rows arrived in.
    """
    import pyarrow as pa

    pieces: list[pa.RecordBatch] = []
    held = 0
    for arrived in predictions.read():
        batch = pa.RecordBatch.from_arrays(arrived.columns, schema=predictions.schema)
        while batch.num_rows:
            take = min(rows - held, batch.num_rows)
            pieces.append(batch.slice(0, take))
            held, batch = held + take, batch.slice(take)
            if held == rows:
                yield pa.concat_batches(pieces)
                pieces, held = [], 0
    if held:
        yield pa.concat_batches(pieces)


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """`schema`'s names and types only: no pandas or Parquet metadata, which the rows' digest ignores."""
    import pyarrow as pa

    return pa.schema([pa.field(field.name, field.type) for field in schema])


class _HashSink:
    """A write-only file that feeds what an IPC writer writes into a hash (nothing is kept)."""

    closed = False

    def __init__(self, digest: hashlib._Hash) -> None:
        self.digest = digest

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return len(data)

    def flush(self) -> None:
        """Nothing is buffered."""
