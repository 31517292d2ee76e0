"""An institution's table as its agent knows it on a Dask cluster: metadata only (issue #29).

Parquet files, a Parquet dataset folder or URL (`open_dataset`: its files as blocks that carry their Hive
partition values, issue #30) or a database table or query (`open_sql`: blocks of the ID column's order).

`open_parquet` reads the configured files' schemas and row-group sizes, never their rows: the blocks
(`fedcore.compute.blocks`, files in the order `fedcore.agents.data.read_files` concatenates them) and the
columns of the frame that concatenation would give. Workers read their own blocks (`read_table_block`)
with the whole table's pandas dtypes: an integer column that holds a null anywhere is float64 in the
whole table (a boolean one, object) though a block without nulls would read it as int64 (bool), so
`profile` fixes those casts from the null counts, and refuses infinities as `check_finite_columns` refuses
the whole table (same column, same count). The row groups' statistics usually settle both (null counts; no
float column's min or max infinite) without reading a row; else every block counts them on a worker.

The holdout mask (`holdout_masks`) is drawn here, from the session's generator over all rows in order, one
block-sized piece at a time, and sent to each block packed (one bit per row).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from fedcore.compute import DEFAULT_BLOCK_ROWS
from fedcore.compute.blocks import (
    Block,
    encode_block,
    kept_rows,
    parquet_blocks,
    parquet_file,
    read_block,
    read_error,
)
from fedcore.data.columns import DateEvidence, convert_dates, date_evidence, holds_dates
from fedcore.data.io import DatasetFile
from fedcore.data.numbers import infinite_counts, refuse_infinite
from fedcore.errors import DataReadError

if TYPE_CHECKING:
    from datetime import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq
    from distributed import Client, Future

    from fedcore.data.sql import SqlSource
    from fedcore.horizontal.schema import HorizontalSchema

NULL_DTYPES = {"int": "float64", "bool": "object"}
"""The pandas dtype an Arrow integer or boolean column reads as when it holds a null."""


@dataclass(frozen=True)
class ParquetTable:
    """One institution's Parquet files as blocks: what the agent holds instead of the rows."""

    what: str
    """Whose table, for errors ("institution 'north'")."""
    files: tuple[str, ...]
    blocks: tuple[Block, ...]
    columns: tuple[str, ...]
    """The columns of the frame `read_files` would give, in order."""
    nullable: Mapping[str, str] = field(default_factory=dict)
    """Columns pandas reads as numpy integers or booleans, "int" or "bool": a null anywhere in the table
    makes the whole column float64 or object."""
    casts: Mapping[str, str] = field(default_factory=dict)
    """Columns whose whole-table dtype is not what a null-free block reads (set by `profile`)."""
    dates: tuple[str, ...] = ()
    """Columns a block's reader converts to days since epoch (`fedcore.data.columns.convert_dates`), as the
    agent converts the whole table: set after validation, which checks the dates as read."""

    @property
    def n_rows(self) -> int:
        """Rows over all files (from the metadata)."""
        return sum(b.n_rows for b in self.blocks)


def is_parquet(files: Sequence[str]) -> bool:
    """Whether every file is Parquet (by suffix, as `fedcore.data.io.read_table` decides)."""
    return bool(files) and all(str(f).lower().endswith(".parquet") for f in files)


def open_parquet(files: Sequence[str], what: str, block_rows: int = DEFAULT_BLOCK_ROWS) -> ParquetTable:
    """The blocks and columns of `files` (sorted as the caller concatenates them), from their metadata.

    Refused unless every file has the first one's Arrow schema: the blocks are checked and encoded alike,
    whereas concatenating frames of different schemas would change dtypes under them.
    """
    local = [DatasetFile(str(f), None) for f in files]
    return _open_files(local, _same_schemas(local, what), what, block_rows)


def open_dataset(location: str, what: str, block_rows: int = DEFAULT_BLOCK_ROWS) -> ParquetTable:
    """A Parquet dataset folder or URL as blocks, from its listing and metadata (`read_dataset`'s rows).

    Its files in `read_dataset`'s order, each block also carrying the file's file system and Hive partition
    values, which the worker appends as the columns the in-process read gives (same values, same types).
    Refused, as `open_parquet` refuses, unless every file has the first one's schema.
    """
    from fedcore.data.io import dataset_files

    files, schema = dataset_files(location)
    _same_schemas(files, what)
    return _open_files(files, schema, what, block_rows)


