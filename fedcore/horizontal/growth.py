"""The horizontal level strategies' shared half (FET and PPD-ERT, at the master).

The candidates' random draws, and choosing splits from aggregated branch statistics. The growth loop itself
(batches, numbering, stopping, checkpoints) is the one grower of every algorithm, `fedcore/trees/grower.py`.

Per level, for every open node of every tree in the batch, an algorithm-specific exchange (`_level`)
yields k candidate splits (feature, threshold) and the aggregated label statistics of both branches of
each candidate. `BranchStatsLevels` picks the best candidate per node, decides which children are leaves
(the grower's `StoppingRules`, and purity), and tells the parties in the next level's request which
candidate each node took (`chosen`) and where each child sits in the next level's list of open nodes
(`next_pos`, -1 for a child that is a leaf).

Statistics per branch: class counts (classification) or (count, sum of quantised targets) (regression).
In the plain modes they are exact integers, summed over parties in any order to the same value; gains are
computed from them by the same float operations, so the same seed gives the same forest whatever the party
layout. Noisy or estimated statistics may be negative or fractional: counts are clamped at 0.

Ties between candidates go to the lowest candidate index (`argmax`); candidates are ordered by the draw.

Checkpoints (`fit(checkpoints, resume_from)`, see the grower): every completed tree batch is saved at the
master as its node records plus the counters after it (levels grown; PPD-ERT adds its secure-aggregation round
id), so a resumed run loads finished batches instead of growing them again and numbers its rounds as the
uninterrupted run would. Every draw of the master is keyed by (tree, depth); a DP party's noise is keyed by
its count of answered queries, which its agent checkpoints, so a batch grown again under the same batch plan
is the same batch (hence `noise_follows_batches`). The parties keep no tree state between batches (every party
ends with the complete model anyway); they save their own per-batch state (noise counters in the DP modes)
when the first request of the next batch, or the final `model`, carries `save_batch`.

With the model, each party acknowledges it; in a DP mode it states its privacy ledger, which the master
checks against the agreed setting (`agreed_ledger`, `fedcore/horizontal/ledgers.py`) and keeps (`ledgers`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numba as nb
import numpy as np

from fedcore.algorithms import EXTRA_TREES
from fedcore.checkpoints import CheckpointStore
from fedcore.errors import ProtocolError
from fedcore.horizontal.counts import CountLedger
from fedcore.horizontal.ledgers import AgreedLedger, check_ledgers
from fedcore.horizontal.model import HorizontalForest
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.progress import ProgressCallback
from fedcore.protocol.messages import Message
from fedcore.randomness import stream
from fedcore.transport.base import Transport
from fedcore.trees.budget import available_bytes, batch_costs, reported_budgets, resolve_budget
from fedcore.trees.candidates import CRITERION_CODES, best_candidates, best_of_counts, summed_counts
from fedcore.trees.grower import Level, LevelStrategy, LevelwiseGrower, StoppingRules
from fedcore.trees.params import check_model_fits


@dataclass
class LevelResult:
    """One level's candidates and their aggregated branch statistics."""

    features: np.ndarray  # (A, k) global feature index
    thresholds: np.ndarray  # (A, k) float64
    valid: np.ndarray  # (A, k) bool: a usable candidate (FET: the node's global range is not a point)
    branch: np.ndarray | None  # (A, k, 2, S) float64: [..., 0, :] left (x <= t), [..., 1, :] right
    sizes: np.ndarray | None = None  # (A, k, 2) exact branch sizes, where the mode reveals them (LDP)
    counts: list[np.ndarray] | None = None
    """Exact modes, instead of `branch`: each contributor's checked integer counts (A, k, 2, S) (or their
    sum), whose sum is `branch`; added where they are read (`best_of_counts`, `stats`)."""

    def stats(self, nodes: np.ndarray | slice, candidates: np.ndarray | int) -> np.ndarray:
        """The aggregated statistics of the given (node, candidate) pairs: (..., 2, S) float64."""
        if self.counts is not None:
            return summed_counts(self.counts, nodes, candidates)
        assert self.branch is not None, "a level has its statistics as counts or as `branch`"
        return self.branch[nodes, candidates]


