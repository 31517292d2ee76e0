"""Tree tables: the master's forest structure and a party's partial forest.

The structure has no features and no thresholds; a partial forest is the same structure plus feature and
threshold for the nodes that party owns, per Federated Forest 4.2.2.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TypeVar

import numpy as np

NO_CHILD = -1


def tree_offsets(tree: np.ndarray, n_trees: int) -> np.ndarray:
    """Index of each tree's first node in (tree, node)-sorted arrays (length n_trees + 1)."""
    return np.searchsorted(tree, np.arange(n_trees + 1)).astype(np.int64)


def leaf_numbering(tree: np.ndarray, left: np.ndarray,
                   n_trees: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Number the leaves of each tree in node order.

    (leaf offsets per tree, global index of each leaf, slot of each node within its tree's leaves or -1 for
    internal nodes). Master and parties agree on it.
    """
    leaf_nodes = np.flatnonzero(left == NO_CHILD)
    leaf_offsets = np.searchsorted(tree[leaf_nodes], np.arange(n_trees + 1)).astype(np.int64)
    slot = np.full(len(tree), -1, dtype=np.int32)
    slot[leaf_nodes] = np.arange(len(leaf_nodes)) - leaf_offsets[tree[leaf_nodes]]
    return leaf_offsets, leaf_nodes, slot


Tables = TypeVar("Tables", "ForestStructure", "PartialForest")


def first_trees(model: Tables, n_trees: int) -> Tables:
    """The model's first `n_trees` trees (boosting's early stopping keeps the best round's).

    Every node array is cut where tree `n_trees` begins: the same cut at the master and at every party.
    """
    if not 1 <= n_trees <= model.n_trees:
        raise ValueError(f"cannot keep {n_trees} of {model.n_trees} trees")
    end = int(model.tree_offsets()[n_trees])
    cut = {f.name: getattr(model, f.name)[:end].copy() for f in fields(model)
           if isinstance(getattr(model, f.name), np.ndarray)}
    return replace(model, n_trees=n_trees, **cut)


@dataclass
class ForestStructure:
    """The master's view: every node of every tree, its children, owner party and statistics.

    Arrays are aligned, sorted by (tree, node); node ids are per tree, breadth-first, root 0.
    `value` holds class probabilities (classification) or the mean (regression) of each node.
    """

    tree: np.ndarray
    node: np.ndarray
    left: np.ndarray
    right: np.ndarray
    depth: np.ndarray
    owner: np.ndarray
    weight: np.ndarray
    value: np.ndarray
    n_trees: int

    @property
    def n_nodes(self) -> int:
        """Total number of nodes over all trees."""
        return len(self.tree)

    def tree_offsets(self) -> np.ndarray:
        """Index of each tree's first node (length n_trees + 1)."""
        return tree_offsets(self.tree, self.n_trees)

    def leaves(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """See `leaf_numbering`."""
        return leaf_numbering(self.tree, self.left, self.n_trees)

    def max_depth(self) -> int:
        """Depth of the deepest node."""
        return int(self.depth.max()) if self.n_nodes else 0


@dataclass
class PartySplits:
    """The splits one party owns, keyed by (tree, node)."""

    tree: np.ndarray
    node: np.ndarray
    feature: np.ndarray  # local column index
    bin: np.ndarray  # numeric: left if code <= bin
    missing_left: np.ndarray
    is_categorical: np.ndarray
    cat_bits: np.ndarray  # (n, 4) uint64

    @classmethod
    def empty(cls) -> PartySplits:
        """No splits."""
        return cls(np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0, np.int32),
                   np.empty(0, np.bool_), np.empty(0, np.bool_), np.empty((0, 4), np.uint64))

    @classmethod
    def concatenate(cls, parts: list[PartySplits]) -> PartySplits:
        """Join several batches of splits."""
        if not parts:
            return cls.empty()
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                     ("tree", "node", "feature", "bin", "missing_left", "is_categorical", "cat_bits")))


@dataclass
class PartialForest:
    """A party's partial model: the forest structure plus, for its own nodes, how to test a row.

    `feature` is -1 on nodes the party does not own. Numeric test: x <= threshold (NaN: missing_left).
    Categorical test: category code in cat_bits (missing or unknown: missing_left). Column metadata
    (names, categorical vocabularies) stays with the party.
    """

    tree: np.ndarray
    node: np.ndarray
    left: np.ndarray
    right: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    missing_left: np.ndarray
    is_categorical: np.ndarray
    cat_bits: np.ndarray
    n_trees: int
    column_names: list[str] = field(default_factory=list)
    column_categories: list[list[str] | None] = field(default_factory=list)

    def tree_offsets(self) -> np.ndarray:
        """Index of each tree's first node (length n_trees + 1)."""
        return tree_offsets(self.tree, self.n_trees)

    def leaves(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """See `leaf_numbering` (the same numbering the master uses)."""
        return leaf_numbering(self.tree, self.left, self.n_trees)
