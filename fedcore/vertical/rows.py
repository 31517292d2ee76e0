"""Where a vertical party's row work runs: its bin codes, its sample partition and the per-level kernels.

`LocalRows` keeps them in the party's process; `fedcore.compute.dask_vertical.DaskVerticalRows` keeps them
on a Dask cluster in blocks of rows (issue #29) with the same interface, so `VerticalParty` checks the
master's requests once and hands the row work to either. Both call the same kernels
(`fedcore.trees.splitting`, `fedcore.trees.partition`) and give byte-identical answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from fedcore.data.binning import PartyBinner
from fedcore.trees.level_histograms import LevelHistograms, find_best_splits, worth_keeping
from fedcore.trees.partition import SamplePartition, node_byte_lengths, offsets_from_lengths, pack_split_bits
from fedcore.trees.splitting import NodeSplits
from fedcore.vertical.boosting import record_leaves

if TYPE_CHECKING:
    from fedcore.privacy.homomorphic import CiphertextSpace
    from fedcore.vertical.encrypted import PassiveCrypto


class LocalRows:
    """A vertical party's rows in its own process: bin codes and the batch's `SamplePartition`."""

    def __init__(self, features: pd.DataFrame) -> None:
        """The party's feature columns (aligned rows); binned at each setup."""
        self.features = features
        self.codes: np.ndarray | None = None  # (n_rows, n_columns) uint8, column-major: the only copy
        self._histograms: LevelHistograms | None = None  # the last level's, for subtraction
        self.labels: np.ndarray | None = None  # the rows' class codes or values (float64), per setup
        self.partition: SamplePartition | None = None
        self.leaves = np.zeros((0, 0))  # boosting's label holder: each row's leaf weight, per tree of a round

    @property
    def n_rows(self) -> int:
        """Rows of the party."""
        return len(self.features)

    @property
    def columns(self) -> list[str]:
        """The party's feature columns, in order."""
        return [str(c) for c in self.features.columns]

    def fit(self, max_bins: int, seed: int) -> PartyBinner:
        """The party's binner, fitted on its rows (`PartyBinner.fit`)."""
        return PartyBinner(max_bins=max_bins, random_state=seed).fit(self.features)

    def bin(self, binner: PartyBinner) -> None:
        """Bin the rows with the binner the party fitted on them."""
        self.codes = binner.transform(self.features)
        self.labels = None  # a new setup's labels come next

    def set_labels(self, y: np.ndarray) -> None:
        """The rows' class codes or values, which every batch's bootstrap carries (kept as float64)."""
        self.labels = np.asarray(y, np.float64)

    @property
    def labelled(self) -> bool:
        """Whether the labels of this setup were set."""
        return self.labels is not None

    def begin_batch(self, seed: int, trees: list[int], n_draws: int | None,
                    targets: np.ndarray | None = None) -> None:
        """A new batch: each tree's bootstrap sample in its root, carrying the labels.

        Boosting passes `targets` instead: each tree's (g, h), every row.
        """
        y = self.labels if targets is None else targets
        assert y is not None, "the protocol admits begin_batch only after the labels were set"
        self.partition = SamplePartition.bootstrap(seed, trees, y, n_draws)
        self._histograms = None
        if targets is not None:
            self.leaves = np.zeros((len(trees), self.n_rows))

    def clear(self) -> None:
        """No batch in progress (training finalized)."""
        self.partition = None
        self._histograms = None

    @property
    def in_batch(self) -> bool:
        """Whether a batch was begun and not finalized."""
        return self.partition is not None

    def node_sizes(self) -> np.ndarray:
        """Distinct in-bag rows of each open node (int64)."""
        part = self._partition()
        return part.ends - part.starts

    def split(self, split_mask: np.ndarray, packed: np.ndarray, offsets: np.ndarray) -> None:
        """Apply the level's merged partition bitmaps (`SamplePartition.split`)."""
        self._partition().split(split_mask, packed, offsets)

    def best_splits(self, feat_ptr: np.ndarray, feat_local: np.ndarray, feat_rank: np.ndarray,
                    is_categorical: np.ndarray, n_stats: int, criterion: int,
                    min_leaf: float, reg_lambda: float = 0.0,
                    parents: np.ndarray | None = None) -> tuple[NodeSplits, np.ndarray]:
        """This party's best split per open node and the nodes' statistics (`find_best_splits`).

        `parents`: the previous level's nodes that split into this level's sibling pairs (None: a batch's
        first level); the larger siblings' histograms are derived from the last level's kept ones.
        When most nodes consider most of the party's features (boosting, or no feature sampling), this
        level's histograms are kept for the next.
        """
        part, codes = self._partition(), self._codes()
        n_nodes, n_columns = len(part.starts), codes.shape[1]
        keep = worth_keeping(criterion, len(feat_local), n_stats, n_nodes, n_columns)
        splits, stats, self._histograms = find_best_splits(
            codes, part.target, part.order, part.weight, part.starts, part.ends, feat_ptr,
            feat_local, feat_rank, is_categorical, n_stats, criterion, min_leaf, n_stats, reg_lambda, parents,
            self._histograms, keep)
        return splits, stats

    def record_leaves(self, values: np.ndarray) -> None:
        """Boosting's label holder: the open nodes' rows get their nodes' leaf weights `values`."""
        record_leaves(self.leaves, self._partition(), values)

    def leaf_values(self) -> np.ndarray:
        """Each row's leaf weight in each tree of the round, (len(trees), n_rows)."""
        return self.leaves

    def split_bits(self, pos: np.ndarray, c: NodeSplits) -> np.ndarray:
        """The `partition_bits` message of the nodes at `pos` under splits `c`: one bit per row, per node."""
        part = self._partition()
        starts, ends = part.starts[pos], part.ends[pos]
        offsets = offsets_from_lengths(node_byte_lengths(starts, ends))
        return pack_split_bits(self._codes(), part.order, starts, ends, c.feature[pos], c.bin[pos],
                               c.missing_left[pos], c.is_categorical[pos], c.cat_bits[pos], offsets)

    def load_ciphertexts(self, public: CiphertextSpace, ciphertexts: list, trees: int = 0) -> None:
        """Encrypted labels, or a round's (g, h) of `trees` (boosting): `PassiveCrypto` keeps them here."""

    def encrypted_bin_sums(self, crypto: PassiveCrypto, nodes: np.ndarray,
                           features: np.ndarray) -> tuple[list[tuple], np.ndarray]:
        """Encrypted labels: each (node, feature) job's bin sums (`PassiveCrypto.bin_sums`), node weights.

        Boosting's ciphertexts are per tree of the round (`PassiveCrypto.per_tree`): a node of the round's
        k-th tree, which holds every row once at positions k n_rows .. (k + 1) n_rows, reads the k-th block.
        """
        part, codes = self._partition(), self._codes()
        jobs = []
        for node, feature in zip(nodes.tolist(), features.tolist(), strict=True):
            s, e = int(part.starts[node]), int(part.ends[node])
            rows = part.order[s:e]
            block = (s // self.n_rows) * self.n_rows if crypto.per_tree else 0
            ciphertext_rows = rows.astype(np.int64) + block if block else rows
            jobs.append((ciphertext_rows, part.weight[s:e], codes[rows, feature]))
        node_weight = np.array([int(part.weight[a:b].sum())
                                for a, b in zip(part.starts, part.ends, strict=True)], np.int64)
        return crypto.bin_sums(jobs), node_weight

    def close(self) -> None:
        """Nothing to release in process."""

    def _partition(self) -> SamplePartition:
        assert self.partition is not None, "the protocol admits row work only after begin_batch"
        return self.partition

    def _codes(self) -> np.ndarray:
        assert self.codes is not None, "setup bins the features before growth"
        return self.codes
