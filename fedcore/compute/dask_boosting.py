"""A horizontal boosting party's rows on a Dask cluster: `DaskBoostingRows`, `BoostingRows` per block.

`DaskPartyRows` (the blocks, their partitions, the per-level tasks) plus boosting's per-row state, as
futures per block: the block's bin codes (made once from its rows), and each round's (margins, fixed-point
(g, h)), made on the worker from the round before's state, the block's rows and labels, and the round's
base score or the round before's trees (once per round, a future of its own every block's task takes:
`DaskPartyRows._once`). Lineage: a lost worker's states are rebuilt by replaying the rounds from the base
score (each round's trees from the task that holds them). The functions the workers run are the in-process
party's (`fedcore.horizontal.boosting.rows`); a block's histograms are int64, summed on each worker over its
blocks and then here (the base score's few integers per block here), so the replies are the in-process
party's bytes whatever the workers and the order the blocks' tasks run in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedcore.compute.blocks import per_worker_sums, worker_homes
from fedcore.compute.dask_rows import DaskPartyRows
from fedcore.horizontal.boosting.bins import AgreedBins
from fedcore.horizontal.boosting.fixedpoint import abs_totals
from fedcore.horizontal.boosting.rows import label_sums, partition_histograms, round_gradients, round_margins
from fedcore.horizontal.model import HorizontalForest
from fedcore.horizontal.rows import RowPartition
from fedcore.trees.losses import LOSSES, Loss

if TYPE_CHECKING:
    from distributed import Future

Data = tuple[np.ndarray, np.ndarray]
State = tuple[np.ndarray, np.ndarray]


# -- what the workers run (module functions: pickled by reference). The loss travels by its link and is
# looked up there: the losses are compared by identity.
def _codes(data: Data, bins: AgreedBins) -> np.ndarray:
    return bins.codes(data[0])


def _label_sums(data: Data, link: str, n_classes: int) -> tuple[np.ndarray, np.ndarray | None]:
    return label_sums(LOSSES[link], data[1], n_classes)


def _round(state: State | None, data: Data, link: str, base: np.ndarray | None,
           trees: HorizontalForest | None) -> State:
    """The block's (margins, (g, h)) of a round, from the round before's (a new array: inputs stay)."""
    margins = round_margins(None if state is None else state[0], data[0], base, trees)
    return margins, round_gradients(LOSSES[link], data[1], margins)


def _restored(margins: np.ndarray) -> State:
    """A checkpoint's margins of the block (no (g, h) until the next round)."""
    return margins, np.zeros((margins.shape[1], 0, 2), np.int64)


def _abs_totals(state: State) -> np.ndarray:
    return abs_totals(state[1])


def _margins(state: State) -> np.ndarray:
    return state[0]


def _histograms(part: RowPartition, codes: np.ndarray, state: State, compute: np.ndarray,
                width: int) -> np.ndarray:
    return partition_histograms(part, compute, codes, state[1], width)


def _total(*arrays: np.ndarray) -> np.ndarray:
    """The sum of a worker's blocks' integer arrays (any order: the sum is exact)."""
    out = np.array(arrays[0], dtype=np.int64)
    for a in arrays[1:]:
        out += a
    return out


class DaskBoostingRows(DaskPartyRows):
    """`BoostingRows`' interface on a Dask cluster (see the module doc)."""

    bins: AgreedBins
    codes: list[Future]
    states: list[Future] | None
    homes: list[str]
    """Each block's worker at the round's start (its histograms are summed there; "" if unknown)."""

    @classmethod
    def of(cls, rows: DaskPartyRows, bins: AgreedBins) -> DaskBoostingRows:
        """The party's blocks (as the agent or an estimator put them on the cluster), cut into `bins`."""
        new = cls.__new__(cls)
        new.__dict__.update(rows.__dict__)
        new.bins = bins
        new.codes = new._map(_codes, new.data, bins=bins)
        new.states = None
        new.homes = []
        return new

    def close(self) -> None:
        """Release every future of this party, its codes and margins too."""
        super().close()
        self.codes, self.states = [], None

    def __getstate__(self) -> dict:
        """Pickled without the cluster (`DaskPartyRows.__getstate__`), nor its codes and margins."""
        state = super().__getstate__()
        state.update(codes=[], states=None)
        return state

    def label_sums(self, loss: Loss) -> tuple[np.ndarray, np.ndarray | None]:
        """The base score's sums and the label's |q| totals, over the blocks (integers: exact)."""
        results = self._gather(self._map(_label_sums, self.data, link=loss.link,
                                         n_classes=int(self.schema.n_classes)))
        sums = _total(*(r[0] for r in results))
        totals = None if results[0][1] is None else sum((r[1] for r in results[1:]), results[0][1])
        return sums, totals

    def start_round(self, loss: Loss, base: np.ndarray | None, trees: HorizontalForest | None) -> np.ndarray:
        """Each block's state of the round, on its worker; the |q| totals of the party's (g, h)."""
        previous = self.states if self.states is not None else [None] * len(self.blocks)
        shared = None if trees is None else self._once(trees)  # once per round, not pickled per block
        self.states = self._map(_round, previous, self.data, link=loss.link, base=base, trees=shared)
        results = self._gather(self._map(_abs_totals, self.states))
        self.homes = worker_homes(self.client, self.states)  # where the levels' block tasks will run
        return sum(results[1:], results[0])

    def histograms(self, compute: np.ndarray) -> np.ndarray:
        """The open nodes' histograms: one task per block, summed on each worker, then here."""
        assert self.states is not None, "a round starts before its levels"
        blocks = self._map(_histograms, self.parts, self.codes, self.states, compute=compute,
                           width=self.bins.width)
        return _total(*self._gather(per_worker_sums(self.client, blocks, self.homes, _total)))

    def get_margins(self) -> np.ndarray:
        """Every row's margins, gathered from the blocks in block order (a checkpoint's)."""
        if self.states is None:
            return np.zeros((self.n_rows, 1))
        return np.concatenate(self._gather(self._map(_margins, self.states)))

    def set_margins(self, margins: np.ndarray) -> None:
        """A checkpoint's margins, each block's slice inside its task (the lineage holds it)."""
        margins = np.asarray(margins, dtype=np.float64)
        self.states = self._map(_restored, [margins[b.start:b.stop] for b in self.blocks])
