"""An institution's data contract checked block by block on its Dask workers (issue #29).

Each block is read and validated where it runs (`validate_frame`, no example values) and the blocks'
reports merge into the whole table's (`fedcore.contracts.merge`). The one expectation that is not
row-wise, the ID column's uniqueness, is counted exactly over the whole column without gathering it:
each block splits its IDs into `n_buckets` by a hash of the value, each bucket's IDs from every block meet
in one task, which counts the rows whose value occurs more than once (as GX does: nulls ignored, every
copy of a repeated value counted).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from fedcore.compute.blocks import Block
from fedcore.compute.dask_table import ParquetTable, read_table_block, submit_blocks
from fedcore.contracts.expectations import ValidationReport, validate_frame
from fedcore.contracts.merge import merge_reports
from fedcore.contracts.model import DataContract

if TYPE_CHECKING:
    from distributed import Client

MAX_BUCKETS = 32
"""At most this many tasks count duplicated IDs (each holds about 1/n_buckets of the ID column)."""
_GX = threading.Lock()  # GX contexts are not thread-safe; threaded workers validate one block at a time


def _validate_block(block: Block, table: ParquetTable, contract: DataContract, institution: str,
                    include_label: bool) -> ValidationReport:
    frame = read_table_block(block, table)
    with _GX:
        return validate_frame(frame, contract, institution, include_label=include_label, max_examples=0)


def _id_buckets(block: Block, table: ParquetTable, column: str, n_buckets: int) -> list[pd.Series]:
    """The block's non-null IDs, split by a hash of the value into `n_buckets` (same value, same bucket)."""
    ids = read_table_block(block, table, [column])[column].dropna()
    bucket = pd.util.hash_pandas_object(ids, index=False).to_numpy() % np.uint64(n_buckets)
    return [ids[bucket == b].reset_index(drop=True) for b in range(n_buckets)]


def _pick(buckets: list[pd.Series], b: int) -> pd.Series:
    return buckets[b]


def _duplicated(*parts: pd.Series) -> int:
    """Rows whose value occurs more than once among `parts` (every copy counted)."""
    ids = pd.concat(parts, ignore_index=True)
    return int(ids.duplicated(keep=False).sum())


def duplicated_ids(client: Client, table: ParquetTable, column: str) -> int:
    """Rows of `column` whose non-null value occurs more than once in the whole table (see the module doc)."""
    n_buckets = max(1, min(MAX_BUCKETS, len(table.blocks)))
    split = submit_blocks(client, _id_buckets, table, column=column, n_buckets=n_buckets)
    counts = [client.submit(_duplicated, *(client.submit(_pick, s, b, pure=False) for s in split), pure=False)
              for b in range(n_buckets)]
    return sum(client.gather(counts))


def validate_blocks(client: Client, table: ParquetTable, contract: DataContract, institution: str,
                    include_label: bool = True) -> ValidationReport:
    """The whole table's validation report, each block validated on a worker (see the module doc)."""
    if not table.blocks:  # no rows: the columns alone, validated here
        import pyarrow.parquet as pq

        empty = pq.read_schema(table.files[0]).empty_table().to_pandas()
        return validate_frame(empty, contract, institution, include_label=include_label, max_examples=0)
    parts = client.gather(submit_blocks(client, _validate_block, table, contract=contract,
                                        institution=institution, include_label=include_label))
    duplicates = (duplicated_ids(client, table, contract.id_column) if contract.id_column in table.columns
                  else None)
    return merge_reports(parts, contract, table.n_rows, duplicates)
