"""A vertical Federated Forest party's rows on a Dask cluster: `DaskVerticalRows`, a drop-in for `LocalRows`.

The party's aligned rows are either a frame in the agent, cut into blocks of `block_rows`
(`fedcore.compute.blocks.frame_blocks`), or already on the workers (`DaskVerticalRows.on_workers`: the
training blocks `fedcore.compute.dask_alignment` made from Parquet). A frame's bin edges are fitted on it
(`PartyBinner.fit`) and the agent bins the rows: each block's uint8 codes travel inside the task that
makes their future (the scheduler holds them, one byte per cell). Blocks on the workers get the same edges
from `fedcore.compute.dask_binning` and bin themselves. Either way, per label vector, each block's labels
travel inside a task (as soon as the party has them, class codes as uint8 or uint16: `compact_labels`; the
party keeps no copy), and a lost worker's blocks are rebuilt from lineage. Each block's `SamplePartition`
(its in-bag samples per open node, rows numbered within the block) is a future: a batch's is drawn by the
block itself (`fedcore.randomness.bootstrap_counts` over the canonical chunks it overlaps, the same counts
as the whole table's), and each level's is a new future made from the previous one and the last level's
bits by the level's one task per block (`_level`: `SamplePartition.split_copy`, a task never changes its
inputs), which returns the new partition beside the block's histograms.

Per level:

* histograms: ONE task per block over every open node of the batch, after applying the last level's
  splits (`block_histograms`, int64 class counts or regression's (w, wy) over targets on their grid, with
  the block's node statistics); each worker adds up its blocks' (one task per worker, `_summed`), the
  agent adds the workers' (integers, or integers times 2^e below 2^53: exact in any order) and runs the
  same scan as the label holder's decrypted histograms (`best_splits_from_histograms`), which gives the
  in-process kernel's splits bit for bit. Where the in-process party would keep a level's histograms
  (`worth_keeping`: class counts, most features candidates of most nodes), the agent keeps the merged
  ones, and the blocks compute only the pairs `subtraction_plan` does not derive: the larger children's
  are their parent's minus their smaller sibling's (`derive_histograms`), the same integers;
* own splits: each block packs its rows' bits per split node; a node's rows are in ascending row order in
  process (the bootstrap lists rows ascending and splits are stable), so the blocks' bits concatenated in
  block order are exactly the in-process `partition_bits`;
* other owners' bits: cut per block by each block's per-node row counts, which the agent tracks (the
  bootstrap's counts once per batch, then the children's from the bits themselves).

Encrypted labels (paillier, ou): a passive party's label ciphertexts go to the blocks once (inside the
tasks that raise them to the bootstrap weights 1..3, `weight_powers`); per level one task per block
computes each (node, feature) job's per-bin ciphertext products over the block's samples, and the agent
multiplies the blocks' products modulo n^2 (`merge_bin_sums`): the same integers as in process, in any
order, so the encrypted histograms are the in-process ones. The label holder on Dask works as a plain one.

Regression: the label holder rounds its targets to their grid once (`fixed_targets`, every party's sums
of weight x target then exact), and squared error's splits need only (w, wy) (`fedcore.trees.criteria`), so
the blocks' sums are the in-process ones in any order.

Boosting: a round's (g, h) are on the round's power-of-two grid (`fedcore.trees.fixed_gradients`: integers
times 2^e, every sum over the rows below 2^53 times 2^e), so the blocks' float64 (count, G, H) sums, on each
worker and then here, are exact and the in-process ones in any order (the same fixed-point idea as horizontal
boosting's int64 histograms, on the grid the in-process vertical model already sums: horizontal's 2^-24
steps would change that model). Each round's (g, h) travel to the blocks inside their bootstrap tasks
(`begin_batch`'s `targets`, a block's slice of every tree's). The label holder's rows learn their leaf
weights where they are: per level one task per block gives the block's open nodes' rows their nodes'
weights (`fedcore.vertical.boosting.record_leaves`, on a copy), and the next round gathers them, in block
order, to add to the margins. SecureBoost's passive party gets each round's (g, h) ciphertexts per block
(each tree's rows of the block, tree after tree, as `PassiveCrypto.per_tree` reads them in process), and its
blocks' encrypted bin sums merge as a forest's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from fedcore.compute import DEFAULT_BLOCK_ROWS
from fedcore.compute.blocks import Block, frame_blocks, per_worker_sums, rebuildable, worker_homes
from fedcore.compute.level_clock import LevelClock
from fedcore.data.binning import PartyBinner
from fedcore.privacy.packing import encrypted_bin_sums, weight_powers
from fedcore.randomness import bootstrap_chunk_totals
from fedcore.trees.level_histograms import derive_histograms, subtraction_plan, worth_keeping
from fedcore.trees.partition import (
    SamplePartition,
    copy_bit_runs,
    node_byte_lengths,
    offsets_from_lengths,
    pack_split_bits,
)
from fedcore.trees.splitting import (
    NodeSplits,
    best_splits_from_histograms,
    block_histograms,
    node_statistics,
    sum_histograms,
)
from fedcore.vertical.boosting import record_leaves

if TYPE_CHECKING:
    from distributed import Client, Future

    from fedcore.privacy.homomorphic import CiphertextSpace
    from fedcore.vertical.encrypted import PassiveCrypto

Csr = tuple[np.ndarray, np.ndarray, np.ndarray]
"""A level's histograms in CSR: (ptr per pair, bins, statistics)."""

