"""A batch's drift scores from its blocks on the institution's Dask workers (`fedcore.drift`).

Each worker counts its block's rows per snapshot bin; the counts are integers, summed in block order, so the
scores are the in-process agent's exactly, however the rows are cut into blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fedcore.drift import batch_counts, scores_from_counts

if TYPE_CHECKING:
    from distributed import Client, Future


def block_scores(client: Client, frames: Sequence[Future], rows: int, snapshot: dict[str, Any]
                 ) -> dict[str, float]:
    """Each snapshot feature's PSI over the batch whose `rows` rows are the blocks `frames`."""
    parts = client.gather([client.submit(batch_counts, snapshot, frame, pure=False) for frame in frames])
    total: dict[str, np.ndarray] = {}
    for name, feature in snapshot["features"].items():
        total[name] = np.zeros(len(feature["counts"]), np.int64)  # its bins, then missing values
        for part in parts:  # in block order; integers: exact in any order
            total[name] += part[name]
    return scores_from_counts(snapshot, total, rows)