def _same_schemas(files: Sequence[DatasetFile], what: str) -> pa.Schema:
    """The first file's Arrow schema, after refusing any file whose schema is another."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schemas = []
    for file in files:
        try:
            schemas.append(pq.read_schema(file.path, filesystem=file.filesystem))
        except (OSError, pa.ArrowException) as error:
            raise read_error(file.path, error) from error
    first = schemas[0]
    for file, schema in zip(files[1:], schemas[1:], strict=True):
        if not schema.remove_metadata().equals(first.remove_metadata()):
            raise DataReadError(f"{what}: on a Dask cluster every Parquet file must have the schema of "
                                f"{files[0].path!r}; {file.path!r} has another (columns or types): rewrite "
                                "it with the same columns and types, or remove compute: dask")
    return first


def _open_files(files: Sequence[DatasetFile], schema: pa.Schema, what: str, block_rows: int) -> ParquetTable:
    """The table of `files`' blocks whose frame has `schema`'s columns."""
    columns, nullable = _pandas_columns(schema)
    return ParquetTable(what, tuple(f.path for f in files), tuple(parquet_blocks(files, block_rows)),
                        columns, nullable)


def open_sql(source: SqlSource, what: str, key: str, block_rows: int = DEFAULT_BLOCK_ROWS,
             schema: pa.Schema | None = None, values: Mapping[str, datetime] | None = None) -> ParquetTable:
    """A database table or query as blocks of `block_rows` rows in `key`'s order (the ID column).

    The agent asks the server for the row count and one key per block (`fedcore.data.sql.key_blocks`);
    the workers read the rows. In process the same rows are read in the same order
    (`fedcore.agents.data.read_source`), so the party's rows are the same. `schema`: the rows' schema when
    the caller asked for it already (`fedcore.data.sql.sql_schema`); `values`: the query's placeholders (a
    scheduled batch's `:since`, `:until`), bound in the count, the cuts and every block's read.
    """
    from fedcore.data.sql import key_blocks

    cuts, schema = key_blocks(source, what, key, block_rows, values, schema)
    blocks, start = [], 0
    for index, cut in enumerate(cuts):
        blocks.append(Block(index, start, start + cut.n_rows, sql=cut))
        start += cut.n_rows
    columns, nullable = _pandas_columns(schema)
    return ParquetTable(what, (), tuple(blocks), columns, nullable)


def _pandas_columns(schema: pa.Schema) -> tuple[tuple[str, ...], dict[str, str]]:
    """The columns of the frame an Arrow table of `schema` becomes, and which read as numpy ints or bools."""
    empty = schema.empty_table().to_pandas()  # the dtypes pandas reads, a file's pandas metadata applied
    nullable = {}
    for name, dtype in empty.dtypes.items():  # numpy int and bool only (Int64 and boolean hold nulls)
        if isinstance(dtype, np.dtype) and dtype.kind in "iub":
            nullable[str(name)] = "bool" if dtype.kind == "b" else "int"
    return tuple(str(c) for c in empty.columns), nullable


# -- what the workers run ------------------------------------------------------------------------------
def read_table_block(block: Block, table: ParquetTable,
                     columns: Collection[str] | None = None) -> pd.DataFrame:
    """A block's rows (of `columns`, default all) with the whole table's dtypes and its dates as numbers."""
    names = [c for c in table.columns if columns is None or c in columns]
    frame = read_block(block, names)
    for name, dtype in table.casts.items():
        if name in frame.columns:
            frame[name] = frame[name].astype(dtype)  # type: ignore[call-overload]  # a dtype name
    return convert_dates(frame, dates=table.dates)[0] if table.dates else frame


def _profile_block(block: Block, table: ParquetTable, skip: Collection[str]) -> tuple[dict, dict]:
    """(nulls per integer or boolean column, infinities per numeric column) of one block."""
    frame = read_block(block, list(table.columns))
    nulls = {name: int(frame[name].isna().sum()) for name in table.nullable}
    return nulls, infinite_counts(frame, skip)


def _date_evidence(block: Block, table: ParquetTable, columns: list[str]) -> dict[str, DateEvidence]:
    """Each column's `date_evidence` in one block (read as the whole table's dtypes, dates not converted)."""
    frame = read_table_block(block, dataclasses.replace(table, dates=()), columns)
    return {c: date_evidence(frame[c]) for c in columns}


def guess_block_dates(client: Client, table: ParquetTable, keep: Collection[str | None]) -> tuple[str, ...]:
    """The columns (except `keep`) that hold dates over all blocks: `guess_date_columns` of the whole table.

    Each block reports its evidence on a worker; `holds_dates` combines it exactly, so a table without a
    contract converts the same columns on the workers as in process.
    """
    columns = [c for c in table.columns if c not in keep]
    if not columns or not table.blocks:
        return ()
    parts = client.gather(submit_blocks(client, _date_evidence, table, columns=columns))
    return tuple(c for c in columns if holds_dates([part[c] for part in parts]))


def held_rows(block: Block, table: ParquetTable, held: np.ndarray,
              columns: Collection[str] | None = None) -> pd.DataFrame:
    """A block's held-out rows (packed mask `held`), with the whole table's dtypes."""
    return kept_rows(read_table_block(block, table, columns), held)


def training_rows(block: Block, table: ParquetTable, keep: np.ndarray,
                  schema: HorizontalSchema) -> tuple[np.ndarray, np.ndarray]:
    """A block's training rows (packed mask `keep`), read as `held_rows` reads, encoded (`encode_block`)."""
    return encode_block(held_rows(block, table, keep, [*schema.names, schema.label]), schema)


def reader(table: ParquetTable) -> ParquetTable:
    """`table` without its block and file lists: what a task needs besides its own block (stays small)."""
    return dataclasses.replace(table, files=(), blocks=())


