"""A vertical party's rows to predict in blocks on its Dask workers (issue #29).

The batch's aligned rows (`fedcore.compute.dask_alignment.align_blocks`, in the master's order) are encoded
where they are (`encode_columns` for the party's model), and each per-party prediction step runs per block
on the same functions as in process (`fedcore.vertical.prediction_rows`):

* `predict_leaves` for rows [start, stop): each block it overlaps computes its rows' split sets; the agent
  joins them in row order (`join_row_sets`: side by side when the blocks cut at multiples of 64 rows,
  else unpacked to bits and packed again), which is the in-process answer bit for bit (the sets are per
  row);
* `route`: the asked rows are grouped by block, each block answers its own, and the agent puts the bits
  back in the asked order.

Only these answers (what the protocol sends) and, at delivery, the aligned IDs come to the agent. Every
future is made by a task (the model and its threshold index too), so a lost worker's blocks are rebuilt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from fedcore.compute.blocks import rebuildable
from fedcore.trees.predictor import ThresholdIndex, encode_columns
from fedcore.trees.structure import PartialForest
from fedcore.vertical.prediction_rows import route_bits, split_sets, threshold_index

if TYPE_CHECKING:
    from distributed import Client, Future


def _encode(frame: pd.DataFrame, model: PartialForest) -> np.ndarray:
    return encode_columns(frame, model.column_names, model.column_categories)


def _split_sets(X: np.ndarray, start: int, stop: int, model: PartialForest,
                index: ThresholdIndex) -> np.ndarray:
    return split_sets(model, index, X[start:stop])


def _route(X: np.ndarray, rows: np.ndarray, nodes: np.ndarray, model: PartialForest) -> np.ndarray:
    return route_bits(model, X, rows, nodes)


def _bits(words: np.ndarray, count: int) -> np.ndarray:
    """Packed row sets (uint64 words, row i at bit i % 64 of word i // 64) as a 0/1 uint8 matrix."""
    return np.unpackbits(words.astype("<u8", copy=False).view(np.uint8), axis=1, count=count,
                         bitorder="little")


def _words(bits: np.ndarray) -> np.ndarray:
    """Inverse of `_bits`: (rows, n) 0/1 as (rows, ceil(n / 64)) uint64 words."""
    packed = np.packbits(bits, axis=1, bitorder="little")
    out = np.zeros((bits.shape[0], -(-bits.shape[1] // 64) * 8), np.uint8)
    out[:, :packed.shape[1]] = packed
    return out.view("<u8").astype(np.uint64)


def join_row_sets(parts: Sequence[np.ndarray], counts: Sequence[int], n_sets: int) -> np.ndarray:
    """The `n_sets` row sets of consecutive row ranges (`counts[i]` rows each) as the sets of all their rows.

    Ranges that start at multiples of 64 rows are whole words: their words are put side by side. Else
    the words are unpacked to bits, joined and packed again (8 times the message's size, for a moment).
    """
    if all(n % 64 == 0 for n in counts[:-1]):
        return np.concatenate([np.zeros((n_sets, 0), np.uint64), *parts], axis=1)
    bits = [_bits(words, n) for words, n in zip(parts, counts, strict=True)]
    return _words(np.concatenate([np.zeros((n_sets, 0), np.uint8), *bits], axis=1))


class DaskPredictionRows:
    """The rows to predict as encoded blocks on the workers; a drop-in for `LocalPredictionRows`."""

    def __init__(self, client: Client, frames: Sequence[Future], sizes: Sequence[int],
                 model: PartialForest) -> None:
        """Block i: the aligned rows of future `frames[i]` (`sizes[i]` rows), encoded on its worker."""
        self.client, self.model = client, model
        self._model = client.submit(rebuildable, model, pure=False)
        self._index = client.submit(rebuildable, threshold_index(model), pure=False)
        self.blocks = [client.submit(_encode, f, self._model, pure=False) for f in frames]
        self.starts = np.cumsum([0, *sizes]).astype(np.int64)

    @property
    def n_rows(self) -> int:
        """Rows to predict."""
        return int(self.starts[-1])

    def split_sets(self, start: int, stop: int) -> np.ndarray:
        """`split_sets` of rows [start, stop), each overlapped block's computed where it is."""
        parts, counts = [], []
        for b, future in enumerate(self.blocks):
            lo, hi = max(start, self.starts[b]), min(stop, self.starts[b + 1])
            if lo < hi:
                parts.append(self.client.submit(_split_sets, future, int(lo - self.starts[b]),
                                                int(hi - self.starts[b]), self._model, self._index,
                                                pure=False))
                counts.append(int(hi - lo))
        return join_row_sets(self.client.gather(parts), counts, int(np.sum(self.model.feature >= 0)))

    def route(self, rows: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """`route_bits` of the asked rows, each block answering for its own."""
        block = np.searchsorted(self.starts, rows, side="right") - 1
        order = np.argsort(block, kind="stable")
        edges = np.concatenate([[0], np.cumsum(np.bincount(block, minlength=len(self.blocks)))])
        asked = [order[edges[b]:edges[b + 1]] for b in range(len(self.blocks))]
        futures = {b: self.client.submit(_route, self.blocks[b], rows[i] - self.starts[b], nodes[i],
                                         self._model, pure=False)
                   for b, i in enumerate(asked) if len(i)}
        out = np.zeros(len(rows), np.uint8)
        for b, bits in zip(futures, self.client.gather(list(futures.values())), strict=True):
            out[asked[b]] = bits
        return out

    def close(self) -> None:
        """The blocks leave the workers."""
        self.blocks = []
