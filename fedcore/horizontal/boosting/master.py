"""The master's role in horizontal boosting: a level strategy of the one grower on summed histograms.

Per level it asks every party for its per node, feature and bin sums of (count, g, h) in fixed point, which
arrive masked (`fedcore.horizontal.ppdert.rounds`), so only their sum over the parties is ever read; it
scans them with the shared criterion (`splits.py`) and decides splits, leaves and leaf weights as the
vertical boosting master does (`BoostingParams`: gamma, min_child_weight, -G / (H + lambda) times the
learning rate). A round is a tree batch (K trees under softmax); its first request carries the finished
trees of the round before (`batch_done`), which every party routes its rows through to update its margins.
"""

from __future__ import annotations

import hashlib

import numpy as np

from fedcore.algorithms import HORIZONTAL_BOOSTING
from fedcore.checkpoints import CheckpointStore
from fedcore.errors import ArtifactError, ProtocolError
from fedcore.horizontal.boosting.bins import AgreedBins
from fedcore.horizontal.boosting.fixedpoint import RING_BITS, dequantise
from fedcore.horizontal.boosting.splits import best_bins
from fedcore.horizontal.counts import SUM_OF_PARTIES
from fedcore.horizontal.growth import check_declared_rows, draw_features
from fedcore.horizontal.model import HorizontalForest
from fedcore.horizontal.ppdert.agreed import domain_fingerprint
from fedcore.horizontal.ppdert.rounds import MaskedRounds
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.progress import ProgressCallback
from fedcore.protocol.messages import Message
from fedcore.randomness import stream
from fedcore.transport.base import Transport
from fedcore.trees.boosting import BoostingParams
from fedcore.trees.combination import TreeCombination
from fedcore.trees.grower import Level, LevelStrategy, LevelwiseGrower, StoppingRules
from fedcore.trees.losses import SQUARED_ERROR_LOSS, class_base_score, loss_for

REPLIES = ("boost_masked", "boost_plain", "sums")
"""(masked reply kind, plain reply kind, the plain reply's array) of every summed round."""
TREE_FIELDS = ("tree", "node", "left", "right", "depth", "feature", "threshold", "weight", "value")
"""The node arrays of a finished round the next round's first request carries."""


