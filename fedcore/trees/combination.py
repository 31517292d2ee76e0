"""How a model's trees combine into one prediction: a parameter of the model, read by every predictor.

Forests take the mean of their trees' leaf values (class probabilities or means). Boosting sums its trees'
leaf weights onto a base score, round by round (tree t adds to output t mod K), and applies a link
(`fedcore.trees.losses.transform`). The sum runs in round order, as the label holder's margins grew in
training, so a training row's prediction is the margin it ended training with, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedcore.trees.losses import transform


@dataclass(frozen=True)
class TreeCombination:
    """Mean of leaf values (forests), or base score + sum of leaf weights through a link (boosting)."""

    kind: str = "mean"
    base_score: tuple[float, ...] = ()
    link: str = "identity"

    def __post_init__(self) -> None:
        """Refuse what no model combines by."""
        if self.kind not in ("mean", "sum"):
            raise ValueError(f"trees combine by 'mean' or 'sum', got {self.kind!r}")
        if self.kind == "sum" and not self.base_score:
            raise ValueError("a sum of trees needs a base score per output")

    @property
    def trees_per_round(self) -> int:
        """Trees grown together per boosting round (one per output); a forest's trees are one each."""
        return len(self.base_score) if self.kind == "sum" else 1

    def margins(self, leaf_values: np.ndarray) -> np.ndarray:
        """Boosting: base score plus every round's leaf weights, (n_rows, K), from (n_rows, n_trees, 1)."""
        k = self.trees_per_round
        out = np.tile(np.asarray(self.base_score, np.float64), (leaf_values.shape[0], 1))
        for tree in range(leaf_values.shape[1]):
            out[:, tree % k] += leaf_values[:, tree, 0]
        return out

    def combine(self, leaf_values: np.ndarray) -> np.ndarray:
        """The model's outputs from each row's leaf values per tree, (n_rows, n_trees, n_values).

        Forests: the mean over trees. Boosting: the link of the margins (probabilities or values).
        """
        if self.kind == "mean":
            return leaf_values.mean(axis=1)
        return transform(self.link, self.margins(leaf_values))


MEAN = TreeCombination()
"""The forests' combination."""
