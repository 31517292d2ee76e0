"""The one level-wise growth loop of every algorithm and mode, at the master.

`LevelwiseGrower` grows a forest tree batch by tree batch and, within a batch, level by level over all
open nodes of all its trees at once. It owns what every algorithm shares:

* tree batches: their size from every role's memory budget (`plan`, `fedcore.trees.budget`), or
  `tree_batch_size`;
* node numbering: children of the nodes that split get the next free ids of their tree, two per split,
  in open-node order (left = 2i + next, right = left + 1);
* stopping rules (`StoppingRules`): depth limit, min_samples_split, min_samples_leaf, the rounding guard
  `min_gain` (fedcore/trees/criteria.py);
* node records (tree, node, left, right, depth, and the strategy's own fields), sorted by (tree, node);
* checkpoints: every finished batch is saved with the grower's and the strategy's counters (and the
  strategy's running arrays, `batch_state`), and a resumed run loads the batches before `resume_from`
  instead of growing them again;
* progress reports (`GrowthProgress`).

What differs between algorithms plugs in as a `LevelStrategy` (the shape of scikit-learn's `TreeGrower` +
`Splitter`, or Flower's `Strategy` hooks): what to ask the parties for a level, and how to choose splits
from their answers. The strategies:

    vertical plain, encrypted labels     fedcore/vertical/master.py (VerticalMaster; encrypted scoring hook)
    vertical boosting (plain)            the same VerticalMaster on gradient statistics, a round a batch
                                         (fedcore/trees/boosting.py)
    horizontal boosting (secagg)         fedcore/horizontal/boosting/master.py (summed (count, g, h)
                                         histograms, a round a batch)
    FET none / gdp / ldp                 fedcore/horizontal/fet/master.py (FederatedExtraTreesMaster)
    PPD-ERT                              fedcore/horizontal/ppdert/master.py (PPDERTMaster)

The horizontal strategies share their split choice from aggregated branch statistics
(`fedcore/horizontal/growth.py`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

from fedcore.checkpoints import CheckpointStore
from fedcore.errors import ArtifactError
from fedcore.progress import GrowthProgress, ProgressCallback
from fedcore.trees.budget import trees_per_batch
from fedcore.trees.criteria import min_gain
from fedcore.trees.params import TreeParams
from fedcore.trees.structure import NO_CHILD

COUNTER_PREFIX = "counter_"
"""Checkpoint arrays named so hold one of the counters (grower's and strategy's) after the batch."""
STATE_PREFIX = "state_"
"""Checkpointed arrays of the strategy's `batch_state`, beside the batch's node records."""
BATCH_SIZE_COUNTER = "tree_batch_size"
"""The counter holding the run's planned batch size: a resumed run keeps the plan it started with."""


