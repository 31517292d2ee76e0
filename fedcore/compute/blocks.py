"""An institution's rows as fixed blocks in a canonical order, and reading one block where it runs.

The order is the institution's row order: for an in-memory frame its rows, cut every `block_rows`; for
Parquet, the files sorted by their path relative to the dataset folder, each file's row groups in order,
each row group cut every `block_rows`; a Parquet dataset folder or URL's files likewise
(`fedcore.data.io.dataset_files`), each block also carrying its file system and Hive partition values. It
depends on the data and `block_rows` only, never on the number of workers or where a block runs, so every
level's per-block results combine in block order to the in-process party's results
(`fedcore.compute.dask_rows`).

Only Parquet metadata is read here (row counts per row group); the rows themselves are read by
`load_block`, on the worker that holds the block. A database table or query is cut by its key instead
(`fedcore.data.sql.key_blocks`: every block the rows between two keys, in key order).

Blocks' integer results that only add up (histograms) are summed on each worker over the blocks it holds,
then by the party (`per_worker_sums`), for the horizontal boosting and the vertical Dask parties alike.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pandas as pd

from fedcore.compute import DEFAULT_BLOCK_ROWS
from fedcore.data.io import DatasetFile, dataset_files
from fedcore.errors import DataReadError, ParameterError
from fedcore.horizontal.schema import HorizontalSchema

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from distributed import Client, Future
    from pyarrow.fs import FileSystem

    from fedcore.data.sql import SqlBlock

T = TypeVar("T")


@dataclass(frozen=True)
class Block:
    """One block: rows [start, stop) of the institution's canonical order.

    For Parquet, where they are: `path`, its row group `row_group`, rows from `group_start` of that group;
    a dataset's file also its `filesystem` (None: the local disk) and `partition` values, appended as
    columns after the file's own (`fedcore.data.io.DatasetFile`). In a database, `sql`: the key range the
    worker reads. Neither: a slice of an in-memory frame.
    """

    index: int
    start: int
    stop: int
    path: str | None = None
    row_group: int = -1
    group_start: int = 0
    sql: SqlBlock | None = None
    filesystem: FileSystem | None = None
    partition: tuple[tuple[str, pa.Scalar], ...] = ()

    @property
    def n_rows(self) -> int:
        """Rows in the block."""
        return self.stop - self.start


def _check_block_rows(block_rows: int) -> int:
    if isinstance(block_rows, bool) or not isinstance(block_rows, int | np.integer) or block_rows < 1:
        raise ParameterError(f"block_rows must be a positive integer, got {block_rows!r}")
    return int(block_rows)


def frame_blocks(n_rows: int, block_rows: int = DEFAULT_BLOCK_ROWS) -> list[Block]:
    """Blocks of `block_rows` rows (the last one shorter) over `n_rows` in-memory rows."""
    block_rows = _check_block_rows(block_rows)
    return [Block(i, start, min(start + block_rows, n_rows))
            for i, start in enumerate(range(0, n_rows, block_rows))]


def parquet_files(source: str | os.PathLike) -> list[DatasetFile]:
    """A Parquet file, or a dataset folder's files as `fedcore.data.io.read_dataset` reads them.

    In path order, hidden `.`/`_` entries skipped, each with its Hive partition values.
    """
    root = Path(source)
    if root.is_file():
        return [DatasetFile(str(root), None)]
    if not root.is_dir():
        raise DataReadError(f"Parquet source {str(root)!r}: no such file or folder")
    return dataset_files(str(root))[0]


def parquet_blocks(source: str | os.PathLike | Sequence[str | os.PathLike | DatasetFile],
                   block_rows: int = DEFAULT_BLOCK_ROWS) -> list[Block]:
    """The blocks of a Parquet file or dataset folder: (file, row group, row range), in canonical order.

    `source` may also be a list of files (a config's `data` glob, sorted as `fedcore.agents.data.read_files`
    concatenates them, or a dataset's `DatasetFile`s): their blocks follow one another in that order.
    """
    block_rows = _check_block_rows(block_rows)
    files = (list(source) if isinstance(source, Sequence) and not isinstance(source, str)
             else parquet_files(source))
    blocks: list[Block] = []
    start = 0
    for file in files:
        where = file if isinstance(file, DatasetFile) else DatasetFile(str(file), None)
        meta = parquet_file(where.path, where.filesystem).metadata
        for group in range(meta.num_row_groups):
            n = meta.row_group(group).num_rows
            for first in range(0, n, block_rows):
                size = min(block_rows, n - first)
                blocks.append(Block(len(blocks), start, start + size, where.path, group, first,
                                    filesystem=where.filesystem, partition=where.partition))
                start += size
    return blocks


STREAM_BUFFER_BYTES = 1 << 20
"""A streamed Parquet file's read buffer (`parquet_file`)."""


def parquet_file(path: str, filesystem: FileSystem | None = None, streamed: bool = False) -> pq.ParquetFile:
    """The Parquet file at `path` on `filesystem` (None: the local disk), opened for its metadata or rows.

    `streamed`: its pages read through a STREAM_BUFFER_BYTES buffer as they are decoded, not each row
    group's column chunks buffered whole first (Arrow's `pre_buffer`, which suits object storage's few
    large requests better: a block in object storage keeps it).
    """
    import pyarrow.parquet as pq

    if streamed:
        return pq.ParquetFile(path, filesystem=filesystem, pre_buffer=False, buffer_size=STREAM_BUFFER_BYTES)
    return pq.ParquetFile(path, filesystem=filesystem)


def rebuildable(value: T) -> T:
    """`value` itself, computed by a task that carries it inline: a future Dask can rebuild.

    A scattered value has no lineage, and Dask's memory manager drops the spare replicas of a broadcast,
    so a lost worker can take its last copy; a task holding the value is simply run again. Used for what
    many blocks' tasks share (a level's large arrays, a model) and for the blocks' own inline data.
    """
    return value


def worker_homes(client: Client, futures: Sequence[Future]) -> list[str]:
    """Each future's worker now (the first by address of those holding it; "" if none): a placement hint."""
    held = client.who_has(list(futures)) if futures else {}
    return [min(held.get(f.key, ()), default="") for f in futures]


def per_worker_sums(client: Client, futures: Sequence[Future], homes: Sequence[str],
                    total: Callable, *args: Any) -> list[Future]:
    """The blocks' results summed where they are: one `total(*args, *results)` task per worker.

    `homes[i]`: where block i's result is (`worker_homes`; "" unknown, or all unknown when the lengths
    differ). Submitted with the blocks' tasks (no round trip between), each placed on its worker but free to
    run elsewhere, so a worker lost since is no error; a worker sends one sum rather than one result per
    block. The caller adds up the sums with the same `total`, which must give the same result in any
    grouping (integer sums).
    """
    groups: dict[str, list[Future]] = {}
    known = homes if len(homes) == len(futures) else [""] * len(futures)
    for home, future in zip(known, futures, strict=True):
        groups.setdefault(home, []).append(future)
    return [client.submit(total, *args, *group, pure=False, workers=[worker] if worker else None,
                          allow_other_workers=bool(worker))
            for worker, group in groups.items()]


def read_block(block: Block, columns: list[str]) -> pd.DataFrame:
    """The block's rows of `columns`, read from its Parquet file (its row group, sliced) or its database.

    A dataset file's partition columns among `columns` are its values, repeated, after the file's own.
    The frame is the block's Arrow table's `to_pandas()`, made batch by batch as the rows are decoded
    (`fedcore.data.batch_frame`), a local file read page by page rather than its row group buffered
    whole: a worker's peak about halves (docs/benchmarks.md). A file whose pandas metadata would change a
    dtype (a nullable integer column, say) is converted whole as pandas wrote it.
    """
    import pyarrow as pa

    if block.sql is not None:
        from fedcore.data.sql import read_range

        return read_range(block.sql, f"a Dask worker reading block {block.index}", columns)
    assert block.path is not None, "in-memory blocks are scattered or given inline, not read"
    from fedcore.data.batch_frame import frame_of_batches

    partition = [(name, value) for name, value in block.partition if name in columns]
    own = [c for c in columns if c not in dict(partition)]
    try:
        file = parquet_file(block.path, block.filesystem, streamed=_local(block.filesystem))
        schema = pa.schema([*(file.schema_arrow.field(c) for c in own),
                            *(pa.field(name, value.type) for name, value in partition)],
                           metadata=file.schema_arrow.metadata)
        batches = _block_batches(file, block, schema.remove_metadata(), partition)
        if _converts_as_arrow_types(schema):
            return frame_of_batches(pa.RecordBatchReader.from_batches(schema.remove_metadata(), batches),
                                    lambda rest: rest.read_all())
        return pa.Table.from_batches(list(batches), schema.remove_metadata()).replace_schema_metadata(
            schema.metadata).to_pandas()
    except (OSError, pa.ArrowException) as error:  # a file changed or gone since the agent opened it
        raise read_error(block.path, error) from error


BLOCK_BATCH_ROWS = 8_192
"""Rows of a Parquet block decoded at a time (`read_block`)."""


def _block_batches(file: pq.ParquetFile, block: Block, schema: pa.Schema,
                   partition: list[tuple[str, pa.Scalar]]) -> Iterator[pa.RecordBatch]:
    """The block's rows of its row group as record batches of `schema`: its file's columns, partitions."""
    import pyarrow as pa

    own = schema.names[:len(schema) - len(partition)]
    seen, stop = 0, block.group_start + block.n_rows
    for batch in file.iter_batches(BLOCK_BATCH_ROWS, row_groups=[block.row_group], columns=own,
                                   use_threads=False):
        first, last = max(block.group_start - seen, 0), min(stop - seen, batch.num_rows)
        seen += batch.num_rows
        if last > first:
            rows = batch.slice(first, last - first)
            yield pa.RecordBatch.from_arrays(
                [*rows.columns, *(pa.repeat(value, rows.num_rows) for _, value in partition)], schema=schema)
        if seen >= stop:
            return


def _converts_as_arrow_types(schema: pa.Schema) -> bool:
    """Whether `schema`'s pandas metadata (if any) leaves every dtype as its Arrow types alone give it."""
    import pyarrow as pa

    empty = pa.Table.from_batches([], schema)
    return bool(schema.metadata is None or list(empty.to_pandas().dtypes)
                == list(empty.replace_schema_metadata(None).to_pandas().dtypes))


def read_error(path: str | os.PathLike, error: Exception) -> DataReadError:
    """The one-line refusal of a Parquet file that cannot be read, naming it and the reader's reason."""
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return DataReadError(f"cannot read {str(path)!r}: {type(error).__name__}: {reason}")


def kept_rows(frame: pd.DataFrame, keep: np.ndarray) -> pd.DataFrame:
    """The rows of a block a packed bit mask marks (`np.packbits` of one bool per row), index reset."""
    mask = np.unpackbits(keep, count=len(frame)).astype(bool)
    return frame[mask].reset_index(drop=True)


def encode_block(frame: pd.DataFrame, schema: HorizontalSchema) -> tuple[np.ndarray, np.ndarray]:
    """(X, y) of a block's rows, encoded exactly as `PartyRows` encodes the whole table.

    X float64 in column (Fortran) order; y class codes (int64) or targets (float64). Encoding is per row,
    so the blocks' rows, stacked, are the whole table's.
    """
    X = np.asfortranarray(schema.encode(frame), dtype=np.float64)
    y = np.ascontiguousarray(schema.encode_labels(frame[schema.label]))
    return X, y


def load_block(block: Block, schema: HorizontalSchema) -> tuple[np.ndarray, np.ndarray]:
    """Read a Parquet block and encode it (`encode_block`): what a worker runs."""
    return encode_block(read_block(block, [*schema.names, schema.label]), schema)


def _local(filesystem: FileSystem | None) -> bool:
    """Whether a block's file is on the local disk (None, or a `file://` dataset's LocalFileSystem)."""
    from pyarrow.fs import LocalFileSystem

    return filesystem is None or isinstance(filesystem, LocalFileSystem)