Split = tuple[np.ndarray, np.ndarray, np.ndarray]
"""A block's share of a level's splits: its packed bits (node after node), their byte offsets, the mask."""

PENDING_SPLITS = ("a level's splits before the last level's were applied: split() comes once per level, "
                  "then best_splits, split_bits or encrypted_bin_sums applies it")
"""Why `DaskVerticalRows.split` refuses a second split in a row."""


def compact_labels(y: np.ndarray) -> np.ndarray:
    """`y` in the narrowest type that holds it exactly: class codes below 256 (65,536) as uint8 (uint16).

    Anything else (values, more classes) stays float64. Read back as float64, every value is the same.
    """
    y = np.asarray(y)
    if y.size == 0:
        return y.astype(np.uint8)
    low, high = y.min(), y.max()  # NaN fails both tests below
    if low >= 0 and high < 2**16 and np.array_equal(np.floor(y), y):
        return y.astype(np.uint8 if high < 2**8 else np.uint16)
    return np.ascontiguousarray(y, np.float64)


# -- what the workers run (module functions: pickled by reference) -------------------------------------
def _bootstrap(y: np.ndarray, start: int, n_rows: int, seed: int, trees: list[int], n_draws: int | None,
               totals: list[np.ndarray] | None) -> SamplePartition:
    """The block's roots of a new batch: its rows' bootstrap counts, numbered within the block.

    `y`: the block's labels, or (boosting) each tree's (g, h) of its rows (len(trees), rows, 2).
    """
    return SamplePartition.bootstrap(seed, trees, y, n_draws, start=start, n_rows=n_rows, totals=totals)


def _record(leaves: np.ndarray | None, state: SamplePartition | tuple, shape: tuple[int, int],
            values: np.ndarray) -> np.ndarray:
    """The block's leaf weights (boosting's label holder) after this level: a copy with its nodes' `values`.

    `leaves`: the level before's (None: a round's first level, zeros of `shape`).
    """
    out = np.zeros(shape) if leaves is None else leaves.copy()
    record_leaves(out, _partition(state), values)
    return out


def _bin(frame: pd.DataFrame, binner: PartyBinner) -> np.ndarray:
    """A block's bin codes (Fortran order), binned where the block is."""
    return np.asfortranarray(binner.transform(frame))


def _partition(state: SamplePartition | tuple) -> SamplePartition:
    """A block's partition: the bootstrap's, or the first item of a level's task (`_level`)."""
    return state[0] if isinstance(state, tuple) else state


def _sizes(state: SamplePartition | tuple) -> np.ndarray:
    part = _partition(state)
    return part.ends - part.starts


def _split(state: SamplePartition | tuple, split: Split) -> SamplePartition:
    """The block's partition after the level's splits (`split`: its packed bits, their offsets, the mask)."""
    packed, offsets, split_mask = split
    return _partition(state).split_copy(split_mask, packed, offsets)