@dataclass(frozen=True)
class StoppingRules:
    """When a node may split and when a child stays open.

    From the parameters (and a privacy mode's raised leaf floor).
    """

    depth_limit: int
    min_samples_split: int
    min_samples_leaf: int

    @classmethod
    def of(cls, params: TreeParams, min_samples_leaf: int | None = None) -> StoppingRules:
        """The rules of `params`, with `min_samples_leaf` in place of theirs when given."""
        return cls(params.depth_limit, params.min_samples_split,
                   params.min_samples_leaf if min_samples_leaf is None else min_samples_leaf)

    def may_split(self, depth: int) -> bool:
        """Whether nodes at `depth` may split at all."""
        return depth < self.depth_limit

    @staticmethod
    def improves(gain: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """Gains that count as an improvement on nodes of `weight` (above the rounding guard `min_gain`)."""
        return gain > min_gain(weight)

    def child_may_open(self, child_n: np.ndarray, child_depth: int) -> np.ndarray:
        """Children with `child_n` samples at `child_depth` that can still split (else they are leaves)."""
        return ((child_depth < self.depth_limit) & (child_n >= self.min_samples_split)
                & (child_n >= 2 * self.min_samples_leaf))


@dataclass
class Level:
    """A strategy's decisions for one level's open nodes.

    `fields` are the strategy's record fields of the open nodes (weight, value, and what the split is:
    an owner party, or a feature and threshold). `child_open` (2 per split node, left then right, in
    open-node order) says which children stay open, when the strategy knows the children's statistics
    already (horizontal); `child_fields` are then the record fields of the children that close (leaves),
    in the same order.
    None: every child is open and is recorded at the next level.
    """

    split: np.ndarray
    fields: dict[str, np.ndarray]
    child_open: np.ndarray | None = None
    child_fields: dict[str, np.ndarray] = field(default_factory=dict)


class LevelStrategy(ABC):
    """What one algorithm and mode plugs into `LevelwiseGrower` (see the module doc)."""

    @abstractmethod
    def open_batch(self, trees: list[int], save_batch: int | None) -> None:
        """A batch starts (every tree a root); `save_batch`: the batch the parties checkpoint now, if any."""

    @abstractmethod
    def level(self, trees: list[int], depth: int, open_tree: np.ndarray, open_node: np.ndarray) -> Level:
        """Exchange one level with the parties and decide which open nodes split."""

    @abstractmethod
    def advance(self, level: Level, split_idx: np.ndarray, left: np.ndarray, child_open: np.ndarray,
                next_pos: np.ndarray) -> None:
        """The level's decisions are final.

        Tell (or prepare to tell) the parties. `left` holds the left child ids of the split nodes; `next_pos`
        each child's position among the next level's open nodes (-1: a leaf).
        """

    def batch_done(self, records: dict[str, np.ndarray]) -> None:
        """A batch's node records, sorted by (tree, node), once grown or loaded; nothing by default.

        Horizontal boosting's parties route their rows through a finished round's trees.
        """
        return None

    def counters(self) -> dict[str, int]:
        """The strategy's running counters, checkpointed with every batch (e.g. a round id)."""
        return {}

    def restore_counters(self, counters: dict[str, int]) -> None:
        """Counters of a batch loaded from a checkpoint (none by default)."""
        return None

    def batch_state(self) -> dict[str, np.ndarray]:
        """Running arrays checkpointed with every batch (horizontal boosting's gains); none by default."""
        return {}

    def restore_batch_state(self, state: dict[str, np.ndarray]) -> None:
        """The arrays `batch_state` gave, from a batch loaded from a checkpoint (nothing by default)."""
        return None


class LevelwiseGrower:
    """Grows every tree of a forest through one `LevelStrategy` (see the module doc)."""

    def __init__(self, strategy: LevelStrategy, params: TreeParams,
                 progress: ProgressCallback | None = None) -> None:
        """Grow the forest of `params` through `strategy`, in batches of `tree_batch_size` (default: all)."""
        self.strategy = strategy
        self.params = params
        self.progress = progress
        self.batch_size = params.tree_batch_size or params.n_estimators
        self.levels = 0  # levels with open nodes, over all batches

    def plan(self, costs: list[tuple[int, int]], shared_budget: int | None = None) -> int:
        """The trees per batch, sized from every role's (bytes per tree, memory budget).

        Or from one budget all roles share in one process, unless the user set `tree_batch_size` (see
        `fedcore.trees.budget`).
        """
        if self.params.tree_batch_size is None:
            self.batch_size = trees_per_batch(self.params.n_estimators, costs, shared_budget)
        return self.batch_size

    def batches(self) -> list[list[int]]:
        """The tree batches, in growth order."""
        return self.params.batches(self.batch_size)

    def grow(self, checkpoints: CheckpointStore | None = None,
             resume_from: int = 0) -> tuple[dict, int | None]:
        """Grow (or load) every batch.

        The node records of the forest, sorted by (tree, node), and the batch the parties checkpoint with the
        final model (None without checkpoints or when every batch came from checkpoints).
        """
        # the plan an earlier attempt started with
        if checkpoints is not None and 0 in checkpoints.completed():
            recorded = checkpoints.load(0).get(COUNTER_PREFIX + BATCH_SIZE_COUNTER)
            # checkpoints from before plans were recorded: the default of that time (one batch, or the size
            # set)
            self.batch_size = int(recorded[0]) if recorded is not None else (
                self.params.tree_batch_size or self.params.n_estimators)
        batches = self.batches()
        if self.progress and len(batches) > 1:
            self.progress(GrowthProgress(0, self.params.n_estimators, 0, -1, 0, n_batches=len(batches)))
        parts: list[dict[str, np.ndarray]] = []
        for index, trees in enumerate(batches):
            if checkpoints is not None and index < resume_from:
                saved = checkpoints.load(index)
                if len(saved["tree"]) and not (trees[0] <= int(saved["tree"].min())
                                               <= int(saved["tree"].max()) <= trees[-1]):
                    raise ArtifactError(f"checkpoint batch {index} holds trees outside "
                                        f"{trees[0]}..{trees[-1]}: it belongs to another batch plan")
                counters = {name[len(COUNTER_PREFIX):]: int(a[0]) for name, a in saved.items()
                            if name.startswith(COUNTER_PREFIX)}
                self._restore(counters)
                self.strategy.restore_batch_state({name[len(STATE_PREFIX):]: a for name, a in saved.items()
                                                   if name.startswith(STATE_PREFIX)})
                parts.append({name: a for name, a in saved.items()
                              if not name.startswith((COUNTER_PREFIX, STATE_PREFIX))})
                self.strategy.batch_done(parts[-1])
                continue
            save_previous = index - 1 if checkpoints is not None and index > resume_from else None
            part = sort_records(self._grow_batch(trees, save_previous))
            if checkpoints is not None:
                checkpoints.save(index, {**part, **{COUNTER_PREFIX + name: np.array([value], np.int64)
                                                    for name, value in self._counters().items()},
                                         **{STATE_PREFIX + name: a
                                            for name, a in self.strategy.batch_state().items()}})
            parts.append(part)
            self.strategy.batch_done(part)
            if self.progress:
                self.progress(GrowthProgress(trees[-1] + 1, self.params.n_estimators, 0, -1, 0))
        # one batch (small tables): its arrays as they are, not a copy of the forest's values
        merged = parts[0] if len(parts) == 1 else {name: np.concatenate([part[name] for part in parts])
                                                   for name in parts[0]}
        final_save = len(batches) - 1 if checkpoints is not None and len(batches) - 1 >= resume_from else None
        return merged, final_save

    def _counters(self) -> dict[str, int]:
        return {"levels": self.levels, BATCH_SIZE_COUNTER: self.batch_size, **self.strategy.counters()}

    def _restore(self, counters: dict[str, int]) -> None:
        self.levels = counters.get("levels", self.levels)
        self.strategy.restore_counters(counters)

    def _grow_batch(self, trees: list[int], save_previous: int | None) -> list[dict[str, np.ndarray]]:
        """Grow one batch level by level: its node records."""
        strategy, first_tree = self.strategy, trees[0]
        strategy.open_batch(trees, save_previous)
        open_tree = np.array(trees, dtype=np.int32)
        open_node = np.zeros(len(trees), dtype=np.int32)
        next_id = np.ones(len(trees), dtype=np.int64)  # next free node id per tree of the batch
        records: list[dict[str, np.ndarray]] = []
        depth = 0
        while len(open_tree):
            self.levels += 1
            n_open = len(open_tree)
            level = strategy.level(trees, depth, open_tree, open_node)
            split_idx = np.flatnonzero(level.split)
            split_rel = open_tree[split_idx].astype(np.int64) - first_tree
            within = np.arange(len(split_idx)) - np.searchsorted(split_rel, split_rel, side="left")
            left = np.full(n_open, NO_CHILD, dtype=np.int32)
            right = np.full(n_open, NO_CHILD, dtype=np.int32)
            left[split_idx] = next_id[split_rel] + 2 * within
            right[split_idx] = left[split_idx] + 1
            next_id += 2 * np.bincount(split_rel, minlength=len(trees))
            records.append({"tree": open_tree, "node": open_node, "left": left, "right": right,
                            "depth": np.full(n_open, depth, np.int16), **level.fields})
            if self.progress:
                self.progress(GrowthProgress(first_tree, self.params.n_estimators, len(trees), depth, n_open,
                                             max_depth=self.params.max_depth or 0,
                                             **level_rows(level, split_idx)))
            if not len(split_idx):
                break
            child_tree = np.repeat(open_tree[split_idx], 2)
            child_node = np.stack([left[split_idx], right[split_idx]], axis=1).reshape(-1)
            child_open = np.ones(len(child_tree), bool) if level.child_open is None else level.child_open
            closed = ~child_open
            if closed.any():
                n_closed = int(closed.sum())
                records.append({
                    "tree": child_tree[closed], "node": child_node[closed],
                    "left": np.full(n_closed, NO_CHILD, np.int32),
                    "right": np.full(n_closed, NO_CHILD, np.int32),
                    "depth": np.full(n_closed, depth + 1, np.int16), **level.child_fields,
                })
            next_pos = np.full(len(child_tree), -1, dtype=np.int32)
            next_pos[child_open] = np.arange(int(child_open.sum()), dtype=np.int32)
            strategy.advance(level, split_idx, left[split_idx], child_open, next_pos)
            open_tree, open_node = child_tree[child_open], child_node[child_open]
            depth += 1
        return records


class LevelRows(TypedDict, total=False):
    """A level's progress facts, as `GrowthProgress` names them."""

    rows_open: float
    rows_next: float
    nodes_next: int


def level_rows(level: Level, split_idx: np.ndarray) -> LevelRows:
    """Progress facts of a level (read only, for `GrowthProgress`).

    The rows (node weight) in its open nodes, the rows in the nodes that stay open after it, and how many
    nodes those are (none without a `weight` field).
    """
    weight = level.fields.get("weight")
    if weight is None:
        return {}
    weight = np.maximum(np.asarray(weight, dtype=np.float64), 0.0)  # (a noisy estimate may go below 0)
    rows_next = float(weight[split_idx].sum())
    nodes_next = 2 * len(split_idx)
    if level.child_open is not None:  # the children that close now take their rows with them
        nodes_next = int(np.count_nonzero(level.child_open))
        closed = level.child_fields.get("weight")
        if closed is not None:
            rows_next -= float(np.maximum(np.asarray(closed, dtype=np.float64), 0.0).sum())
    return {"rows_open": float(weight.sum()), "rows_next": max(rows_next, 0.0), "nodes_next": nodes_next}


def sort_records(records: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-level node records joined into arrays sorted by (tree, node).

    Each piece is written once, at its sorted place (half the copying of concatenating, then reordering, the
    forest's value arrays). The order is one stable sort of the unique key tree x (most nodes) + node: the
    pieces are sorted runs (a level's records by tree and node), which the sort merges.
    """
    tree = np.concatenate([r["tree"] for r in records])
    node = np.concatenate([r["node"] for r in records])
    span = int(node.max()) + 1 if len(node) else 1
    if len(tree) and min(int(tree.min()), int(node.min())) >= 0 and (int(tree.max()) + 1) * span < 1 << 62:
        order = np.argsort(tree.astype(np.int64) * span + node, kind="stable")
    else:  # a key that would not fit int64
        order = np.lexsort((node, tree))
    place = np.empty_like(order)
    place[order] = np.arange(len(order))
    out = {"tree": tree[order], "node": node[order]}
    for name, first in records[0].items():
        if name in out:
            continue
        merged = np.empty((len(order), *first.shape[1:]), dtype=first.dtype)
        start = 0
        for r in records:
            merged[place[start:start + len(r[name])]] = r[name]
            start += len(r[name])
        out[name] = merged
    return out
