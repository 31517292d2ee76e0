"""Per-row feature contributions of a complete horizontal forest: exact TreeSHAP (path-dependent).

Lundberg, Erion and Lee, "Consistent Individualized Feature Attribution for Tree Ensembles" (2018),
Algorithm 2: for each tree, the Shapley values of the features for one row, where the value of a feature set
S is the tree's expected output given the row's values on S and the training distribution elsewhere,
approximated as the paper does by following the row on features in S and averaging both children by their
cover (here the nodes' aggregated row counts, `HorizontalForest.weight`, as shares of the two children's
sum, which need not be the parent's under DP noise). A forest's contributions are the mean of its trees'.
For every row, the contributions plus the expected value (each tree's leaves averaged by those shares)
add up to the prediction, to rounding. A boosted model's are in margin space, as XGBoost's `pred_contribs`:
tree t adds to output t mod K, the expected value is the base score plus the trees' expected leaf weights,
and both add up to the margins (before the link).

A split sends a row left when `x <= threshold`; NaN goes right, as in prediction. Covers come from the
released counts: noisy in the DP modes (a count at or below zero is taken as a tiny positive cover, so the
weights stay defined). Python per row and tree (O(leaves x depth^2) each): meant for explaining rows, not
for scoring a batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedcore.horizontal.model import HorizontalForest

MIN_COVER = 1e-9
"""The cover a node with a released count of zero or less is given (DP noise can push a count there)."""


@dataclass
class _PathEntry:
    feature: int
    zero_fraction: float
    one_fraction: float
    weight: float = 0.0


@dataclass
class _Tree:
    """One tree's nodes with tree-local children and covers."""

    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    cover: np.ndarray
    value: np.ndarray  # (n_nodes, n_outputs)
    expected: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.expected = self._expected(0)

    def share(self, child: int, node: int) -> float:
        """The child's share of its parent's rows: its cover over both children's."""
        return float(self.cover[child] / (self.cover[self.left[node]] + self.cover[self.right[node]]))

    def _expected(self, node: int) -> np.ndarray:
        if self.feature[node] < 0:
            return self.value[node]
        left, right = int(self.left[node]), int(self.right[node])
        return self.share(left, node) * self._expected(left) + self.share(right, node) * self._expected(right)


def _trees(forest: HorizontalForest) -> list[_Tree]:
    offsets = forest.tree_offsets()
    out = []
    for t in range(forest.n_trees):
        rows = slice(int(offsets[t]), int(offsets[t + 1]))
        out.append(_Tree(forest.feature[rows], forest.threshold[rows], forest.left[rows], forest.right[rows],
                         np.maximum(forest.weight[rows], MIN_COVER), forest.value[rows]))
    return out


def _extend(path: list[_PathEntry], zero: float, one: float, feature: int) -> list[_PathEntry]:
    path = [_PathEntry(e.feature, e.zero_fraction, e.one_fraction, e.weight) for e in path]
    length = len(path)
    path.append(_PathEntry(feature, zero, one, 1.0 if length == 0 else 0.0))
    for i in range(length - 1, -1, -1):
        path[i + 1].weight += one * path[i].weight * (i + 1) / (length + 1)
        path[i].weight = zero * path[i].weight * (length - i) / (length + 1)
    return path


def _unwind(path: list[_PathEntry], index: int) -> list[_PathEntry]:
    length = len(path) - 1
    one, zero = path[index].one_fraction, path[index].zero_fraction
    out = [_PathEntry(e.feature, e.zero_fraction, e.one_fraction, e.weight) for e in path]
    carry = out[length].weight
    for j in range(length - 1, -1, -1):
        if one != 0:
            kept = out[j].weight
            out[j].weight = carry * (length + 1) / ((j + 1) * one)
            carry = kept - out[j].weight * zero * (length - j) / (length + 1)
        else:
            out[j].weight = out[j].weight * (length + 1) / (zero * (length - j))
    for j in range(index, length):
        out[j].feature, out[j].zero_fraction, out[j].one_fraction = (
            out[j + 1].feature, out[j + 1].zero_fraction, out[j + 1].one_fraction)
    return out[:length]


def _unwound_sum(path: list[_PathEntry], index: int) -> float:
    return sum(e.weight for e in _unwind(path, index))


def _tree_shap(tree: _Tree, x: np.ndarray, phi: np.ndarray) -> None:
    """Add one tree's contributions for row `x` into `phi` (n_features, n_outputs)."""
    def recurse(node: int, path: list[_PathEntry], zero: float, one: float, feature: int) -> None:
        path = _extend(path, zero, one, feature)
        split = int(tree.feature[node])
        if split < 0:
            for i in range(1, len(path)):
                weight = _unwound_sum(path, i)
                entry = path[i]
                phi[entry.feature] += weight * (entry.one_fraction - entry.zero_fraction) * tree.value[node]
            return
        value = x[split]
        goes_left = bool(value <= tree.threshold[node])  # NaN compares False: right
        hot, cold = (tree.left[node], tree.right[node]) if goes_left else (tree.right[node], tree.left[node])
        incoming_zero, incoming_one = 1.0, 1.0
        for k in range(1, len(path)):
            if path[k].feature == split:
                incoming_zero, incoming_one = path[k].zero_fraction, path[k].one_fraction
                path = _unwind(path, k)
                break
        recurse(int(hot), path, incoming_zero * tree.share(hot, node), incoming_one, split)
        recurse(int(cold), path, incoming_zero * tree.share(cold, node), 0.0, split)

    recurse(0, [], 1.0, 1.0, -1)


def contributions(forest: HorizontalForest, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row contributions (n_rows, n_features, n_outputs) and the expected value (n_outputs,).

    `X` is the encoded matrix (`HorizontalSchema.encode`). contributions.sum(axis=1) + expected equals the
    forest's `predict_values(X)` to rounding; a boosted model's, its margins (one output per tree of a round).
    """
    X = np.asarray(X, dtype=np.float64)
    trees = _trees(forest)
    combination = forest.combination
    if combination.kind == "sum":
        k = combination.trees_per_round
        out = np.zeros((X.shape[0], X.shape[1], k))
        expected = np.asarray(combination.base_score, dtype=np.float64).copy()
        for t, tree in enumerate(trees):
            expected[t % k] += tree.expected[0]
        for r in range(X.shape[0]):
            for t, tree in enumerate(trees):
                _tree_shap(tree, X[r], out[r, :, t % k:t % k + 1])
        return out, expected
    n_outputs = forest.value.shape[1]
    out = np.zeros((X.shape[0], X.shape[1], n_outputs))
    for r in range(X.shape[0]):
        for tree in trees:
            _tree_shap(tree, X[r], out[r])
    expected = np.mean([tree.expected for tree in trees], axis=0)
    return out / forest.n_trees, expected
