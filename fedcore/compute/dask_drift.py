"""Drift on the institution's Dask workers (`fedcore.drift`): a training snapshot, and a batch's scores.

Each worker summarises (the training snapshot's bins: its sampled values, its categories) and counts its
block's rows per snapshot bin; the counts are integers, summed in block order, and the sample is drawn by
row position, so the snapshot and the scores are the in-process agent's exactly, however the rows are cut
into blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from fedcore.drift import (
    batch_counts,
    block_summary,
    scores_from_counts,
    snapshot_bins,
    summed_counts,
    with_counts,
)

if TYPE_CHECKING:
    from distributed import Client, Future

    from fedcore.horizontal.schema import HorizontalSchema


def block_scores(client: Client, frames: Sequence[Future], rows: int, snapshot: dict[str, Any]
                 ) -> dict[str, float]:
    """Each snapshot feature's PSI over the batch whose `rows` rows are the blocks `frames`."""
    return scores_from_counts(snapshot, _summed_counts(client, frames, snapshot), rows)


def block_snapshot(client: Client, frames: Sequence[Future], sizes: Sequence[int],
                   columns: Sequence[str]) -> dict[str, Any]:
    """The training snapshot of the `columns` of the rows in blocks `frames` (of `sizes` rows), in order."""
    rows, starts = int(sum(sizes)), np.cumsum([0, *sizes[:-1]]).tolist()
    picked = [client.submit(_columns, frame, list(columns), pure=False) for frame in frames]
    summaries = client.gather([client.submit(block_summary, frame, int(start), rows, pure=False)
                               for frame, start in zip(picked, starts, strict=True)])
    bins = snapshot_bins(summaries, rows)
    return with_counts(bins, _summed_counts(client, picked, bins))


def encoded_snapshot(client: Client, data: Sequence[Future], sizes: Sequence[int],
                     schema: HorizontalSchema) -> dict[str, Any]:
    """`block_snapshot` of a horizontal party's encoded blocks ((X, y) futures): its features decoded."""
    frames = [client.submit(decoded_frame, block, schema, pure=False) for block in data]
    return block_snapshot(client, frames, sizes, schema.names)


def decoded_frame(block: tuple[np.ndarray, np.ndarray], schema: HorizontalSchema) -> pd.DataFrame:
    """A horizontal block's features as its snapshot sees them (`HorizontalSchema.decode`)."""
    return schema.decode(block[0])


def _columns(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    return frame[columns]


def _summed_counts(client: Client, frames: Sequence[Future], snapshot: dict[str, Any]
                   ) -> dict[str, np.ndarray]:
    """Each snapshot feature's rows per bin over the blocks `frames` (counted on the workers)."""
    return summed_counts(client.gather([client.submit(batch_counts, snapshot, frame, pure=False)
                                        for frame in frames]), snapshot)
