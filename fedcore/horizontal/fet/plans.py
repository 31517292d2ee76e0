"""FET-GDP's release plan: where the model's budget goes, and the default a user who gives only epsilon gets.

Three plans (`GlobalDP.plan`, issue #31):

* `splits` (the FET paper's): every level of every tree releases its nodes' noisy branch counts, the master
  chooses the splits from them, and the leaves' values are those noisy counts.
* `leaves`: the first `split_levels` levels are chosen as in `splits`; below them each node's feature is a
  seeded random one and its threshold the seed's uniform placed by the DP marginal CDFs in the node's box
  (no budget), and each tree's leaves release their class counts once (`fet_leaves`; one row is in one leaf:
  L2 sensitivity 1). A leaf's value is its clamped noisy proportions, the forest averages them.
* `marginals`: plan leaves whose drawn nodes each choose, among k drawn candidates, the split the
  class-conditional DP marginal histograms (released once at hello instead of the unconditioned ones) say
  separates the classes best (`fet/class_marginals.py`; no further budget).

`auto` (the default) is `choose_gdp_plan`'s rule, from the measurements in docs/benchmarks.md ("FET-GDP's
leaf-release plan"): a classification without a `max_depth` (a user who gives only epsilon) gets plan
`leaves` with DEFAULT_SPLIT_LEVELS chosen levels, DEFAULT_LEAF_TREES trees and, after hello, the depth
`leaf_depth` gives for the noisy row count, except two classes at epsilon >= BINARY_SPLITS_EPSILON, which
take plan `splits` with DEFAULT_SPLIT_TREES x DEFAULT_SPLIT_DEPTH. With a `max_depth` (at depth 8 the leaves
lost to the splits on two of three tables), or for a regression (its leaves would release sums of targets:
not built), plan `splits` with the given trees and depth. `auto` never picks `marginals` (better than the
leaves on letter only: docs/benchmarks.md, "FET-GDP plan marginals").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numba as nb
import numpy as np

from fedcore.errors import ParameterError
from fedcore.horizontal.boxes import NodeBoxes
from fedcore.horizontal.growth import tree_segments
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.plan import UNBOUNDED_DEPTH
from fedcore.randomness import stream
from fedcore.trees.structure import NO_CHILD

DEFAULT_LEAF_TREES = 100
"""Plan auto without a depth: trees (measured: 100 x 12 against 50 x 8..12 and 200 x 12)."""
DEFAULT_SPLIT_LEVELS = 0
"""Plan auto: upper levels chosen by noisy counts before the random ones (measured: 0, 1, 2)."""
BINARY_SPLITS_EPSILON = 4.0
"""Plan auto: two classes at this budget or more take plan splits (spambase, 3 seeds: 0.901 against the
leaves' 0.884 at epsilon 4; at 1 the leaves win, 0.848 against 0.820)."""
DEFAULT_SPLIT_TREES, DEFAULT_SPLIT_DEPTH = 50, 8
"""Plan auto's splits: trees and depth (the shape measured against the leaves)."""
LEAF_DEPTHS = (6, 12)
"""The least and most depth `leaf_depth` chooses (12 measured best or tied on 3,700 to 12,800 rows)."""
LEAF_VALUES_CAP = 1 << 25
"""`leaf_depth` keeps trees x nodes x classes of the forest's values below this (256 MiB of float64)."""


@dataclass(frozen=True)
class GdpPlan:
    """A resolved FET-GDP plan: a leaf release or not, the levels chosen by noisy counts, and the trees."""

    leaf_release: bool
    split_levels: int
    n_estimators: int
    max_depth: int | None
    """None: plan leaves chooses it after hello (`leaf_depth`)."""
    class_marginals: bool = False
    """Plan marginals: plan leaves whose drawn splits are chosen by class-conditional DP marginals
    (`fet/class_marginals.py`)."""


def choose_gdp_plan(plan: str, split_levels: int, epsilon: float, n_classes: int,
                    params: ExtraTreesParams) -> GdpPlan:
    """The plan `plan` ("auto", "splits", "leaves" or "marginals") resolves to for these parameters.

    Refused: splits without a depth, leaves for a regression, split levels that leave no random level.
    """
    regression = params.task == "regression"
    trees = params.n_estimators
    if plan == "auto":  # only epsilon given: the measured plan, its trees and (after hello) its depth
        if params.max_depth is not None or regression:
            plan = "splits"
        elif n_classes <= 2 and epsilon >= BINARY_SPLITS_EPSILON:
            plan, trees = "splits", DEFAULT_SPLIT_TREES
            params = replace(params, max_depth=DEFAULT_SPLIT_DEPTH)
        else:
            plan, split_levels, trees = "leaves", DEFAULT_SPLIT_LEVELS, DEFAULT_LEAF_TREES
    if plan == "splits":
        if params.max_depth is None:
            raise ParameterError(UNBOUNDED_DEPTH.format(mode="gdp"))
        return GdpPlan(False, params.max_depth, trees, params.max_depth)
    if regression:
        raise ParameterError(f"privacy 'gdp': plan {plan!r} releases class counts; a regression trains with "
                             "plan 'splits' (or 'auto')")
    if params.max_depth is not None and split_levels >= params.max_depth:
        raise ParameterError(f"privacy 'gdp': plan {plan!r} with split_levels {split_levels} needs a "
                             f"max_depth above it (got {params.max_depth}): the levels below are drawn and "
                             "the leaves released")
    return GdpPlan(True, split_levels, trees, params.max_depth, class_marginals=plan == "marginals")


def leaf_depth(rows: float, n_trees: int, n_classes: int) -> int:
    """Plan leaves without a given depth: ceil(log2(rows)) within LEAF_DEPTHS, and below the values cap.

    `rows`: the parties' noisy row counts summed (hello). Deeper random trees cut the space finer; one row is
    in one leaf per tree whatever the depth, so the depth costs no budget.
    """
    low, high = LEAF_DEPTHS
    depth = min(max(math.ceil(math.log2(max(rows, 2.0))), low), high)
    while depth > low and n_trees * (2 ** (depth + 1)) * max(n_classes, 1) > LEAF_VALUES_CAP:
        depth -= 1
    return depth


def drawn_features(seed: int, act_tree: np.ndarray, depth: int,
                   boxes: NodeBoxes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A drawn level's feature per open node and its box there: features (A, 1) int64, low, high (A, 1).

    Uniform among the node's usable features (its box is not a point on them: `NodeBoxes.drawn`), from the
    seeded stream keyed by (tree, depth); feature 0 where none is usable.
    """
    u = np.empty(len(act_tree))
    for tree, a, b in tree_segments(act_tree):
        u[a:b] = stream(seed, "fet_features", tree, depth).random(b - a)
    features, low, high = boxes.drawn(u)
    return features[:, None], low[:, None], high[:, None]


def drawn_candidates(seed: int, act_tree: np.ndarray, depth: int, boxes: NodeBoxes,
                     k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Plan marginals: k drawn candidate features per open node and their boxes there: (A, k) each.

    The first is `drawn_features`' feature; the others are drawn alike (uniform among the node's usable
    features) from the seeded stream keyed by (tree, depth) `fet_marginal_features`, so they may repeat.
    """
    n = len(act_tree)
    features, low, high = (np.empty((n, k), dtype) for dtype in (np.int64, np.float64, np.float64))
    features[:, :1], low[:, :1], high[:, :1] = drawn_features(seed, act_tree, depth, boxes)
    if k > 1:
        u = np.empty((len(act_tree), k - 1))
        for tree, a, b in tree_segments(act_tree):
            u[a:b] = stream(seed, "fet_marginal_features", tree, depth).random((b - a, k - 1))
        for j in range(1, k):
            features[:, j], low[:, j], high[:, j] = boxes.drawn(np.ascontiguousarray(u[:, j - 1]))
    return features, low, high


def fill_random_nodes(records: dict[str, np.ndarray], from_depth: int) -> None:
    """The drawn (internal) nodes' weights and values from their leaves, bottom-up, into `records`.

    `records`: a batch's node records sorted by (tree, node), node ids 0.. within a tree. A node at depth >=
    `from_depth` that splits gets its children's summed weight and weighted mean value (their mean where
    both weigh 0): post-processing of the leaves' released counts.
    """
    tree = records["tree"]
    if not len(tree):
        return
    # copies: a batch loaded from a checkpoint holds read-only arrays
    weight = records["weight"] = np.array(records["weight"], dtype=np.float64)
    value = records["value"] = np.array(records["value"], dtype=np.float64)
    _fill_from_children(np.ascontiguousarray(tree, np.int64), np.ascontiguousarray(records["left"], np.int64),
                        np.ascontiguousarray(records["right"], np.int64),
                        np.ascontiguousarray(records["depth"], np.int64), from_depth, weight,
                        value.reshape(len(tree), -1))


@nb.njit(cache=True)
def _fill_from_children(tree, left, right, depth, from_depth, weight, value):  # pragma: no cover
    """`fill_random_nodes` in one pass from the last record back.

    A child's id is above its parent's (ids are given level by level), so its weight and value are final
    when the parent's are made: the same operations as a depth-by-depth pass, in the same order per node.
    """
    first = np.empty(len(tree), np.int64)  # each record's tree's first record
    for i in range(len(tree)):
        first[i] = i if i == 0 or tree[i] != tree[i - 1] else first[i - 1]
    for i in range(len(tree) - 1, -1, -1):
        if depth[i] < from_depth or left[i] == NO_CHILD:
            continue
        lo, ro = first[i] + left[i], first[i] + right[i]
        wl, wr = weight[lo], weight[ro]
        w = wl + wr
        weight[i] = w
        for s in range(value.shape[1]):
            if w > 0:
                value[i, s] = (value[lo, s] * wl + value[ro, s] * wr) / w
            else:
                value[i, s] = (value[lo, s] + value[ro, s]) / 2