class HorizontalBoostingMaster(LevelStrategy):
    """Coordinates one horizontal boosting training over a transport (see the module doc)."""

    algorithm = HORIZONTAL_BOOSTING.id

    def __init__(self, transport: Transport, params: BoostingParams, schema: HorizontalSchema, *,
                 low: np.ndarray, high: np.ndarray, secure: bool = True, session_id: bytes | None = None,
                 progress: ProgressCallback | None = None) -> None:
        """Boosting over the parties' declared domains (`low`, `high`): `params.n_estimators` rounds.

        `secure=False` sums plain per-party histograms: a baseline for what the masks cost, not a privacy
        mode.
        """
        self.transport = transport
        self.schema = schema
        self.loss = loss_for(params.task, schema.n_classes)
        self.n_outputs = self.loss.n_outputs(schema.n_classes)
        self.params = params.growth(self.n_outputs)
        self.rounds_count = params.n_estimators
        self.progress = progress
        self.parties = list(transport.parties)
        self.low, self.high = np.asarray(low, np.float64), np.asarray(high, np.float64)
        self.bins = AgreedBins.of(schema, self.low, self.high, params.max_bins)
        self.secure = bool(secure)
        if session_id is None:
            session_id = hashlib.sha256(f"fedforest-boosting|{params.random_state}|{'|'.join(self.parties)}"
                                        .encode()).digest()[:16]
        self.session_id = session_id
        self.rounds = MaskedRounds(transport, self.secure)
        self.mask_bits = RING_BITS
        self.grower = LevelwiseGrower(self, self.params, progress)
        self.shared_budget: int | None = None  # the simulator's (one process); histograms are small
        self.party_rows: dict[str, int] = {}
        self.declared_rows: dict[str, int] | None = None  # a federation: each party's training rows at setup
        self.ledgers: dict[str, dict] = {}  # no differential privacy: no party states a ledger
        self.base_score = np.zeros(self.n_outputs)
        self.forest: HorizontalForest | None = None
        self._stopping = StoppingRules.of(self.params)
        self._finished: dict[str, np.ndarray] | None = None  # the last finished round's node records
        self._save_batch: int | None = None  # the round the parties checkpoint with the next first request
        self._transition: dict[str, np.ndarray] | None = None
        self._open: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._derive: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # histogram subtraction
        self._level_counts = np.zeros((0, 0, 0, 3), np.int64)  # the last level's summed histograms
        self.total_gain = np.zeros(schema.n_features)  # per feature, the gains of the splits chosen on it

    def importances(self) -> np.ndarray:
        """Gain importances over the schema's features, summing to 1 (zeros before any split).

        Each feature's total split gain (XGBoost's `total_gain`) as a share of all: from the summed
        histograms the master chose splits by, so the same for 1, 2 or 3 parties.
        """
        total = float(self.total_gain.sum())
        return self.total_gain / total if total > 0 else np.zeros_like(self.total_gain)

    @property
    def levels(self) -> int:
        """Levels with open nodes, over all rounds (one masked round each)."""
        return self.grower.levels

    # -- driver -------------------------------------------------------------------------------------
    def fit(self, checkpoints: CheckpointStore | None = None, resume_from: int = 0) -> HorizontalForest:
        """Greet the parties, sum the base score's statistics, grow every round, send the model.

        With `checkpoints`, every completed round is saved (the parties save theirs, their margins, when the
        next request says so) and rounds before `resume_from` are loaded instead of grown: the parties must
        have restored their margins first (`HorizontalBoostingSession` arranges both).
        """
        self.setup()
        self.base_score = self._base_score()
        records, save_batch = self.grower.grow(checkpoints, resume_from)
        p = self.params
        combination = TreeCombination("sum", tuple(float(v) for v in self.base_score), self.loss.link)
        self.forest = HorizontalForest.from_arrays(records, n_trees=p.n_estimators, task=p.task,
                                                   algorithm=self.algorithm, schema=self.schema,
                                                   combination=combination)
        f = self.forest
        header = {"n_trees": f.n_trees, "task": f.task, "algorithm": f.algorithm,
                  "base_score": combination.base_score, "link": combination.link}
        if save_batch is not None:
            header["save_batch"] = save_batch
        self.transport.exchange(dict.fromkeys(self.parties, Message("model", header, f.arrays())))
        return f

    def setup(self) -> None:
        """Hello: the algorithm, schema, domains, bins and loss every party must agree; the signed keys."""
        p = self.params
        header = {"algorithm": self.algorithm, "schema": self.schema.fingerprint(),
                  "domains": domain_fingerprint(self.low, self.high), "bins": self.bins.fingerprint(),
                  "n_parties": len(self.parties), "session_id": self.session_id.hex(), "secure": self.secure,
                  "loss": self.loss.name, "n_outputs": self.n_outputs,
                  "learning_rate": float(p.learning_rate), "reg_lambda": float(p.reg_lambda)}
        replies = self.transport.exchange({name: Message("hello", header) for name in self.parties})
        for name, reply in replies.items():
            rows = reply.header.get("n_rows")
            if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1:
                raise ProtocolError(f"party {name!r} declared {rows!r} rows in hello; every party needs at "
                                    "least one row")
            check_declared_rows(name, int(rows), self.declared_rows)
            self.party_rows[name] = int(rows)
        self.rounds.collect_keys(replies)

    def _base_score(self) -> np.ndarray:
        """The margins every row starts from, from the summed label statistics (relays the keys)."""
        header: dict = {}
        arrays: dict = {}
        self.rounds.relay_keys(header, arrays)
        sums, _ = self.rounds.exchange("boost_base", header, arrays, self.mask_bits, REPLIES)
        total = sum(self.party_rows.values())
        if self.loss is SQUARED_ERROR_LOSS:
            if sums.size != 2 or int(sums[0]) != total:
                raise ProtocolError(f"{SUM_OF_PARTIES}: the label sums must be (rows, sum) over the "
                                    f"{total} declared rows")
            return np.array([float(dequantise(sums.reshape(1, 2))[0, 1]) / total])
        if sums.size != max(self.schema.n_classes, 2) or sums.min() < 0 or int(sums.sum()) != total:
            raise ProtocolError(f"{SUM_OF_PARTIES}: the class counts must be {max(self.schema.n_classes, 2)} "
                                f"counts adding up to the {total} declared rows")
        return class_base_score(self.loss, sums, self.schema.n_classes)

    # -- the level strategy -------------------------------------------------------------------------
    def open_batch(self, trees: list[int], save_batch: int | None) -> None:
        """A round starts: its first request carries the round before's trees."""
        self._transition = None
        self._derive = None
        k = self.params.n_candidate_features(self.schema.n_features)
        allowed = np.zeros((len(trees), self.schema.n_features), dtype=bool)
        for slot, tree in enumerate(trees):  # colsample_bytree: the tree's features, from the shared seed
            allowed[slot, draw_features(stream(self.params.random_state, "tree_features", tree), 1,
                                        self.schema.n_features, k)[0]] = True
        self._allowed = allowed
        self._first_tree = trees[0]
        self._save_batch = save_batch

    def batch_done(self, records: dict[str, np.ndarray]) -> None:
        """Keep the finished round: the next round's first request carries it."""
        self._finished = {name: records[name] for name in TREE_FIELDS}

    def batch_state(self) -> dict[str, np.ndarray]:
        """The split gains so far (the importances), checkpointed with every round."""
        return {"total_gain": self.total_gain.copy()}

    def restore_batch_state(self, state: dict[str, np.ndarray]) -> None:
        """The split gains of the rounds loaded from checkpoints: a resumed run's importances are the same."""
        gains = np.asarray(state.get("total_gain", ()), np.float64)
        if gains.shape != self.total_gain.shape:
            raise ArtifactError(f"a checkpointed round holds {gains.shape} split gains for the "
                                f"{len(self.total_gain)} features: it belongs to another run")
        self.total_gain = gains.copy()

    def level(self, trees: list[int], depth: int, open_tree: np.ndarray, open_node: np.ndarray) -> Level:
        """Sum the open nodes' histograms over the parties; split where the gain beats gamma."""
        p, rules = self.params, self._stopping
        header: dict = {"depth": depth, "n_trees": len(trees)}
        arrays: dict = {"tree": open_tree.astype(np.int32)}
        if self._transition is None:
            header.update(new_batch=True, base_score=[float(v) for v in self.base_score])
            if self._save_batch is not None:  # the parties checkpoint the round before, then go on
                header["save_batch"] = self._save_batch
            if self._finished is not None:
                arrays.update({f"round_{name}": a for name, a in self._finished.items()})
        else:
            arrays.update(self._transition)
        sums, _ = self.rounds.exchange("boost_level", header, arrays, self.mask_bits, REPLIES)
        counts = self._histograms(sums, len(open_tree))
        node = counts[:, 0].sum(axis=1)  # (A, 3): every feature's histogram holds each row once
        if np.any(counts.sum(axis=2) != node[:, None, :]) or np.any(counts[..., 0] < 0) \
                or int(node[:, 0].sum()) > len(trees) * sum(self.party_rows.values()):
            raise ProtocolError(f"{SUM_OF_PARTIES}: the summed histograms are not those of the declared "
                                "rows (a feature's bins must add up to the node, counts >= 0)")
        hist = dequantise(counts)
        totals = dequantise(node)
        slots = open_tree.astype(np.int64) - self._first_tree
        gain, feature, cut = best_bins(np.ascontiguousarray(hist), np.ascontiguousarray(totals),
                                       self.bins.n_bins, self._allowed[slots], float(p.reg_lambda),
                                       float(p.min_leaf_weight))
        weight = totals[:, 0]
        split = (rules.may_split(depth) & (feature >= 0) & (weight >= rules.min_samples_split)
                 & rules.improves(gain, weight) & (gain >= p.least_gain(weight)))
        split_idx = np.flatnonzero(split)
        f_split, b_split = feature[split_idx], cut[split_idx]
        np.add.at(self.total_gain, f_split, gain[split_idx])  # in node order: the same sums for any parties
        threshold = np.full(len(open_tree), np.nan)
        threshold[split_idx] = self.bins.thresholds(f_split, b_split)
        # the right child's statistics exactly: the integer sums, subtracted before scaling
        left_int = np.cumsum(counts[split_idx, f_split], axis=1)[np.arange(len(split_idx)), b_split]
        child_stats = dequantise(np.stack([left_int, node[split_idx] - left_int], axis=1).reshape(-1, 3))
        child_n = child_stats[:, 0]
        child_open = rules.child_may_open(child_n, depth + 1)
        closed = ~child_open
        fields = {"feature": np.where(split, feature, -1).astype(np.int32), "threshold": threshold,
                  "weight": weight, "value": p.node_values(totals)}
        child_fields = {"feature": np.full(int(closed.sum()), -1, np.int32),
                        "threshold": np.full(int(closed.sum()), np.nan), "weight": child_n[closed],
                        "value": p.node_values(child_stats[closed])}
        self._open = (split, feature, cut, child_n)
        self._level_counts = counts
        return Level(split, fields, child_open, child_fields)

    def _histograms(self, sums: np.ndarray, n_open: int) -> np.ndarray:
        """The open nodes' summed histograms, (A, F, width, 3) int64.

        Those the parties sent, and the rest as their parent's minus their sibling's (histogram subtraction:
        exact in integers).
        """
        shape = (n_open, self.schema.n_features, self.bins.width, 3)
        computed = np.ones(n_open, bool) if self._derive is None else self._derive[0]
        sent = (int(computed.sum()), *shape[1:])
        if sums.size != int(np.prod(sent)):
            raise ProtocolError(f"aggregated histograms have {sums.size} entries, expected {sent}")
        counts = np.empty(shape, np.int64)
        counts[computed] = sums.reshape(sent)
        if self._derive is not None:
            _, parent, sibling = self._derive
            derived = ~computed
            counts[derived] = self._level_counts[parent[derived]] - counts[sibling[derived]]
        return counts

    def advance(self, level: Level, split_idx: np.ndarray, left: np.ndarray, child_open: np.ndarray,
                next_pos: np.ndarray) -> None:
        """The next level's request: each split's feature and bin, its children's positions, what to sum.

        Of two open siblings the parties sum only the one with fewer rows; the master subtracts it from
        their parent for the other.
        """
        assert self._open is not None, "level() runs before advance()"
        split, feature, cut, child_n = self._open
        n_next = int(child_open.sum())
        computed = np.ones(n_next, bool)
        parent = np.zeros(n_next, np.int64)
        sibling = np.zeros(n_next, np.int64)
        pairs, sizes = next_pos.reshape(-1, 2), child_n.reshape(-1, 2)
        both = (pairs >= 0).all(axis=1)
        right_smaller = sizes[both, 1] < sizes[both, 0]
        derived = np.where(right_smaller, pairs[both, 0], pairs[both, 1])
        computed[derived] = False
        sibling[derived] = np.where(right_smaller, pairs[both, 1], pairs[both, 0])
        parent[derived] = split_idx[both]
        self._derive = (computed, parent, sibling)
        self._transition = {"split_feature": np.where(split, feature, -1).astype(np.int32),
                            "split_bin": np.where(split, cut, -1).astype(np.int32),
                            "next_pos": next_pos, "compute": computed.astype(np.uint8)}