# -- the agent's side ----------------------------------------------------------------------------------
def submit_blocks(client: Client, func: Callable, table: ParquetTable, *per_block: Sequence,
                  **shared: object) -> list[Future]:
    """One task `func(block, table, *per-block args, **shared)` per block, in block order.

    The tasks get the table without its block and file lists (a block carries its own file), so each task
    stays small however many blocks there are.
    """
    small = reader(table)
    return [client.submit(func, block, small, *(args[i] for args in per_block), pure=False, **shared)
            for i, block in enumerate(table.blocks)]


def profile(client: Client, table: ParquetTable, skip: Collection[str | None] = ()) -> ParquetTable:
    """`table` with its whole-table casts, after refusing infinities as `check_finite_columns` would.

    From the row groups' statistics when they settle it (null counts of the integer and boolean columns,
    no float column's min or max infinite): no row is read. Else each block counts its nulls and
    infinities on a worker; the counts add up to the whole table's.
    """
    skipped = [c for c in skip if c is not None]
    known = _metadata_nulls(table, skipped)
    if known is not None:
        return dataclasses.replace(table, casts=_casts(table, known))
    nulls = dict.fromkeys(table.nullable, 0)
    infinite: dict[str, int] = {}
    counts = client.gather(submit_blocks(client, _profile_block, table, skip=skipped))
    for block_nulls, block_infinite in counts:
        for name, n in block_nulls.items():
            nulls[name] += n
        for name, n in block_infinite.items():
            infinite[name] = infinite.get(name, 0) + n
    refuse_infinite(infinite, table.what)
    return dataclasses.replace(table, casts=_casts(table, nulls))


def _casts(table: ParquetTable, nulls: Mapping[str, int]) -> dict[str, str]:
    """The columns whose whole-table dtype is the one pandas gives them with nulls."""
    return {name: NULL_DTYPES[kind] for name, kind in table.nullable.items() if nulls[name]}


def _metadata_nulls(table: ParquetTable, skip: Collection[str]) -> dict[str, int] | None:
    """Null counts of `table.nullable` from the row groups' statistics, or None unless they settle it.

    They settle it when every row group has null counts for those columns and min/max for every float
    column not in `skip`, none of them infinite (so no infinity anywhere; Parquet keeps NaN out of min/max).
    A dataset's partition columns are null in a file's rows when its value is.
    """
    if not table.files:  # a database's blocks: no statistics to read
        return None
    files: dict[str, Block] = {}  # each file's first block (a file without rows has none)
    for block in table.blocks:
        if block.path is not None:
            files.setdefault(block.path, block)
    partitioned = {name for b in files.values() for name, _ in b.partition}
    floats = [c for c in table.columns if c not in skip and c not in table.nullable and c not in partitioned]
    nulls = dict.fromkeys(table.nullable, 0)
    for path, block in files.items():
        meta = parquet_file(path, block.filesystem).metadata
        for name, value in block.partition:  # Hive discovers integers and strings: no infinity
            if name in nulls and not value.is_valid:
                nulls[name] += meta.num_rows
        for group in range(meta.num_row_groups):
            counts = _group_nulls(meta.row_group(group), nulls.keys() - partitioned, floats)
            if counts is None:
                return None
            for name, n in counts.items():
                nulls[name] += n
    return nulls


def _group_nulls(group: pq.RowGroupMetaData, columns: Collection[str],
                 floats: Collection[str]) -> dict[str, int] | None:
    """Null counts of `columns` in one row group, or None unless its statistics settle them and `floats`."""
    chunks = {group.column(j).path_in_schema: group.column(j) for j in range(group.num_columns)}
    nulls = {}
    for name in columns:
        stats = chunks[name].statistics if name in chunks else None
        if stats is None or not stats.has_null_count:
            return None
        nulls[name] = stats.null_count
    for name in floats:
        chunk = chunks.get(name)
        if chunk is None:
            return None
        if chunk.physical_type not in ("FLOAT", "DOUBLE"):
            continue
        stats = chunk.statistics
        if stats is None or not stats.has_min_max or np.isinf(stats.min) or np.isinf(stats.max):
            return None
    return nulls


def holdout_masks(rng: np.random.Generator, blocks: Sequence[Block], fraction: float) -> list[np.ndarray]:
    """Each block's held-out rows, packed: `rng.random(n) < fraction` over all rows, drawn block by block.

    The generator's stream is the same drawn at once or in pieces, so these are the in-process agent's rows.
    """
    return [np.packbits(rng.random(b.n_rows) < fraction) for b in blocks]


def count_bits(masks: Sequence[np.ndarray], blocks: Sequence[Block]) -> int:
    """How many rows the packed masks mark."""
    return sum(int(np.unpackbits(m, count=b.n_rows).sum()) for m, b in zip(masks, blocks, strict=True))


def invert_masks(masks: Sequence[np.ndarray], blocks: Sequence[Block]) -> list[np.ndarray]:
    """The rows the packed masks do not mark (a block's training rows from its held-out ones), packed."""
    return [np.packbits(~np.unpackbits(m, count=b.n_rows).astype(bool)) for m, b in zip(masks, blocks,
                                                                                          strict=True)]