# -- random draws shared by every role -----------------------------------------------------------------
def tree_segments(act_tree: np.ndarray):
    """(tree, start, stop) of each run of equal tree ids in a non-decreasing tree array."""
    if len(act_tree) and np.any(np.diff(act_tree) < 0):
        raise ValueError("open nodes must be ordered by tree")
    bounds = np.flatnonzero(np.diff(act_tree, prepend=-1, append=-1))
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        yield int(act_tree[a]), int(a), int(b)


def draw_features(rng: np.random.Generator, n_nodes: int, n_features: int, k: int) -> np.ndarray:
    """`k` distinct features per node, in draw order (ranks of uniform keys): (n_nodes, k) int64."""
    return ranked_features(rng.random((n_nodes, n_features)), k)


def ranked_features(keys: np.ndarray, k: int) -> np.ndarray:
    """The `k` features of smallest key per row of (n_nodes, n_features) uniform keys: (n_nodes, k) int64.

    Row by row, so a level's trees' keys, drawn each from its own stream, are ranked in one call. In key
    order, equal keys by feature index: a stable argsort's first `k` columns, without sorting the rest.
    """
    keys = np.ascontiguousarray(keys, np.float64)
    if np.isnan(keys).any():
        raise ValueError("feature keys must not be NaN")
    return _smallest_keys(keys, min(k, keys.shape[1]))


@nb.njit(cache=True)
def _smallest_keys(keys: np.ndarray, k: int) -> np.ndarray:
    """`ranked_features`: per row one pass keeping the k smallest so far, in order (ties: the first stays)."""
    n, m = keys.shape
    out = np.empty((n, k), np.int64)
    if k == 0:
        return out
    best = np.empty(k)
    for i in range(n):
        held = 0
        for f in range(m):
            v = keys[i, f]
            if held == k and not v < best[k - 1]:
                continue  # not below the k-th smallest (an equal key came first and stays)
            pos = held if held < k else k - 1
            held = min(held + 1, k)
            while pos > 0 and v < best[pos - 1]:
                best[pos], out[i, pos] = best[pos - 1], out[i, pos - 1]
                pos -= 1
            best[pos], out[i, pos] = v, f
    return out


def fet_candidate_features(seed: int, act_tree: np.ndarray, depth: int, n_features: int,
                           k: int) -> np.ndarray:
    """FET: the master's candidate features of the open nodes.

    Drawn from stream(seed, fet_features, tree, depth).
    """
    keys = np.empty((len(act_tree), n_features))
    for tree, a, b in tree_segments(act_tree):
        stream(seed, "fet_features", tree, depth).random(out=keys[a:b])
    return ranked_features(keys, k)


def fet_threshold_uniforms(seed: int, act_tree: np.ndarray, depth: int, k: int) -> np.ndarray:
    """FET: uniforms in [0, 1) placing each candidate's threshold in its global [min, max]: (A, k)."""
    out = np.empty((len(act_tree), k), dtype=np.float64)
    for tree, a, b in tree_segments(act_tree):
        out[a:b] = stream(seed, "fet_thresholds", tree, depth).random((b - a, k))
    return out


# -- split choice --------------------------------------------------------------------------------------
def branch_counts(stats: np.ndarray, task: str) -> np.ndarray:
    """Sample count of statistics vectors (clamped at 0)."""
    if task == "regression":
        return np.maximum(stats[..., 0], 0.0)
    return np.maximum(stats, 0.0).sum(axis=-1)


def is_pure(stats: np.ndarray, task: str) -> np.ndarray:
    """Classification nodes with at most one class present.

    Regression purity is not observable: the statistics hold no sum of squares; such nodes stop because every
    split gains exactly 0.
    """
    if task == "regression":
        return np.zeros(stats.shape[:-1], dtype=bool)
    return (stats > 0).sum(axis=-1) <= 1




