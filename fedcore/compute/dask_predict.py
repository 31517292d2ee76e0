"""A horizontal model applied to an institution's Parquet blocks on its Dask workers (issue #29).

Evaluation: each block's held-out rows (its packed holdout mask) are read and predicted where the block
is, and only their statistics come back (`fedcore.agents.scoring.holdout_statistics`: integer confusion
counts or exact regression parts), merged by the agent into the whole held-out set's.

Batch prediction: each block of the new rows is read, predicted and written by its worker as one part
file of a Parquet dataset folder (`fedcore.agents.storage.part_file`, named by block index, so the parts
in name order are the rows in order); the agent names the folder and renames it into place once every
part is written, or delivers the parts into the institution's sink, streamed, and removes the folder
(`fedcore.agents.storage.place_parts`). The workers must see the predictions folder at the agent's path
(a shared mount).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedcore.agents.scoring import Statistics, holdout_statistics, merge_statistics, prediction_frame
from fedcore.agents.storage import part_file, write_parquet
from fedcore.compute.blocks import Block, rebuildable
from fedcore.compute.dask_table import ParquetTable, held_rows, read_table_block, submit_blocks
from fedcore.drift import batch_counts, scores_from_counts, summed_counts
from fedcore.horizontal.model import HorizontalForest
from fedcore.horizontal.schema import HorizontalSchema

if TYPE_CHECKING:
    from distributed import Client


def _evaluate_block(block: Block, table: ParquetTable, held: np.ndarray, model: HorizontalForest,
                    schema: HorizontalSchema, threshold: float | None = None) -> Statistics:
    return holdout_statistics(model, schema, held_rows(block, table, held, [*schema.names, schema.label]),
                              threshold)


def _predict_block(block: Block, table: ParquetTable, model: HorizontalForest, schema: HorizontalSchema,
                   id_column: str, folder: str, threshold: float | None = None,
                   snapshot: dict | None = None) -> tuple[int, dict[str, np.ndarray] | None]:
    batch = read_table_block(block, table, [id_column, *schema.names])
    write_parquet(part_file(Path(folder), block.index), prediction_frame(model, schema, batch, id_column,
                                                                         threshold))
    return len(batch), None if snapshot is None else batch_counts(snapshot, batch[schema.names])


def evaluate_blocks(client: Client, table: ParquetTable, held: Sequence[np.ndarray], model: HorizontalForest,
                    schema: HorizontalSchema, threshold: float | None = None) -> Statistics:
    """The held-out set's statistics, each block's computed on its worker (see the module doc)."""
    shared = client.submit(rebuildable, model, pure=False)  # rebuilt if its worker is lost
    return merge_statistics(client.gather(submit_blocks(client, _evaluate_block, table, held, model=shared,
                                                        schema=schema, threshold=threshold)))


def predict_blocks(client: Client, table: ParquetTable, model: HorizontalForest, schema: HorizontalSchema,
                   id_column: str, folder: Path, threshold: float | None = None,
                   snapshot: dict | None = None) -> tuple[int, dict[str, float] | None]:
    """Write every block's predictions into `folder` (one part each): the row count, and the drift scores.

    The batch's drift scores against `snapshot` (None: not checked) are counted per block where it is read
    (`fedcore.drift`).
    """
    shared = client.submit(rebuildable, model, pure=False)  # rebuilt if its worker is lost
    parts = client.gather(submit_blocks(client, _predict_block, table, model=shared, schema=schema,
                                        id_column=id_column, folder=str(folder), threshold=threshold,
                                        snapshot=snapshot))
    rows = sum(n for n, _ in parts)
    if snapshot is None:
        return rows, None
    return rows, scores_from_counts(snapshot, summed_counts([c for _, c in parts], snapshot), rows)
