"""A vertical party's rows to predict and its two per-party prediction steps on them.

`leaf_sets` (one-round prediction: the rows each leaf is reachable by through this party's splits) and
`route_bits` (node by node: which way this party's nodes send the asked rows) are row-wise, so a party
whose rows sit in blocks on its Dask workers (`fedcore.compute.dask_vertical_predict`) runs the same two
functions per block and concatenates the answers in row order: the in-process answer, bit for bit.
"""

from __future__ import annotations

import numpy as np

from fedcore.trees.predictor import ThresholdIndex, leaf_row_sets, route_step
from fedcore.trees.structure import PartialForest


def threshold_index(model: PartialForest) -> ThresholdIndex:
    """The index of the thresholds of the numeric nodes `model` owns (built once per prediction data)."""
    return ThresholdIndex(model.feature, model.threshold, model.is_categorical, len(model.column_names))


def leaf_sets(model: PartialForest, index: ThresholdIndex, X: np.ndarray) -> np.ndarray:
    """Packed row sets ((n_leaves, ceil(rows/64)) uint64) of every leaf as reachable through `model`."""
    leaf_offsets, _, slot = model.leaves()
    X = np.asfortranarray(X)
    prefix, missing = index.bitmaps(X)
    return leaf_row_sets(X, prefix, missing, index.node_row, model.tree_offsets(), model.left, model.right,
                         model.feature, model.missing_left, model.is_categorical, model.cat_bits,
                         leaf_offsets, slot)


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

    def leaf_sets(self, start: int, stop: int) -> np.ndarray:
        """`leaf_sets` of rows [start, stop)."""
        return leaf_sets(self.model, self.index, self.X[start:stop])

    def route(self, rows: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """`route_bits` of the (checked) rows and nodes."""
        return route_bits(self.model, self.X, rows, nodes)

    def close(self) -> None:
        """Nothing to release in process."""