# -- the horizontal level strategy ----------------------------------------------------------------------
class BranchStatsLevels(LevelStrategy, ABC):
    """The level strategy of FET and PPD-ERT.

    The parties send (aggregable) branch statistics of k candidate splits per open node; the master picks the
    best. Subclasses implement the exchange (`_level`).
    """

    algorithm = EXTRA_TREES.id

    def __init__(self, transport: Transport, params: ExtraTreesParams, schema: HorizontalSchema,
                 progress: ProgressCallback | None = None, memory_budget: int | None = None) -> None:
        """A level strategy over `transport`; `memory_budget` bounds the master's share of a tree batch.

        `memory_budget` is in bytes (default: from `params.memory_budget_mb`, else a share of the available
        memory).
        """
        self.transport = transport
        self.memory_budget = memory_budget
        self.shared_budget: int | None = None  # the simulator: one budget for every role in this process
        self.party_rows: dict[str, int] = {}
        self.party_budgets: dict[str, int] = {}
        self.declared_rows: dict[str, int] | None = None  # a federation: each party's training rows at setup
        self.counts = CountLedger()  # the exact counts' checks (`fedcore/horizontal/counts.py`)
        self.params = params
        self.schema = schema
        self.progress = progress
        self.parties = list(transport.parties)
        self.k = params.n_candidate_features(schema.n_features)
        self.n_stats = schema.n_classes if params.task == "classification" else 2
        self.min_samples_leaf = params.min_samples_leaf  # a privacy mode may raise it (LDP: `leaf_floor`)
        self.forest: HorizontalForest | None = None
        self.ledgers: dict[str, dict] = {}  # DP modes: each party's privacy ledger, checked (`fit`)
        self.grower = LevelwiseGrower(self, params, progress)
        # the batch the parties checkpoint on the next batch's first request
        self._save_batch: int | None = None

    noise_follows_batches = False
    """Whether the parties' noise depends on how trees are batched (FET's DP modes: a party's noise is keyed
    by its count of answered queries). Then the batch plan comes from the configuration alone
    (`tree_batch_size`, or `memory_budget_mb` for every role, else one batch), never from the memory a
    machine happens to have free: the same seed gives the same model everywhere, and a resumed run cannot
    pair a query with noise an earlier attempt used for another."""

    @property
    def levels(self) -> int:
        """Levels with open nodes, over all batches (each one is 1 or 2 rounds)."""
        return self.grower.levels

    # -- hooks ------------------------------------------------------------------------------------
    @abstractmethod
    def setup(self) -> None:
        """The opening round(s): check the schema, agree scales or keys."""

    @abstractmethod
    def _level(self, trees: list[int], depth: int, act_tree: np.ndarray, act_node: np.ndarray,
               transition: dict[str, np.ndarray] | None) -> LevelResult:
        """Exchange one level: apply the previous level's decisions, return candidates and statistics."""

    def node_estimates(self, result: LevelResult) -> tuple[np.ndarray, np.ndarray]:
        """The open nodes' statistics (A, S) and sizes (A,).

        The parent's measurement of each node, or at the roots the union of candidate 0's two branches; sizes
        exact where the mode sends them (LDP: its estimated class counts only sum to them within rounding).
        """
        node_stats = (self._open_stats if self._open_stats is not None
                      else result.stats(slice(None), 0).sum(axis=1))
        if self._open_n is not None:
            n_node = self._open_n
        elif result.sizes is not None:
            n_node = result.sizes[:, 0].astype(np.float64).sum(axis=1)
        else:
            n_node = branch_counts(node_stats, self.params.task)
        return node_stats, n_node

    def node_values(self, stats: np.ndarray, parent_values: np.ndarray | None = None) -> np.ndarray:
        """Node values from statistics: class proportions (uniform when empty), or the mean (override).

        `parent_values` (the values of each node's parent; None at the roots) lets a noisy mode shrink towards
        them; exact statistics ignore them.
        """
        values = np.maximum(stats, 0.0)
        total = values.sum(axis=-1, keepdims=True)
        some = total > 0
        np.divide(values, total, out=values, where=some)  # in place: a leaf level's are nodes x classes
        values[np.broadcast_to(~some, values.shape)] = 1.0 / values.shape[-1]
        return values

    def _new_batch(self, header: dict) -> dict:
        """Mark a batch's first request: the parties reset, and checkpoint the batch before when asked."""
        header["new_batch"] = True
        if self._save_batch is not None:
            header["save_batch"] = self._save_batch
            self._save_batch = None
        return header

    def _note_parties(self, replies: dict[str, Message]) -> None:
        """Each party's rows and memory budget, from its hello reply (the batch plan; the count checks).

        The rows must be a count, and in a federation (`declared_rows`) the training rows the party declared
        at setup.
        """
        self.party_rows = {}
        for name, reply in replies.items():
            rows = reply.header.get("n_rows")
            if isinstance(rows, (bool, np.bool_)) or not isinstance(rows, (int, np.integer)) or rows < 0:
                raise ProtocolError(f"party {name!r} declared {rows!r} rows in hello; a row count is an "
                                    "integer >= 0")
            check_declared_rows(name, int(rows), self.declared_rows)
            self.party_rows[name] = int(rows)
        self.party_budgets = reported_budgets(replies)

    def memory_costs(self) -> list[tuple[int, int]]:
        """(bytes per tree of a batch, budget) of every party and of the master (`fedcore.trees.budget`).

        A party's row partition, and the master's per-level candidates and branch statistics (one array per
        party's reply, their sum, and the gains), over at most min(2^depth, rows / 2 min_samples_leaf) open
        nodes per tree, plus what a party keeps per open node (`party_bytes_per_node`, PPD-ERT's boxes). A
        party that reported no budget is planned with the master's.
        """
        node_bound = sum(self.party_rows.values()) // (2 * self.min_samples_leaf)
        return batch_costs("horizontal", self.params, self.party_rows, self.party_budgets,
                           node_bound=node_bound, master_bytes_per_node=self.master_bytes_per_node(),
                           party_bytes_per_node=self.party_bytes_per_node(), own_budget=self.memory_budget)

    def master_bytes_per_node(self) -> int:
        """The master's bytes per open node of a level.

        Candidates' branch statistics, one array per party's reply, their sum, and the gains.
        """
        return self.k * 2 * self.n_stats * 8 * (len(self.parties) + 3)

    def party_bytes_per_node(self) -> int:
        """A party's bytes per open node of a level, besides its rows' share (none by default)."""
        return 0

    # -- driver -----------------------------------------------------------------------------------
    def fit(self, checkpoints: CheckpointStore | None = None, resume_from: int = 0) -> HorizontalForest:
        """Grow every tree (`LevelwiseGrower`) and send the complete forest to every party.

        With `checkpoints`, every completed batch is saved (the parties save theirs when the next request
        says so), and batches before `resume_from` are loaded instead of grown: the parties must have
        restored their state first (`HorizontalSession.train` arranges both).
        """
        self.setup()
        p = self.params  # after setup: FET-GDP's plan may choose the depth from the noisy row count
        # the worst-case model must fit where it is held, before any tree grows (the simulator holds every
        # party's copy too)
        check_model_fits(p, sum(self.party_rows.values()), available_bytes(),
                         n_outputs=self.schema.n_classes if p.task == "classification" else 1,
                         colocated_parties=len(self.parties) if self.shared_budget is not None else 0)
        self._stopping = StoppingRules.of(p, self.min_samples_leaf)
        if self.noise_follows_batches:  # the plan must come from the configuration alone, not the machine
            if p.memory_budget_mb is not None:
                budget = resolve_budget(p.memory_budget_mb)
                self.grower.plan([(cost, budget) for cost, _ in self.memory_costs()])
        else:
            self.grower.plan(self.memory_costs(), self.shared_budget)
        records, save_batch = self.grower.grow(checkpoints, resume_from)
        self.forest = HorizontalForest.from_arrays(records, n_trees=p.n_estimators, task=p.task,
                                                   algorithm=self.algorithm, schema=self.schema)
        f = self.forest
        header = {"n_trees": f.n_trees, "task": f.task, "algorithm": f.algorithm}
        if save_batch is not None:
            header["save_batch"] = save_batch
        acks = self.transport.exchange(dict.fromkeys(self.parties, Message("model", header, f.arrays())))
        self.ledgers = check_ledgers(acks, self.agreed_ledger())
        return self.forest

    def agreed_ledger(self) -> AgreedLedger | None:
        """What each party's privacy ledger must state with the model (`fedcore.horizontal.ledgers`).

        None by default: without differential privacy a party states no ledger.
        """
        return None

    # -- the level strategy -----------------------------------------------------------------------
    def open_batch(self, trees: list[int], save_batch: int | None) -> None:
        """The batch's first request will say `new_batch` (and `save_batch`); roots have no statistics yet."""
        self._save_batch = save_batch
        self._transition: dict[str, np.ndarray] | None = None
        self._open_stats: np.ndarray | None = None
        self._open_n: np.ndarray | None = None
        self._open_parent_values: np.ndarray | None = None
        self.counts.open_batch()

    def level(self, trees: list[int], depth: int, open_tree: np.ndarray, open_node: np.ndarray) -> Level:
        """The best usable candidate of each open node, and which children of the splits stay open.

        Usable: both sides >= min_samples_leaf, gain above the rounding guard.
        """
        p, task = self.params, self.params.task
        result = self._level(trees, depth, open_tree, open_node, self._transition)
        node_stats, n_node = self.node_estimates(result)
        rules = self._stopping
        criterion = CRITERION_CODES[p.criterion]
        if result.counts is not None:  # exact counts: added as they are read
            best, branch_n = best_of_counts(result.counts, result.valid, criterion, rules.min_samples_leaf)
        else:
            sizes = result.sizes if result.sizes is not None else np.zeros((0, 0, 2))
            best, branch_n = best_candidates(np.ascontiguousarray(result.branch, dtype=np.float64),
                                             np.ascontiguousarray(sizes, dtype=np.float64), result.valid,
                                             criterion, float(rules.min_samples_leaf),
                                             result.sizes is not None)
        split = (best >= 0) & (n_node >= rules.min_samples_split)
        split_idx = np.flatnonzero(split)
        split_best = best[split_idx]
        feature = np.full(len(open_tree), -1, dtype=np.int32)
        threshold = np.full(len(open_tree), np.nan)
        feature[split_idx] = result.features[split_idx, split_best]
        threshold[split_idx] = result.thresholds[split_idx, split_best]
        values = self.node_values(node_stats, self._open_parent_values)
        fields = {"feature": feature, "threshold": threshold, "weight": n_node, "value": values}
        child_stats = result.stats(split_idx, split_best).reshape(-1, self.n_stats)  # left, right, left, ...
        child_n = branch_n[split_idx, split_best].reshape(-1)
        child_open = rules.child_may_open(child_n, depth + 1) & ~is_pure(child_stats, task)
        closed = ~child_open  # leaves are recorded now; open children at their own level
        n_closed = int(closed.sum())
        child_parent_values = np.repeat(values[split_idx], 2, axis=0)
        child_fields = {"feature": np.full(n_closed, -1, np.int32), "threshold": np.full(n_closed, np.nan),
                        "weight": child_n[closed],
                        "value": self.node_values(child_stats[closed], child_parent_values[closed])}
        self._children = (best, child_stats, child_n, child_parent_values)
        return Level(split, fields, child_open, child_fields)

    def advance(self, level: Level, split_idx: np.ndarray, left: np.ndarray, child_open: np.ndarray,
                next_pos: np.ndarray) -> None:
        """The next level's request carries each node's chosen candidate and its children's positions."""
        best, child_stats, child_n, child_parent_values = self._children
        chosen = np.full(len(level.split), -1, dtype=np.int32)
        chosen[split_idx] = best[split_idx]
        self._transition = {"chosen": chosen, "next_pos": next_pos}
        self._open_stats = child_stats[child_open]
        self._open_n = child_n[child_open]
        self._open_parent_values = child_parent_values[child_open]
        self.counts.advance(split_idx, best, child_open)


def check_declared_rows(name: str, rows: int, declared: dict[str, int] | None) -> None:
    """Refuse a hello's row count other than the training rows the party declared at setup (a federation)."""
    if declared is not None and rows != declared.get(name):
        raise ProtocolError(f"party {name!r} declared {rows} rows in hello, but {declared.get(name)} "
                            "training rows at setup")
