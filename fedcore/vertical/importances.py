"""Feature importances that respect party boundaries (issue #33).

The master knows every node's statistics (weight, value) and which party owns each split, but no split's
feature; a party knows the feature of its own splits only. So the master turns the statistics into each
split's share of its tree's impurity decrease (`fedcore.estimator_api.split_shares`) and sends every party,
with `finalize`, the shares of that party's own splits only; the party sums them per feature, exactly as
the estimators' `feature_importances_` do, and keeps the result at home. The master learns only each
party's share: the sum over its splits, which it can compute without any feature.

Boosting (issue #32): a split's share is its gain (the criterion's, which chose it) over the sum of every
split's gain in the model: XGBoost's `total_gain` importance, normalised to sum to 1 over all parties'
features, as horizontal boosting's. The master records each chosen split's gain as it grows (a node field,
checkpointed with its batch), so a resumed run's importances are the same.
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
    """Every node's share of its tree's impurity decrease (0 on leaves) and the trees that split at all.

    `owner`: each node's owning party index (-1 on leaves), of the structure the shares were made from (the
    trees grown; after early stopping's cut, made anew from the kept trees: `VerticalMaster.keep_trees`).
    """

    share: np.ndarray
    splitting_trees: int
    owner: np.ndarray

    @classmethod
    def of(cls, structure: ForestStructure, criterion: str,
           gains: np.ndarray | None = None) -> SplitShares | None:
        """From the master's structure; boosting from each node's chosen split gain (`gains`; None: none)."""
        if criterion not in CRITERIA:
            return None if gains is None else cls.of_gains(structure, gains)
        s = structure
        decrease = node_impurity_decrease(s.tree, s.left, s.right, s.weight, s.value, criterion, s.n_trees)
        share, splitting_trees = split_shares(decrease, s.tree, s.n_trees)
        return cls(share, splitting_trees, np.asarray(s.owner).copy())

    @classmethod
    def of_gains(cls, structure: ForestStructure, gains: np.ndarray) -> SplitShares:
        """Each split's gain as a share of all splits' (one "tree" of shares: they already sum to 1)."""
        owner = np.asarray(structure.owner).copy()
        gain = np.where(owner >= 0, np.asarray(gains, np.float64), 0.0)
        total = float(gain.sum())
        return cls(gain / total if total > 0 else np.zeros_like(gain), 1 if total > 0 else 0, owner)

    def own(self, party_index: int) -> np.ndarray:
        """The shares of one party's own splits, zero on every other node: what that party receives."""
        return np.where(self.owner == party_index, self.share, 0.0)

    def per_party(self, parties: list[str]) -> dict[str, float]:
        """Each party's share of the importances (its features' importances summed): the master's view."""
        split = self.owner >= 0
        summed = np.bincount(self.owner[split], weights=self.share[split], minlength=len(parties))
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

