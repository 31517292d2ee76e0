"""The master role in vertical Federated Forest.

Holds no data; samples rows and features from seeds, picks the best of the parties' local splits per node,
relays partition bitmaps, stores the structure and leaf values, and combines prediction answers.

Every exchange covers all open nodes of one level of every tree in the batch, so the number of round
trips grows with depth (two per level; three with encrypted labels, see
`fedcore/vertical/encrypted.py`), never with nodes or rows.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedcore.checkpoints import CheckpointStore
from fedcore.errors import LabelHolderError, PartyShapeError, ProtocolError
from fedcore.privacy.schemes import ENCRYPTED_MODES
from fedcore.progress import ProgressCallback
from fedcore.protocol.messages import Message, unpack_bits
from fedcore.randomness import stream
from fedcore.transport.base import Transport
from fedcore.trees.budget import available_bytes, batch_costs, reported_budgets
from fedcore.trees.combination import MEAN, TreeCombination
from fedcore.trees.criteria import CRITERIA, node_count
from fedcore.trees.grower import Level, LevelStrategy, LevelwiseGrower, StoppingRules
from fedcore.trees.losses import loss_for
from fedcore.trees.params import ForestParams, check_model_fits
from fedcore.trees.predictor import route_by_split_sets
from fedcore.trees.structure import NO_CHILD, ForestStructure, first_trees
from fedcore.vertical.importances import SplitShares

MASTER_BYTES_PER_NODE = 256
"""The master's growth state per open node of a level: candidates, the parties' gains and ranks, the label
holder's statistics and the node records."""
ONE_ROUND_MAX_LEAVES = 250_000
"""Above this many leaves, "auto" prediction routes node by node (see predict_values)."""
SPLIT_SET_BUDGET_BYTES = 128 * 2**20
"""Upper bound on one party's split-set message: the one-round row batch shrinks to stay below it."""



@dataclass
class FederationInfo:
    """What the master learns at setup: party names and roles, row count, opaque feature ids."""

    parties: list[str]
    label_holder: str
    n_rows: int
    n_classes: int
    feature_ids: list[str]  # sorted: global feature index -> opaque id
    feature_owner: np.ndarray  # global feature index -> party index
    memory_budgets: dict[str, int] | None = None  # bytes each party grows tree batches in (its report)


