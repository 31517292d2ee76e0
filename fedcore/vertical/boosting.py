"""The label holder's boosting rounds: its margins, each round's (g, h), and where its rows ended.

Per round the label holder adds the last round's leaf weights to its rows' margins, turns (y, margin) into
(g, h) with its loss (`fedcore.trees.losses`), rounds them to the round's power-of-two grid
(`fedcore.trees.fixed_gradients`: every sum of them is then exact, so plain and encrypted modes sum the same
numbers) and sends them to the passive parties in place of labels: as they are in plain mode, encrypted and
packed otherwise (`fedcore.vertical.encrypted`). While the round's trees grow it learns each row's leaf as
the forest's label holder does, by the partition bitmaps: every open node's rows get that node's leaf
weight, level after level, so a row keeps its deepest node's, its leaf's. The weights are the ones the
master records (`BoostingParams.node_values`, from the same statistics). Its rows record them where they
are (`record_leaves`: in process, or per block on a Dask cluster) and give them back at the next round.
"""

from __future__ import annotations

from collections.abc import Callable

import numba as nb
import numpy as np

from fedcore.randomness import stream
from fedcore.trees.criteria import GRADIENT, leaf_value
from fedcore.trees.fixed_gradients import GradientGrid, precision_bits
from fedcore.trees.losses import Loss, base_score, gradients
from fedcore.trees.partition import SamplePartition


class BoostingLabels:
    """One label holder's boosting state over its n_rows aligned rows."""

    def __init__(self, y: np.ndarray, loss: Loss, n_classes: int, reg_lambda: float, learning_rate: float,
                 subsample: float, seed: int) -> None:
        """Labels `y` (values or class codes) under `loss`; the rest as `BoostingParams` names them."""
        self.y = np.asarray(y, dtype=np.float64)
        precision_bits(len(self.y))  # refuses a row count whose sums could not be exact
        self.loss = loss
        self.n_outputs = loss.n_outputs(n_classes)
        self.reg_lambda, self.learning_rate = reg_lambda, learning_rate
        self.subsample, self.seed = subsample, seed
        self.base_score = base_score(loss, self.y, n_classes)
        self.margins = np.tile(self.base_score, (len(self.y), 1))
        self.round = 0
        self.grid: GradientGrid | None = None  # this round's grid and its integers (n_outputs, n_rows, 2)
        self.integers = np.zeros((0, 0, 2), np.int64)

    def begin_round(self, trees: list[int], leaves: Callable[[], np.ndarray]) -> np.ndarray | str:
        """The round of `trees`: its (g, h), (n_outputs, n_rows, 2); or why they are not the next round.

        Rounds come in order, one tree per output (the master's batches); the last round's leaf weights
        (`leaves()`: (n_outputs, n_rows), what the rows recorded) join the margins first. Rows subsample
        leaves out get (0, 0): they stay in every node but weigh nothing. The values are on the round's grid
        (`self.grid`, integers `self.integers`).
        """
        first = self.round * self.n_outputs
        if trees != list(range(first, first + self.n_outputs)):
            return (f"boosting round {self.round} grows trees {first}..{first + self.n_outputs - 1}, "
                    f"asked for {trees[:3]}{'...' if len(trees) > 3 else ''}")
        if self.round:
            self.margins += leaves().T
        gh = gradients(self.loss, self.y, self.margins)
        if self.subsample < 1.0:
            kept = stream(self.seed, "subsample", self.round).random(len(self.y)) < self.subsample
            gh[:, ~kept, :] = 0.0
        self.grid, self.integers = GradientGrid.of(gh, len(self.y))
        gh = self.grid.values(self.integers)
        self.round += 1
        return gh

    def node_weights(self, stats: np.ndarray) -> np.ndarray:
        """The open nodes' leaf weights from their (count, G, H) statistics (what the rows record)."""
        return leaf_value(stats, GRADIENT, self.reg_lambda, self.learning_rate)[:, 0]


def record_leaves(leaves: np.ndarray, part: SamplePartition, values: np.ndarray) -> None:
    """Each open node's rows get its value in `leaves` (trees, rows): all rows' partition, or a block's.

    A boosting round's partition holds every row once per tree, tree k's at positions k rows .. (k + 1) rows.
    """
    _fill_segments(leaves, leaves.shape[1], part.order, np.asarray(part.starts, np.int64),
                   np.asarray(part.ends, np.int64), np.asarray(values, np.float64))


@nb.njit(cache=True, nogil=True)
def _fill_segments(pending, n_rows, order, starts, ends, values):
    """Each node's rows (its segment of `order`; segment position // n_rows: the tree slot) get its value."""
    for i in range(starts.shape[0]):
        for p in range(starts[i], ends[i]):
            pending[p // n_rows, order[p]] = values[i]
