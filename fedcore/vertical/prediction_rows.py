"""A vertical party's rows to predict and its two per-party prediction steps on them.

`split_sets` (one-round prediction: per node this party owns, the rows its own splits send there and left) and
`route_bits` (node by node: which way this party's nodes send the asked rows) are row-wise, so a party
whose rows sit in blocks on its Dask workers (`fedcore.compute.dask_vertical_predict`) runs the same two
functions per block and concatenates the answers in row order: the in-process answer, bit for bit.
"""

from __future__ import annotations

import numpy as np

from fedcore.trees.predictor import ThresholdIndex, own_split_sets, route_step
from fedcore.trees.structure import PartialForest


def threshold_index(model: PartialForest) -> ThresholdIndex:
    """The index of the thresholds of the numeric nodes `model` owns (built once per prediction data)."""
    return ThresholdIndex(model.feature, model.threshold, model.is_categorical, len(model.column_names))


def split_sets(model: PartialForest, index: ThresholdIndex, X: np.ndarray) -> np.ndarray:
    """Packed row sets ((n_owned, ceil(rows/64)) uint64), one per node `model` owns, in node order.

    Each holds the rows its own splits send to the node and left there (`own_split_sets`).
    """
    X = np.asfortranarray(X)
    prefix, missing = index.bitmaps(X)
    return own_split_sets(X, prefix, missing, index.node_row, model.tree_offsets(), model.left, model.right,
                          model.feature, model.missing_left, model.is_categorical, model.cat_bits,
                          owned_slots(model.feature))


def owned_slots(feature: np.ndarray) -> np.ndarray:
    """Each owned node's row in a party's split sets (its rank among the owned nodes), -1 elsewhere."""
    owned = feature >= 0
    slots = np.full(len(feature), -1, np.int64)
    slots[owned] = np.arange(int(owned.sum()))
    return slots


def route_bits(model: PartialForest, X: np.ndarray, rows: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """1 where row `rows[i]` of `X` goes left at `model`'s node `nodes[i]` (uint8)."""
    return route_step(X, rows, nodes, model.feature, model.threshold, model.missing_left,
                      model.is_categorical, model.cat_bits)


class LocalPredictionRows:
    """The encoded rows to predict, held in the party's process."""

    def __init__(self, X: np.ndarray, model: PartialForest) -> None:
        """`X`: the rows as `encode_columns` gives them for `model`."""
        self.X, self.model, self.index = X, model, threshold_index(model)

    @property
    def n_rows(self) -> int:
        """Rows to predict."""
        return len(self.X)

    def split_sets(self, start: int, stop: int) -> np.ndarray:
        """`split_sets` of rows [start, stop)."""
        return split_sets(self.model, self.index, self.X[start:stop])

    def route(self, rows: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """`route_bits` of the (checked) rows and nodes."""
        return route_bits(self.model, self.X, rows, nodes)

    def close(self) -> None:
        """Nothing to release in process."""
