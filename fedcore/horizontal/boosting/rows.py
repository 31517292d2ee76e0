"""A boosting party's per-row state, for all its rows or one Dask block of them, and its in-process rows.

Each row's margins, its round's fixed-point (g, h) and its bin codes depend on that row alone; the per node,
feature and bin histograms and the base score's sums are integer sums. So the functions here, run on the
whole table (`BoostingRows`, in process) or on each block of it (`fedcore.compute.dask_boosting`, on the
workers), give the same bytes, and the block results summed in any order are the table's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedcore.horizontal.boosting.bins import AgreedBins
from fedcore.horizontal.boosting.fixedpoint import abs_totals, quantise
from fedcore.horizontal.boosting.histograms import node_histograms
from fedcore.horizontal.model import HorizontalForest
from fedcore.horizontal.rows import PartyRows, RowPartition
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.trees.losses import SQUARED_ERROR_LOSS, Loss, gradients


def label_sums(loss: Loss, y: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The base score's statistics of these rows: class counts, or (rows, fixed-point label sum).

    With the label's |q| totals (`fixedpoint.abs_totals`) for the ring's range check (squared error only).
    """
    if loss is SQUARED_ERROR_LOSS:
        q = quantise(np.asarray(y, np.float64)[:, None])
        return np.array([len(q), int(q.sum())], dtype=np.int64), abs_totals(q[None])
    return np.bincount(np.asarray(y, np.int64), minlength=max(n_classes, 2)).astype(np.int64), None


def round_margins(margins: np.ndarray | None, X: np.ndarray, base: np.ndarray | None,
                  trees: HorizontalForest | None) -> np.ndarray:
    """A round's margins: the base score (round 0), or a copy of `margins` plus the round before's trees.

    Each tree's leaf weights are added in the model's order (`fedcore.trees.combination`).
    """
    if base is not None:
        return np.tile(np.asarray(base, np.float64), (len(X), 1))
    assert margins is not None and trees is not None, "a later round adds the round before's trees"
    out = np.array(margins, dtype=np.float64)
    leaves = trees.apply(X)
    for t in range(trees.n_trees):
        out[:, t] += trees.value[leaves[:, t], 0]
    return out


def round_gradients(loss: Loss, y: np.ndarray, margins: np.ndarray) -> np.ndarray:
    """The round's (g, h) per output and row in fixed point, (K, n_rows, 2) int64."""
    return quantise(gradients(loss, y, margins))


def partition_histograms(part: RowPartition, compute: np.ndarray, codes: np.ndarray, qgh: np.ndarray,
                         width: int) -> np.ndarray:
    """The (count, g, h) histograms of the open nodes `compute` flags, (A', F, width, 3) int64."""
    return node_histograms(part.order, part.starts[compute], part.ends[compute], part.node_slot[compute],
                           codes, qgh, width)


class BoostingRows(PartyRows):
    """An in-process party's rows with boosting's per-row state: bin codes, margins, this round's (g, h)."""

    def __init__(self, name: str, frame: pd.DataFrame, schema: HorizontalSchema, bins: AgreedBins) -> None:
        """Encode `frame` and cut it into the agreed bins; margins of one output, zero, until round 0."""
        super().__init__(name, frame, schema)
        self.bins = bins
        self.codes = bins.codes(self.X)
        self.margins = np.zeros((self.n_rows, 1))
        self.qgh = np.zeros((1, self.n_rows, 2), np.int64)

    def label_sums(self, loss: Loss) -> tuple[np.ndarray, np.ndarray | None]:
        """`label_sums` of every row."""
        return label_sums(loss, self.y, int(self.schema.n_classes))

    def start_round(self, loss: Loss, base: np.ndarray | None, trees: HorizontalForest | None) -> np.ndarray:
        """The round's margins and fixed-point (g, h); returns their |q| totals for the range check."""
        self.margins = round_margins(self.margins, self.X, base, trees)
        self.qgh = round_gradients(loss, self.y, self.margins)
        return abs_totals(self.qgh)

    def histograms(self, compute: np.ndarray) -> np.ndarray:
        """The histograms of the open nodes `compute` flags."""
        return partition_histograms(self.partition, compute, self.codes, self.qgh, self.bins.width)

    def get_margins(self) -> np.ndarray:
        """Every row's margins (a checkpoint's), a copy."""
        return self.margins.copy()

    def set_margins(self, margins: np.ndarray) -> None:
        """Resume from a checkpoint's margins (the next round adds the round before's trees to them)."""
        self.margins = np.array(margins, dtype=np.float64)
