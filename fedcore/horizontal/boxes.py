"""Per open node and feature, an interval known to hold the node's values, from the declared (public) domains.

Shared by the horizontal algorithms that draw thresholds without seeing a node's exact extremes: PPD-ERT's
histogram thresholds (`ppdert/cells.py` narrows a box to the populated grid cells) and FET's DP modes (the
box alone: the declared domain cut along the path by the chosen splits). Every role derives the boxes alike
from public values (domains, draws, decisions), so nothing about the rows is needed to keep them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from fedcore.trees.grower import Level


def box_bytes_per_node(n_features: int) -> int:
    """Bytes a role holds per open node for its box, parent and children alike: 2 x 2 x d float64."""
    return 4 * n_features * 8


def span_thresholds(span_low: np.ndarray, span_high: np.ndarray, has: np.ndarray,
                    u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Thresholds uniform in each populated span (the seed-shared uniforms `u`), and which are usable.

    A candidate is usable when the node has values and the span is not a point. Unusable ones get NaN (every
    row goes right).
    """
    valid = has & (span_high > span_low)
    with np.errstate(invalid="ignore", over="ignore"):
        thresholds = span_low * (1 - u) + span_high * u  # a weighted mean: finite for any finite span
    thresholds = np.where(thresholds >= span_high, span_low, thresholds)  # a rounded-up draw
    return np.where(valid, thresholds, np.nan), valid


class NodeBoxes:
    """Per open node and feature, an interval known to hold all the node's values: (A, d, 2) float64.

    Roots start from the declared domains; a node's candidates narrow its box to their populated spans,
    and its children inherit it, cut at the chosen split's threshold.
    """

    def __init__(self, boxes: np.ndarray) -> None:
        """Wrap the (A, d, 2) boxes of the open nodes."""
        self.boxes = boxes

    @classmethod
    def roots(cls, low: np.ndarray, high: np.ndarray, n_nodes: int) -> NodeBoxes:
        """Every root's box is the declared domain."""
        box = np.stack([low, high], axis=-1).astype(np.float64)
        return cls(np.broadcast_to(box, (n_nodes, *box.shape)).copy())

    def grid(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The candidates' intervals: grid_low, grid_high (A, k)."""
        rows = np.arange(len(features))[:, None]
        return self.boxes[rows, features, 0], self.boxes[rows, features, 1]

    def narrow(self, features: np.ndarray, span_low: np.ndarray, span_high: np.ndarray,
               has: np.ndarray) -> None:
        """Shrink each candidate's interval to its populated span (where the node has values)."""
        rows = np.broadcast_to(np.arange(len(features))[:, None], features.shape)
        self.boxes[rows[has], features[has], 0] = span_low[has]
        self.boxes[rows[has], features[has], 1] = span_high[has]

    def split(self, split_idx: np.ndarray, feature: np.ndarray, threshold: np.ndarray,
              next_pos: np.ndarray) -> NodeBoxes:
        """The next level's boxes: each open child's parent box, cut at the parent's split.

        `split_idx` are the nodes that split, `feature` and `threshold` their splits; child 2i / 2i + 1
        (left / right) of the i-th becomes open node `next_pos[...]` (-1: a leaf), numbered 0 .. n - 1 (the
        grower numbers them so; a party checks it before). Only the open children's boxes are made, in
        their final order: old and new boxes are all that is held at once.
        """
        opened = np.flatnonzero(next_pos >= 0)
        child = np.empty(len(opened), dtype=np.int64)
        child[next_pos[opened]] = opened  # open node -> its child index 2i (left) or 2i + 1 (right)
        parent = child // 2
        boxes = self.boxes[split_idx[parent]]
        nodes = np.arange(len(child))
        f, t, left = feature[parent], threshold[parent], child % 2 == 0
        boxes[nodes[left], f[left], 1] = np.minimum(boxes[nodes[left], f[left], 1], t[left])
        boxes[nodes[~left], f[~left], 0] = np.maximum(boxes[nodes[~left], f[~left], 0], t[~left])
        return NodeBoxes(boxes)

    def after_decisions(self, chosen: np.ndarray, next_pos: np.ndarray, features: np.ndarray,
                        thresholds: np.ndarray) -> NodeBoxes:
        """`split`, from a level's decisions as a party receives them (`RowPartition.apply`).

        `chosen` is each node's candidate (-1: no split); `features` and `thresholds` the level's candidates
        (A, k).
        """
        split_idx = np.flatnonzero(chosen >= 0)
        winner = chosen[split_idx]
        return self.split(split_idx, features[split_idx, winner], thresholds[split_idx, winner], next_pos)

    def after_level(self, level: Level, split_idx: np.ndarray, next_pos: np.ndarray) -> NodeBoxes:
        """`split`, from the master's level record (`BranchStatsLevels.advance`)."""
        return self.split(split_idx, level.fields["feature"][split_idx], level.fields["threshold"][split_idx],
                          next_pos)
