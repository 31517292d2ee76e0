"""Feature importances that respect party boundaries (issue #33).

The master knows every node's statistics (weight, value) and which party owns each split, but no split's
feature; a party knows the feature of its own splits only. So the master turns the statistics into each
split's share of its tree's impurity decrease (`fedcore.estimator_api.split_shares`) and sends every party,
with `finalize`, the shares of that party's own splits only; the party sums them per feature, exactly as
the estimators' `feature_importances_` do, and keeps the result at home. The master learns only each
party's share: the sum over its splits, which it can compute without any feature.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedcore.errors import ProtocolError
from fedcore.estimator_api import importances_from_shares, node_impurity_decrease, split_shares
from fedcore.trees.criteria import CRITERIA
from fedcore.trees.structure import ForestStructure, PartialForest


@dataclass(frozen=True)
class SplitShares:
    """Every node's share of its tree's impurity decrease (0 on leaves) and the trees that split at all."""

    share: np.ndarray
    splitting_trees: int

    @classmethod
    def of(cls, structure: ForestStructure, criterion: str) -> SplitShares | None:
        """From the master's structure; None for boosting (gain importances are not built yet)."""
        if criterion not in CRITERIA:
            return None
        s = structure
        decrease = node_impurity_decrease(s.tree, s.left, s.right, s.weight, s.value, criterion, s.n_trees)
        share, splitting_trees = split_shares(decrease, s.tree, s.n_trees)
        return cls(share, splitting_trees)

    def own(self, owner: np.ndarray, party_index: int) -> np.ndarray:
        """The shares of one party's own splits, zero on every other node: what that party receives."""
        return np.where(np.asarray(owner) == party_index, self.share, 0.0)

    def per_party(self, owner: np.ndarray, parties: list[str]) -> dict[str, float]:
        """Each party's share of the importances (its features' importances summed): the master's view."""
        split = np.asarray(owner) >= 0
        summed = np.bincount(np.asarray(owner)[split], weights=self.share[split], minlength=len(parties))
        scale = self.splitting_trees or 1
        return {name: float(summed[i] / scale) for i, name in enumerate(parties)}


def party_importances(party: str, model: PartialForest, share: np.ndarray,
                      splitting_trees: int) -> np.ndarray:
    """A party's importances of its own features (`model.column_names` order) from the shares it received.

    Refused (naming the party) unless there is one finite share in [0, 1] per node. Shares of nodes it does
    not own are never read (only its own splits name a feature); the master sends none (tested on
    transcripts).
    """
    share = np.asarray(share, dtype=np.float64)
    if share.shape != model.tree.shape or not bool(np.all(np.isfinite(share) & (share >= 0) & (share <= 1))):
        raise ProtocolError(f"party {party!r}: finalize's importance shares should be one number in [0, 1] "
                            f"per node ({len(model.tree)})")
    if splitting_trees < 0 or splitting_trees > model.n_trees:
        raise ProtocolError(f"party {party!r}: finalize's splitting_trees {splitting_trees} is outside "
                            f"[0, {model.n_trees}]")
    return importances_from_shares(share, model.feature, len(model.column_names), splitting_trees)