class VerticalMaster(LevelStrategy):
    """Coordinates training and prediction of one vertical federated forest over a transport.

    Grows it as the vertical level strategy (plain or encrypted labels) of `LevelwiseGrower`.
    """

    def __init__(self, transport: Transport, params: ForestParams, progress: ProgressCallback | None = None,
                 memory_budget: int | None = None) -> None:
        """A vertical master over `transport`; `memory_budget` bounds its own share of a tree batch.

        `memory_budget` is in bytes (default: from `params.memory_budget_mb`, else a share of the available
        memory).
        """
        self.transport = transport
        self.memory_budget = memory_budget
        self.shared_budget: int | None = None  # the simulator: one budget for every role in this process
        self.params = params
        self.progress = progress
        self.info: FederationInfo | None = None
        self.grower: LevelwiseGrower | None = None  # the last fit's (its batch plan)
        self.structure: ForestStructure | None = None
        self.split_shares: SplitShares | None = None  # each split's share of its tree's importance
        self._gains: np.ndarray | None = None  # boosting: each node's chosen split gain (for keep_trees)
        self.combination: TreeCombination = MEAN  # how the trees combine (boosting: set at setup)
        self._growth: tuple[int, ForestParams] | None = None  # (trees per round, growth_params)

    @property
    def federation(self) -> FederationInfo:
        """The parties, label holder and features that `setup` found; ProtocolError before it."""
        if self.info is None:
            raise ProtocolError("the master has not set up the federation")
        return self.info

    @property
    def trained_structure(self) -> ForestStructure:
        """The structure of the trained (or loaded) forest; ProtocolError before it."""
        if self.structure is None:
            raise ProtocolError("the master has no trained forest")
        return self.structure

    # -- setup ----------------------------------------------------------------------------------
    def setup(self) -> FederationInfo:
        """Ask every party to bin its data and name its features.

        Share the encoded labels (with encrypted labels, relay their ciphertexts and the parties' signed
        sealing keys instead).
        """
        p = self.params
        parties = self.transport.parties
        boosting = p.setup_fields()
        header = self._setup_header(boosting)
        replies = self.transport.exchange({name: Message("setup", header) for name in parties})
        rows = {name: int(r.header["n_rows"]) for name, r in replies.items()}
        if len(set(rows.values())) != 1:
            raise PartyShapeError(f"parties hold different numbers of aligned rows: {rows}")
        holders = [name for name, r in replies.items() if r.header["label_holder"]]
        if len(holders) != 1:
            raise LabelHolderError(f"exactly one party must hold the label, found {len(holders)}: {holders}")
        holder = holders[0]
        ids, owner = [], []
        for index, name in enumerate(parties):
            party_ids = [str(x) for x in replies[name].arrays["feature_ids"]]
            ids.extend(party_ids)
            owner.extend([index] * len(party_ids))
        if len(set(ids)) != len(ids):
            raise ProtocolError("two features share an opaque id: column names must be unique across parties")
        order = np.argsort(np.array(ids, dtype=object), kind="stable")
        self.info = FederationInfo(
            parties=parties, label_holder=holder, n_rows=rows[holder],
            n_classes=int(replies[holder].header["n_classes"]),
            feature_ids=[ids[i] for i in order], feature_owner=np.array(owner, dtype=np.int64)[order],
            memory_budgets=reported_budgets(replies),
        )
        if boosting is not None:
            self.combination = self._boosting_combination(replies[holder])
        position = {fid: g for g, fid in enumerate(self.info.feature_ids)}
        label_header = {"max_weight": p.n_draws(self.info.n_rows) or self.info.n_rows}
        labels = self.transport.exchange({holder: Message("export_labels", label_header)})[holder]
        requests = {}
        for name in parties:
            header = {"n_features": len(ids), "n_classes": self.info.n_classes}
            feature_ids = replies[name].arrays["feature_ids"]
            arrays = {"global_index": np.array([position[str(x)] for x in feature_ids], np.int64)}
            if p.privacy in ENCRYPTED_MODES:
                _relay_encrypted_setup(name, holder, parties, replies, labels, header, arrays)
            elif name != holder and boosting is None:  # boosting: the rounds' (g, h) instead, at begin_batch
                arrays["y"] = labels.arrays["y"]
            requests[name] = Message("configure", header, arrays)
        self.transport.exchange(requests)
        return self.info

    def _setup_header(self, boosting: dict | None) -> dict:
        """What every party is told at setup: binning, criterion, privacy (and its session), boosting."""
        p = self.params
        header = {"max_bins": p.max_bins, "binning_seed": p.random_state, "criterion": p.criterion_code,
                  "privacy": p.privacy}
        if p.privacy in ENCRYPTED_MODES:
            header.update(session_context=secrets.token_hex(16), key_bits=p.key_bits)
        if boosting is not None:
            header["boosting"] = boosting
        return header

    def _boosting_combination(self, holder_reply: Message) -> TreeCombination:
        """Boosting: the label holder's base score, which the trees add to, and its loss's link."""
        n_classes = self.federation.n_classes
        base = np.asarray(holder_reply.arrays["base_score"], np.float64)
        loss = loss_for(self.params.task, n_classes)
        if base.shape != (loss.n_outputs(n_classes),) or not np.all(np.isfinite(base)):
            raise ProtocolError(f"the label holder's base score has shape {base.shape}, expected one finite "
                                "margin per output")
        return TreeCombination("sum", tuple(base.tolist()), loss.link)

    # -- training: the vertical level strategy of the one grower (fedcore/trees/grower.py) -----------
    def batches(self) -> list[list[int]]:
        """The tree batches, in growth order (as planned by the last fit, else as planned now)."""
        return (self.grower or self._grower()).batches()

    @property
    def growth_params(self) -> ForestParams:
        """The parameters the grower runs (boosting: each round's trees, a round a batch, once K is known)."""
        k = self.combination.trees_per_round
        if self._growth is None or self._growth[0] != k:
            self._growth = (k, self.params.growth(k))
        return self._growth[1]

    def _grower(self) -> LevelwiseGrower:
        """The grower, its batches planned from the parties' memory budgets (known after setup)."""
        grower = LevelwiseGrower(self, self.growth_params, self.progress)
        if self.info is not None:
            grower.plan(self.memory_costs(), self.shared_budget)
        return grower

    def memory_costs(self) -> list[tuple[int, int]]:
        """(bytes per tree of a batch, budget) of every party and of the master (`fedcore.trees.budget`).

        A party that reported no budget is planned with the master's.
        """
        p, info = self.growth_params, self.federation
        return batch_costs("vertical", p, dict.fromkeys(info.parties, info.n_rows), info.memory_budgets or {},
                           node_bound=info.n_rows // p.min_samples_leaf,
                           master_bytes_per_node=MASTER_BYTES_PER_NODE, own_budget=self.memory_budget)

    def fit(self, checkpoints: CheckpointStore | None = None, resume_from: int = 0) -> ForestStructure:
        """Grow all trees, batch by batch, and hand every party the structure it needs to predict.

        With `checkpoints`, every completed batch is saved (the parties save theirs when told in the next
        request), and batches before `resume_from` are loaded instead of grown: the parties must have
        restored theirs (`VerticalSession.train` arranges both).
        """
        info = self.info if self.info is not None else self.setup()
        p = self.growth_params
        # the worst-case model must fit where it is held, before any tree grows (the simulator holds every
        # party's copy too)
        check_model_fits(p, info.n_rows, available_bytes(),
                         n_outputs=max(1, info.n_classes) if p.task == "classification" else 1,
                         colocated_parties=len(info.parties) if self.shared_budget is not None else 0)
        self._stopping = StoppingRules.of(p)
        self.grower = self._grower()
        records, save_batch = self.grower.grow(checkpoints, resume_from)
        self.structure = ForestStructure(**{f: records[f] for f in STRUCTURE_ARRAYS}, n_trees=p.n_estimators)
        s = self.structure
        header: dict = {"n_trees": s.n_trees}
        if save_batch is not None:
            header["save_batch"] = save_batch
        arrays = {"tree": s.tree, "node": s.node, "left": s.left, "right": s.right}
        self._gains = records.get("gain")
        self.split_shares = SplitShares.of(s, p.criterion, self._gains)
        if self.split_shares is None:
            self.transport.exchange(dict.fromkeys(info.parties, Message("finalize", header, arrays)))
            return self.structure
        # each party also gets the importance shares of its own splits, and of no other's
        header["splitting_trees"] = self.split_shares.splitting_trees
        self.transport.exchange({name: Message("finalize", header,
                                               {**arrays, "importance": self.split_shares.own(i)})
                                 for i, name in enumerate(info.parties)})
        return self.structure

    def party_importance_shares(self) -> dict[str, float]:
        """Each party's share of the model's importances (empty before training).

        Over the trees kept, as the parties' own importances (`keep_trees` makes both anew).
        """
        if self.structure is None or self.split_shares is None:
            return {}
        return self.split_shares.per_party(self.federation.parties)

    def _sample_features(self, open_tree: np.ndarray, depth: int) -> np.ndarray:
        """Candidate global feature indices per open node, sorted ascending: (n_open, k)."""
        p, n_features = self.growth_params, len(self.federation.feature_ids)
        k = p.n_candidate_features(n_features)
        out = np.empty((len(open_tree), k), dtype=np.int64)
        bounds = np.flatnonzero(np.diff(open_tree, prepend=-1, append=-1))
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            tree = int(open_tree[a])
            if p.feature_sampling == "tree":  # drawn at the tree's first level, kept for its batch
                chosen = self._tree_features.get(tree)
                if chosen is None:
                    rng = stream(p.random_state, "tree_features", tree)
                    chosen = self._tree_features[tree] = np.sort(rng.permutation(n_features)[:k])
                out[a:b] = chosen
            else:
                rng = stream(p.random_state, "features", tree, depth)
                out[a:b] = sample_rows_without_replacement(rng, b - a, n_features, k)
        return out

    def open_batch(self, trees: list[int], save_batch: int | None) -> None:
        """A batch starts; its `begin_batch` goes with its first level's request (`level`, depth 0).

        `save_batch`: the parties checkpoint the batch before as they begin this one.
        """
        header = {"trees": trees, "seed": self.params.random_state,
                  "n_draws": self.params.n_draws(self.federation.n_rows)}
        if save_batch is not None:
            header["save_batch"] = save_batch  # parties checkpoint the batch they just finished
        self._batch_header: dict | None = header
        self._tree_features: dict[int, np.ndarray] = {}  # feature_sampling "tree": each tree's candidates
        self._first_tree = trees[0]
        self._root_weight = np.zeros(len(trees))
        self._previous: dict[str, np.ndarray] | None = None
        self._blobs: dict[int, np.ndarray] = {}

    def level(self, trees: list[int], depth: int, open_tree: np.ndarray, open_node: np.ndarray) -> Level:
        """Every party proposes its best split per open node (on its sampled candidate features).

        The best over parties wins, ties to the lowest candidate rank. The label holder's statistics give the
        nodes' weights and values. A batch's first level is its `begin_batch` (every party draws the batch's
        rows; boosting: the label holder first, whose round (g, h) the others' carry). A level where no node
        may split (the depth limit) asks the label holder alone, whose statistics are all it needs (plain
        modes; with encrypted labels every party still answers, as the label holder's scoring step expects).
        """
        p, info = self.growth_params, self.federation
        parties = info.parties
        n_open = len(open_tree)
        can_split = self._stopping.may_split(depth)
        candidates = self._sample_features(open_tree, depth) if can_split else np.empty((n_open, 0), np.int64)
        encrypted = self.params.privacy in ENCRYPTED_MODES
        asked = parties if can_split or encrypted or self._batch_header is not None else [info.label_holder]
        requests = self._level_requests(asked, candidates)
        if self._batch_header is None:
            replies = self.transport.exchange(requests)
        else:
            replies = self._begin_batch(requests)
        self._choices = self._score(replies)
        stats = replies[info.label_holder].arrays["stats"]
        weight = node_count(stats, p.criterion_code)
        if depth == 0:
            self._root_weight[:] = weight
        if can_split:
            gains = np.stack([replies[n].arrays["gain"] for n in parties])
            party_ranks = np.stack([replies[n].arrays["rank"] for n in parties]).astype(np.int64)
            best_gain = gains.max(axis=0)
            tie_rank = np.where(gains == best_gain, party_ranks, np.iinfo(np.int64).max)
            owner = np.argmin(tie_rank, axis=0)
            roots = self._root_weight[open_tree - self._first_tree]
            split = (
                np.isfinite(best_gain)
                & (weight >= self._stopping.min_samples_split)
                & self._stopping.improves(best_gain, weight)
                & (best_gain >= p.least_gain(roots))
            )
        else:
            best_gain, owner = np.full(n_open, -np.inf), np.zeros(n_open, np.int64)
            split = np.zeros(n_open, bool)
        self._open = (open_tree, open_node, owner)
        fields = {"owner": np.where(split, owner, -1).astype(np.int16), "weight": weight,
                  "value": p.node_values(stats)}
        if p.criterion not in CRITERIA:  # boosting: each chosen split's gain, for its importances
            fields["gain"] = np.where(split, best_gain, 0.0)
        return Level(split, fields)

    def _level_requests(self, asked: list[str], candidates: np.ndarray) -> dict[str, Message]:
        """Each asked party's `find_splits`: its candidates per node, the last level's bitmaps of others'.

        A batch's first level: its `begin_batch`, the batch's header with the same fields.
        """
        info, p = self.federation, self.growth_params
        parties = info.parties
        owner = info.feature_owner[candidates]
        n_open = len(candidates)
        ranks = np.broadcast_to(np.arange(candidates.shape[1], dtype=np.int32), candidates.shape)
        batch = self._batch_header
        kind, header = ("find_splits", {}) if batch is None else ("begin_batch", batch)
        requests = {}
        for name in asked:
            index = parties.index(name)
            mine = owner == index
            feat_ptr = np.zeros(n_open + 1, np.int64)
            np.cumsum(mine.sum(axis=1), out=feat_ptr[1:])
            arrays = {"feat_ptr": feat_ptr, "feat_global": candidates[mine].astype(np.int32),
                      "feat_rank": ranks[mine]}
            if self._previous is not None:
                arrays.update(self._previous)
                arrays.update({f"bits_{q}": blob for q, blob in self._blobs.items() if q != index})
            # the least weight a child keeps (boosting: hessian sum)
            requests[name] = Message(kind, {**header, "party_index": index,
                                            "min_samples_leaf": p.min_leaf_weight}, arrays)
        return requests

    def _begin_batch(self, requests: dict[str, Message]) -> dict[str, Message]:
        """A batch's first level, every party's `begin_batch`: boosting's label holder first.

        Its reply carries the round's (g, h) (ciphertexts with encrypted labels), which the other parties'
        requests carry to them in place of labels.
        """
        self._batch_header = None
        if self.combination.kind != "sum":
            return self.transport.exchange(requests)
        holder = self.federation.label_holder
        key = "enc_gh" if self.params.privacy in ENCRYPTED_MODES else "gh"  # ciphertexts, or plain
        replies = self.transport.exchange({holder: requests.pop(holder)})
        gh = replies[holder].arrays[key]
        for message in requests.values():
            message.arrays[key] = gh
        if requests:
            replies.update(self.transport.exchange(requests))
        return replies

    def _score(self, replies: dict[str, Message]) -> dict[str, np.ndarray] | None:
        """Plain mode: every party scored its own candidates (encrypted labels: see `_evaluate_encrypted`)."""
        if self.params.privacy in ENCRYPTED_MODES:
            return self._evaluate_encrypted(replies)
        return None

    def advance(self, level: Level, split_idx: np.ndarray, left: np.ndarray, child_open: np.ndarray,
                next_pos: np.ndarray) -> None:
        """The owners of the chosen splits partition their rows and send the partition bitmaps.

        The next level's requests relay them to the other parties.
        """
        open_tree, open_node, owner = self._open
        parties = self.federation.parties
        split_owner = owner[split_idx]
        apply_requests = {}
        for index, name in enumerate(parties):
            mine = split_idx[split_owner == index]
            if len(mine):
                apply_requests[name] = Message("apply_splits", {}, {
                    "positions": mine.astype(np.int64), "tree": open_tree[mine], "node": open_node[mine]})
                if self._choices is not None and name != self.federation.label_holder:
                    apply_requests[name].arrays["choice"] = self._choices[name][mine]
        apply_replies = self.transport.exchange(apply_requests)
        self._blobs = {parties.index(name): r.arrays["bits"] for name, r in apply_replies.items()}
        self._previous = {"split_mask": level.split.astype(np.uint8),
                          "split_owner": split_owner.astype(np.int16)}

    def _evaluate_encrypted(self, replies: dict[str, Message]) -> dict[str, np.ndarray]:
        """Encrypted labels: the label holder scores the passive parties' encrypted histograms.

        Their gains and ranks join the replies as in plain mode; the sealed split choices per node are
        returned.
        """
        holder = self.federation.label_holder
        passive = [name for name in self.federation.parties if name != holder]
        arrays = {}
        for name in passive:
            arrays[f"packed_{name}"] = replies[name].arrays["packed"]
            arrays[f"sealed_{name}"] = replies[name].arrays["sealed"]
        # the least weight a child keeps, as in find_splits (boosting: the hessian sum)
        header = {"parties": passive, "min_samples_leaf": self.growth_params.min_leaf_weight}
        evaluated = self.transport.exchange({holder: Message("evaluate_encrypted", header, arrays)})
        scored = evaluated[holder].arrays
        for name in passive:
            replies[name] = Message("local_best", {},
                                    {"gain": scored[f"gain_{name}"], "rank": scored[f"rank_{name}"]})
        return {name: scored[f"choice_{name}"] for name in passive}

    # -- prediction -----------------------------------------------------------------------------
    def predict_values(self, n_rows: int, method: str = "auto", batch_rows: int = 8192) -> np.ndarray:
        """The trees' leaf values combined (`self.combination`: a forest's mean, boosting's linked sum).

        (n_rows, n_outputs), for `n_rows` aligned rows at every party.

        "one-round" is the paper's one round per row batch (each party's split sets: one bit per node it owns
        and row, `fedcore.trees.predictor`; row batches shrink as forests grow); "node-by-node" routes rows
        one level per round. "auto" takes one-round unless the forest has more than ONE_ROUND_MAX_LEAVES
        leaves, where the sets would outweigh depth-many small rounds. Both give identical outputs.
        """
        return self._predicted(n_rows, method, batch_rows, self.combination.combine)

    def tree_values(self, n_rows: int, method: str = "auto", batch_rows: int = 8192) -> np.ndarray:
        """Each tree's leaf value (first output) for `n_rows` aligned rows, (n_rows, n_trees), uncombined.

        Boosting's early stopping scores every prefix of rounds from them (`fedcore.trees.early_stopping`).
        """
        return self._predicted(n_rows, method, batch_rows, lambda values: values[:, :, 0])

    def _predicted(self, n_rows: int, method: str, batch_rows: int,
                   reduce: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """`reduce` of every row batch's leaf values per tree, (rows, n_trees, n_values), stacked."""
        s = self.trained_structure
        if method not in ("auto", "one-round", "node-by-node"):
            raise ValueError(f"method must be 'auto', 'one-round' or 'node-by-node', got {method!r}")
        internal = s.left != NO_CHILD
        if method == "auto":
            method = "one-round" if int(np.sum(~internal)) <= ONE_ROUND_MAX_LEAVES else "node-by-node"
        owned = [np.flatnonzero(internal & (s.owner == p)) for p in range(len(self.federation.parties))]
        if method == "one-round":
            fitting = SPLIT_SET_BUDGET_BYTES * 8 // max(max(map(len, owned), default=0), 1)
            batch_rows = min(batch_rows, max(64, fitting // 64 * 64))
        out: np.ndarray | None = None
        for start in range(0, n_rows, batch_rows):
            stop = min(start + batch_rows, n_rows)
            if method == "one-round":
                nodes = self._one_round_leaves(start, stop, owned)
            else:
                nodes = self._node_by_node_leaves(start, stop)
            values = reduce(s.value[nodes])
            if out is None:
                out = np.empty((n_rows, values.shape[1]), dtype=np.float64)
            out[start:stop] = values
        if out is None:  # no rows
            out = reduce(np.zeros((0, s.n_trees, s.value.shape[1])))
        return out

    def keep_trees(self, n_trees: int) -> None:
        """Keep only the first `n_trees` trees of the trained model (the parties are told separately).

        The importance shares are made anew from the kept splits alone (`kept_shares` gives each party its
        own): the same as a model trained with only those trees.
        """
        self.structure = first_trees(self.trained_structure, n_trees)
        if self.split_shares is not None:  # the kept trees' nodes come first: their gains are a prefix
            gains = None if self._gains is None else self._gains[:len(self.structure.tree)]
            self._gains = gains
            self.split_shares = SplitShares.of(self.structure, self.growth_params.criterion, gains)

    def kept_shares(self, party: str) -> tuple[np.ndarray, int] | None:
        """The importance shares of `party`'s own splits (zero elsewhere) and the splitting trees' count.

        What `keep_trees` tells that party, and no other (None: a model without importances).
        """
        if self.split_shares is None:
            return None
        return self.split_shares.own(self.federation.parties.index(party)), self.split_shares.splitting_trees

    def _one_round_leaves(self, start: int, stop: int, owned: list[np.ndarray]) -> np.ndarray:
        """Each row's leaf per tree ((rows, n_trees) global node indices), from every owner's split sets.

        `owned[p]`: the internal nodes party p owns, in node order (its split sets' rows).
        """
        s, parties = self.trained_structure, self.federation.parties
        replies = self.transport.exchange({
            name: Message("predict_leaves", {"start": start, "stop": stop}) for name in parties})
        n_words = -(-(stop - start) // 64)
        set_row = np.full(s.n_nodes, -1, np.int64)
        sets: list[np.ndarray] = []
        for name, nodes in zip(parties, owned, strict=True):
            left = replies[name].arrays["left"]
            if left.dtype != np.uint64 or left.shape != (len(nodes), n_words):
                raise ProtocolError(f"party {name!r} answered split sets of shape {left.shape} "
                                    f"({left.dtype}) for the {len(nodes)} nodes it owns and {stop - start} "
                                    f"rows, expected ({len(nodes)}, {n_words}) uint64: models out of sync")
            set_row[nodes] = sum(len(part) for part in sets) + np.arange(len(nodes))
            sets.append(left)
        stacked = np.concatenate([np.zeros((0, n_words), np.uint64), *sets])
        return route_by_split_sets(stacked, set_row, s.tree_offsets(), s.left, s.right, stop - start)

    def _node_by_node_leaves(self, start: int, stop: int) -> np.ndarray:
        s = self.trained_structure
        offsets = s.tree_offsets()
        n = stop - start
        current = np.broadcast_to(offsets[:-1], (n, s.n_trees)).copy()
        rows = np.broadcast_to(np.arange(start, stop)[:, None], (n, s.n_trees))
        while True:
            internal = s.left[current] != NO_CHILD
            if not internal.any():
                return current
            owner = s.owner[current]
            requests, masks = {}, {}
            for index, name in enumerate(self.federation.parties):
                mask = internal & (owner == index)
                if mask.any():
                    masks[name] = mask
                    requests[name] = Message("route", {}, {"rows": rows[mask].astype(np.int64),
                                                           "nodes": current[mask].astype(np.int64)})
            replies = self.transport.exchange(requests)
            tree_base = np.broadcast_to(offsets[:-1], (n, s.n_trees))
            for name, mask in masks.items():
                go_left = unpack_bits(replies[name].arrays["bits"], int(mask.sum())).astype(bool)
                cur = current[mask]
                child = np.where(go_left, s.left[cur], s.right[cur])
                current[mask] = tree_base[mask] + child


def sample_rows_without_replacement(rng: np.random.Generator, n_rows: int, n: int, k: int) -> np.ndarray:
    """`n_rows` independent sorted draws of k distinct integers from range(n): (n_rows, k).

    Few candidates of many (the usual sqrt/log2): draw with replacement and redraw rows that repeat,
    which costs O(k) per row instead of O(n); otherwise rank random keys.
    """
    if 4 * k > n:
        return np.sort(np.argsort(rng.random((n_rows, n)), axis=1, kind="stable")[:, :k], axis=1)
    out = np.sort(rng.integers(0, n, size=(n_rows, k)), axis=1)
    redo = np.flatnonzero((np.diff(out, axis=1) == 0).any(axis=1))
    while len(redo):
        out[redo] = np.sort(rng.integers(0, n, size=(len(redo), k)), axis=1)
        redo = redo[(np.diff(out[redo], axis=1) == 0).any(axis=1)]
    return out


STRUCTURE_ARRAYS = ("tree", "node", "left", "right", "depth", "owner", "weight", "value")


def _relay_encrypted_setup(name: str, holder: str, parties: list[str], replies: dict[str, Message],
                           labels: Message, header: dict, arrays: dict[str, np.ndarray]) -> None:
    """Encrypted labels: relay the keys and label ciphertexts each party needs.

    A passive party gets the public key, the label ciphertexts and the label holder's sealing key; the label
    holder gets every passive party's sealing key.
    """
    peers = [other for other in parties if other != holder] if name == holder else [holder]
    for peer in peers:  # each sealing key travels with its owner's signature (checked by the receiver)
        arrays[f"seal_{peer}"] = replies[peer].arrays["seal_public"]
    header["seal_signatures"] = {peer: {k: v for k, v in replies[peer].header.items() if k.startswith("key_")}
                                 for peer in peers}
    if name == holder:
        header["passive_parties"] = peers
        return
    header.update(encryption=labels.header["encryption"], label_holder=holder)
    if "enc_y" in labels.arrays:  # boosting: the rounds' (g, h) ciphertexts instead, at begin_batch
        arrays["enc_y"] = labels.arrays["enc_y"]