def _histograms(part: SamplePartition, codes: np.ndarray, feat_ptr: np.ndarray, feat_local: np.ndarray,
                n_stats: int, criterion: int) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """The block's histograms of every (open node, candidate) pair and its nodes' statistics, exact.

    The statistics take the histograms' dtype (`block_histograms`: int64 counts or float64 (w, wy)).
    """
    hist = block_histograms(codes, part.target, part.order, part.weight, part.starts, part.ends, feat_ptr,
                            feat_local, n_stats, criterion)
    totals = node_statistics(part.target, part.weight, part.starts, part.ends, n_stats, criterion)
    return hist, totals.astype(hist[2].dtype)


def _level(state: SamplePartition | tuple, codes: np.ndarray, split: Split | None, feat_ptr: np.ndarray,
           feat_local: np.ndarray, n_stats: int, criterion: int
           ) -> tuple[SamplePartition, tuple[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """A block's one task a level: the last level's `split` applied (`_split`; None: none), `_histograms`.

    Returns (the new partition, histograms, statistics): the partition is the next level's input, so a lost
    block is rebuilt from this lineage; one task instead of two saves a scheduler round trip per block.
    """
    part = _partition(state) if split is None else _split(state, split)
    return (part, *_histograms(part, codes, feat_ptr, feat_local, n_stats, criterion))


def _summed(n_pairs: int, *results: tuple) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """Some blocks' `_level` histograms added up where they are (`sum_histograms`; node statistics summed)."""
    totals = results[0][-1].copy()
    for result in results[1:]:
        totals += result[-1]
    return sum_histograms([result[-2] for result in results], n_pairs), totals


def _powers(ciphertexts: list, public: CiphertextSpace, largest: int) -> list[list]:
    """The block's label ciphertexts raised to the weights 1..largest (`weight_powers`; boosting: 1)."""
    return weight_powers(public, ciphertexts, largest)


def _encrypted_bin_sums(state: SamplePartition | tuple, codes: np.ndarray, powers: list[list],
                        public: CiphertextSpace, nodes: np.ndarray, features: np.ndarray,
                        per_tree: bool) -> tuple[list[tuple], np.ndarray]:
    """Each (node, feature) job's encrypted bin sums over the block's samples, and its nodes' weights.

    `per_tree` (boosting): the block's ciphertexts are each tree's of its rows, tree after tree; a node of the
    round's k-th tree (positions k rows .. (k + 1) rows of the partition) reads the k-th run.
    """
    part = _partition(state)
    block_rows = len(codes)
    out: list[tuple] = []
    for node, feature in zip(nodes.tolist(), features.tolist(), strict=True):
        s, e = int(part.starts[node]), int(part.ends[node])
        rows = part.order[s:e]
        run = (s // block_rows) * block_rows if per_tree and block_rows else 0
        ciphertext_rows = rows.astype(np.int64) + run if run else rows
        out.append(encrypted_bin_sums(public, powers, ciphertext_rows, part.weight[s:e], codes[rows, feature])
                   if e > s else (np.zeros(0, np.uint8), [], []))
    weights = np.array([int(part.weight[a:b].sum()) for a, b in zip(part.starts, part.ends, strict=True)],
                       np.int64)
    return out, weights


def merge_bin_sums(parts: Sequence[tuple], modulus: Any) -> tuple[np.ndarray, list, list[int]]:
    """One job's blocks' (bins, ciphertext sums, weights) combined, bins ascending.

    A bin's sum is the product of its blocks' modulo n^2 (or n): the same integer as the in-process
    product of every sample's term, in whatever order, so the encrypted histograms are the in-process ones.
    """
    merged: dict[int, tuple[Any, int]] = {}
    for bins, sums, totals in parts:
        for b, value, total in zip(bins.tolist(), sums, totals, strict=True):
            if b in merged:
                acc, weight = merged[b]
                merged[b] = (acc * value % modulus, weight + total)
            else:
                merged[b] = (value, total)
    keys = sorted(merged)
    return np.array(keys, np.uint8), [merged[b][0] for b in keys], [merged[b][1] for b in keys]


def _bits(state: SamplePartition | tuple, codes: np.ndarray, pos: np.ndarray, splits: tuple) -> np.ndarray:
    """The block's packed bits of the split nodes at `pos` (byte aligned per node, as in process)."""
    part = _partition(state)
    starts, ends = part.starts[pos], part.ends[pos]
    offsets = offsets_from_lengths(node_byte_lengths(starts, ends))
    feature, bins, missing_left, is_categorical, cat_bits = splits
    return pack_split_bits(codes, part.order, starts, ends, feature, bins, missing_left, is_categorical,
                           cat_bits, offsets)


# -- the agent's side ------------------------------------------------------------------------------------
def _bit_places(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Where block b's bits of node j are, in bits: node after node and block after block (both packed).

    `counts[b, j]`: bits of node j in block b. Node after node, each node's bits start a byte (its blocks'
    in block order); block after block, each (block, node) run starts a byte (`pack_nodes` per block).
    Returns both positions of every run (block-major order), the node-major bytes, and the block-major byte
    offsets of the runs (n_blocks * n_nodes + 1).
    """
    totals = counts.sum(axis=0, dtype=np.int64)
    node_bytes = offsets_from_lengths(node_byte_lengths(0, totals))
    before = np.cumsum(counts, axis=0, dtype=np.int64) - counts  # bits of the node in earlier blocks
    node_at = (node_bytes[:-1] * 8 + before).ravel()
    run_bytes = offsets_from_lengths(node_byte_lengths(0, counts.ravel()))
    return node_at, run_bytes[:-1] * 8, node_bytes, run_bytes


def node_major(blobs: Sequence[np.ndarray], counts: np.ndarray) -> np.ndarray:
    """Each block's packed bits (`pack_nodes` over its nodes) as one packed bitmap, node after node.

    A node's bits are its blocks' in block order: `pack_nodes` of the nodes' bits (`counts[b, j]`: bits of
    node j in block b).
    """
    counts = np.asarray(counts, np.int64)
    node_at, run_at, node_bytes, _ = _bit_places(counts)
    src = np.concatenate([np.zeros(0, np.uint8), *blobs])
    return copy_bit_runs(src, run_at, counts.ravel(), node_at, node_bytes[-1])[0]


def block_major(packed: np.ndarray, counts: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """The inverse of `node_major`: each block's packed bits, and the ones of each (block, node) run.

    Ones are the rows that go left (n_blocks, n_nodes), int64.
    """
    counts = np.asarray(counts, np.int64)
    node_at, run_at, _, run_bytes = _bit_places(counts)
    flat, ones = copy_bit_runs(packed, node_at, counts.ravel(), run_at, run_bytes[-1])
    cuts = run_bytes[::counts.shape[1]] if counts.shape[1] else np.zeros(len(counts) + 1, np.int64)
    return [flat[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)], ones.reshape(counts.shape)


class DaskVerticalRows:
    """A vertical party's rows on a Dask cluster, with `LocalRows`' interface (see the module doc)."""

    def __init__(self, features: pd.DataFrame, client: Client, block_rows: int = DEFAULT_BLOCK_ROWS,
                 name: str = "vertical") -> None:
        """The party's feature columns, to go to the cluster in blocks of `block_rows` rows at each setup.

        `name`: the party's, for its progress lines.
        """
        self.features: pd.DataFrame | None = features
        self.frames: list[Future] = []
        """Or (`on_workers`) each block's rows as a future on the workers, which fit and bin them there."""
        self.columns = [str(c) for c in features.columns]
        self.client = client
        self.blocks: list[Block] = frame_blocks(len(features), block_rows)
        self.n_rows = len(features)
        self.submit_order = list(range(len(self.blocks)))
        """The order blocks' tasks are submitted in (results are combined in block order whatever it is)."""
        self.codes: list[Future] = []
        self.labels: list[Future] = []  # each block's labels (`set_labels`), per setup
        self.parts: list[Future] = []
        """Each block's partition: the bootstrap's, or its last `_level` task's (partition first)."""
        self._pending: list[Split] | None = None
        """The last level's splits, per block, until the next level's `_level` tasks apply them."""
        self.counts = np.zeros((len(self.blocks), 0), np.int64)
        """Rows of each open node in each block (n_blocks, n_open); kept here, level by level."""
        self._in_batch = False
        self.clock = LevelClock(name)
        """Each level's wall time (begin_batch, then each split), logged per tree batch."""
        self._kept: tuple[tuple[np.ndarray, np.ndarray], Csr] | None = None
        """The last level's (node, feature) per pair (-1 node: none) and merged CSR histograms, for
        subtraction (`worth_keeping`); None: not kept."""
        self.pairs_derived = 0
        """Histograms derived by subtraction instead of summed from the blocks (for tests and reports)."""
        self.powers: list[Future] = []  # encrypted labels, passive party: each block's weight powers
        self._public: Any = None
        self._n_trees = 0  # trees of the batch
        self.leaves: Sequence[Future | None] = []
        """Boosting's label holder: each block's leaf weights of the round so far (`_record`), per tree."""

    @classmethod
    def on_workers(cls, client: Client, frames: Sequence[Future], sizes: Sequence[int],
                   columns: Sequence[str], name: str = "vertical") -> DaskVerticalRows:
        """Rows that are on the workers already: block i is future `frames[i]` of `sizes[i]` rows.

        The frames hold the feature `columns` (and may hold more); setup fits the binner over them
        (`fedcore.compute.dask_binning`) and each block bins its own rows, so no row passes the agent.
        """
        rows = cls(pd.DataFrame(columns=list(columns)), client, name=name)
        ends = np.cumsum([0, *sizes])
        rows.features, rows.frames = None, list(frames)
        rows.blocks = [Block(i, int(a), int(b))
                       for i, (a, b) in enumerate(zip(ends[:-1], ends[1:], strict=True))]
        rows.n_rows, rows.submit_order = int(ends[-1]), list(range(len(frames)))
        rows.counts = np.zeros((len(frames), 0), np.int64)
        return rows

    def __getstate__(self) -> dict:
        """A fitted estimator's party pickles without the cluster: only training used the rows."""
        state = self.__dict__.copy()
        state.update(client=None, codes=[], labels=[], parts=[], _in_batch=False, powers=[],
                     frames=[], _kept=None, _pending=None, leaves=[])
        return state

    def _map(self, func: Callable, *per_block: Sequence, **shared: Any) -> list[Future]:
        """One task per block, submitted in `submit_order`; the futures in block order."""
        futures: list[Any] = [None] * len(self.blocks)
        for i in self.submit_order:
            futures[i] = self.client.submit(func, *(args[i] for args in per_block), pure=False, **shared)
        return futures

    # -- LocalRows' interface -------------------------------------------------------------------------
    def fit(self, max_bins: int, seed: int) -> PartyBinner:
        """The party's binner, fitted on all its rows: the frame's here, or over the blocks on the workers."""
        binner = PartyBinner(max_bins=max_bins, random_state=seed)
        if self.features is not None:
            return binner.fit(self.features)
        from fedcore.compute.dask_binning import fit_on_blocks

        return fit_on_blocks(binner, self.client, self.frames, self.columns)

    def bin(self, binner: PartyBinner) -> None:
        """Bin each block with the party's binner: here, sent to the cluster inline, or where the block is."""
        self.clear()
        if self.features is None:
            self.codes = self._map(_bin, self.frames, binner=binner)
        else:
            features = self.features
            self.codes = self._map(rebuildable,
                                   [np.asfortranarray(binner.transform(features.iloc[b.start:b.stop]))
                                    for b in self.blocks])
        self.labels, self.powers = [], []  # a new setup's labels come next

    def set_labels(self, y: np.ndarray) -> None:
        """The rows' labels to the cluster at once, each block's inside the task that makes its future.

        Class codes travel in the narrowest integer type that holds them (`compact_labels`: 1 byte a row
        below 256 classes), and the party keeps no copy: what the agent holds for them is what its
        scheduler keeps of the tasks (issue #29). The workers' bootstrap reads them as float64, as in process.
        """
        self.labels = self._map(rebuildable, [compact_labels(y[b.start:b.stop]) for b in self.blocks])

    @property
    def labelled(self) -> bool:
        """Whether the labels of this setup were set (an empty table's blocks: none needed)."""
        return bool(self.labels) or not self.blocks

    def begin_batch(self, seed: int, trees: list[int], n_draws: int | None,
                    targets: np.ndarray | None = None) -> None:
        """A new batch: each block draws its rows' bootstrap counts (the chunk totals drawn here, once).

        Boosting passes `targets` instead of the labels: each tree's (g, h), every row (len(trees), n_rows,
        2); each block's slice travels inside its bootstrap task (lineage rebuilds it).
        """
        self.clock.end_batch(self.client, len(self.blocks))
        self.clock.level()
        totals = (None if n_draws is None
                  else [bootstrap_chunk_totals(seed, tree, self.n_rows, n_draws) for tree in trees])
        y = (self.labels if targets is None
             else [np.ascontiguousarray(targets[:, b.start:b.stop]) for b in self.blocks])
        self.parts = self._map(_bootstrap, y, [b.start for b in self.blocks], n_rows=self.n_rows,
                               seed=seed, trees=list(trees), n_draws=n_draws, totals=totals)
        self.leaves, self._n_trees = [None] * len(self.blocks), len(trees)
        self.counts = np.array(self.client.gather(self._map(_sizes, self.parts)), np.int64).reshape(
            len(self.blocks), len(trees))
        self._kept = self._pending = None
        self._in_batch = True

    def clear(self) -> None:
        """No batch in progress (training finalized): the partitions leave the workers."""
        self.clock.end_batch(self.client, len(self.blocks))
        self.parts, self.leaves = [], []
        self.counts = np.zeros((len(self.blocks), 0), np.int64)
        self._kept = self._pending = None
        self._in_batch = False

    @property
    def in_batch(self) -> bool:
        """Whether a batch was begun and not finalized."""
        return self._in_batch

    def node_sizes(self) -> np.ndarray:
        """Distinct in-bag rows of each open node, over the blocks (int64)."""
        return self.counts.sum(axis=0, dtype=np.int64)

    def split(self, split_mask: np.ndarray, packed: np.ndarray, offsets: np.ndarray) -> None:
        """Apply the level's merged bitmaps: each block's rows' bits go to its next task, which splits it.

        That is the next level's `_level` task (one task per block and level), or a `_split` task of its own
        when something else needs the partitions first (`_applied`). Refused while the last level's splits
        are still pending: they would be lost.
        """
        if self._pending is not None:
            raise RuntimeError(PENDING_SPLITS)
        self.clock.level()  # the next level starts with its partition
        idx = np.flatnonzero(split_mask)
        counts = self.counts[:, idx]
        blobs, left = block_major(packed, counts)
        mask = np.asarray(split_mask, bool)
        self._pending = [(blob, offsets_from_lengths(node_byte_lengths(0, c)), mask)
                         for blob, c in zip(blobs, counts, strict=True)]
        children = np.zeros((len(self.blocks), 2 * len(idx)), np.int64)
        children[:, 0::2], children[:, 1::2] = left, counts - left
        self.counts = children

    def _applied(self) -> list[Future]:
        """The blocks' partitions with the last level's splits applied (`_split` tasks if still pending)."""
        if self._pending is not None:
            self.parts, self._pending = self._map(_split, self.parts, self._pending), None
        return self.parts

    def best_splits(self, feat_ptr: np.ndarray, feat_local: np.ndarray, feat_rank: np.ndarray,
                    is_categorical: np.ndarray, n_stats: int, criterion: int,
                    min_leaf: float, reg_lambda: float = 0.0,
                    parents: np.ndarray | None = None) -> tuple[NodeSplits, np.ndarray]:
        """One histogram task per block over the pairs summed directly, added up, then the shared scan.

        `parents`: the previous level's nodes that split into this level's sibling pairs. Where the last
        level's merged histograms were kept (`worth_keeping`, the in-process rule), the pairs that
        `subtraction_plan` derives are not computed by the blocks: each is its parent's minus its smaller
        sibling's, here (`derive_histograms`; exact integers, the same histograms as summing).
        """
        node_rows = self.node_sizes()
        n_nodes, n_pairs = len(feat_ptr) - 1, len(feat_local)
        pair_node = np.repeat(np.arange(n_nodes, dtype=np.int64), np.diff(feat_ptr))
        kept = self._kept
        derive_from, sibling = subtraction_plan(feat_ptr, feat_local, node_rows, parents,
                                                None if kept is None else kept[0])
        direct = np.flatnonzero((derive_from < 0) & (node_rows[pair_node] >= 2))
        direct_ptr = offsets_from_lengths(np.bincount(pair_node[direct], minlength=n_nodes))
        split: Sequence[Split | None] = self._pending or [None] * len(self.blocks)
        self._pending = None
        self.parts = self._map(_level, self.parts, self.codes, split, feat_ptr=direct_ptr,
                               feat_local=feat_local[direct], n_stats=n_stats, criterion=criterion)
        hist, totals = self._per_worker(len(direct), (n_nodes, n_stats), self.parts)
        ptr, bins, stats = derive_histograms(hist, direct, n_pairs, derive_from, sibling,
                                             None if kept is None else kept[1])
        self.pairs_derived += int(np.sum(derive_from >= 0))
        self._kept = (((np.where(node_rows[pair_node] >= 2, pair_node, -1), feat_local.astype(np.int64)),
                       (ptr, bins, stats))
                      if worth_keeping(criterion, n_pairs, n_stats, n_nodes, len(self.columns)) else None)
        splits = best_splits_from_histograms(ptr, bins, stats.astype(np.float64), pair_node,
                                             is_categorical[feat_local], totals.astype(np.float64),
                                             node_rows, feat_ptr, feat_local, feat_rank, criterion,
                                             min_leaf, n_stats, reg_lambda)
        return splits, totals.astype(np.float64)

    def _per_worker(self, n_pairs: int, totals_shape: tuple[int, int], results: list[Future]
                    ) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
        """The blocks' `_level` histograms summed: first on each worker over the blocks it holds, then here.

        A worker sends one level's CSR over the union of its blocks' bins rather than one per block (less
        to send, and less for the agent to hold and add). Exact in any grouping (`sum_histograms`). Blocks are
        grouped by where their codes are now; a group's task may run elsewhere (a lost worker).
        """
        if not results:
            return sum_histograms([], n_pairs), np.zeros(totals_shape, np.int64)
        sums = per_worker_sums(self.client, results, worker_homes(self.client, self.codes), _summed, n_pairs)
        return _summed(n_pairs, *self.client.gather(sums))

    def split_bits(self, pos: np.ndarray, c: NodeSplits) -> np.ndarray:
        """The in-process `partition_bits` message: the blocks' bits per node, concatenated in block order."""
        splits = (c.feature[pos], c.bin[pos], c.missing_left[pos], c.is_categorical[pos], c.cat_bits[pos])
        blobs = self.client.gather(self._map(_bits, self._applied(), self.codes, pos=pos, splits=splits))
        return node_major(blobs, self.counts[:, pos])

    def record_leaves(self, values: np.ndarray) -> None:
        """Boosting's label holder: the open nodes' rows get their nodes' `values`, one task per block."""
        self.leaves = self._map(_record, self.leaves, self.parts,
                                [(self._n_trees, b.n_rows) for b in self.blocks], values=values)

    def leaf_values(self) -> np.ndarray:
        """Each row's leaf weight per tree of the round (len(trees), n_rows): the blocks', in block order."""
        return np.concatenate(self.client.gather(self.leaves), axis=1)

    def load_ciphertexts(self, public: CiphertextSpace, ciphertexts: list, trees: int = 0) -> None:
        """Encrypted labels: each block's label ciphertexts to the cluster, raised there to weights 1..3.

        `trees` (boosting): a round's ciphertexts, n_rows per tree; each block gets its rows' of every tree,
        tree after tree, and keeps them alone (every row weighs 1).
        """
        self._public = public
        if trees:
            per_block = [[c for k in range(trees)
                          for c in ciphertexts[k * self.n_rows + b.start:k * self.n_rows + b.stop]]
                         for b in self.blocks]
        else:
            per_block = [list(ciphertexts[b.start:b.stop]) for b in self.blocks]
        self.powers = self._map(_powers, per_block, public=public, largest=1 if trees else 3)

    def encrypted_bin_sums(self, crypto: PassiveCrypto, nodes: np.ndarray,
                           features: np.ndarray) -> tuple[list[tuple], np.ndarray]:
        """One task per block over every job; each job's blocks merged (`merge_bin_sums`), weights summed."""
        if not self.powers:
            raise ValueError("encrypted bin sums before the label ciphertexts were loaded")
        results = self.client.gather(self._map(_encrypted_bin_sums, self._applied(), self.codes, self.powers,
                                               public=self._public, nodes=nodes, features=features,
                                               per_tree=crypto.per_tree))
        weights = np.zeros(self.counts.shape[1], np.int64)
        for _, block_weights in results:
            weights += block_weights
        modulus = self._public.modulus
        jobs = [merge_bin_sums([block[0][j] for block in results], modulus) for j in range(len(nodes))]
        return jobs, weights

    def close(self) -> None:
        """Release every future of these rows (they leave the workers)."""
        self.clear()
        self.codes, self.labels, self.powers, self.frames = [], [], [], []
