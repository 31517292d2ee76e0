"""The party role in vertical Federated Forest: holds some columns (and maybe the label) of aligned rows
and answers the master's requests without letting raw values, bin edges or thresholds out.
"""

from __future__ import annotations

import hashlib
import hmac

import numpy as np
import pandas as pd

from fedcore.data.binning import PartyBinner
from fedcore.errors import ProtocolError
from fedcore.protocol.messages import Message, pack_bits
from fedcore.trees.criteria import SQUARED_ERROR, n_stats
from fedcore.trees.partition import (
    SamplePartition,
    node_byte_lengths,
    offsets_from_lengths,
    pack_split_bits,
    scatter_node_bytes,
)
from fedcore.trees.predictor import ThresholdIndex, encode_columns, leaf_row_sets, route_step
from fedcore.trees.splitting import NodeSplits, find_best_splits
from fedcore.trees.structure import PartialForest, PartySplits


def opaque_feature_id(key: bytes, column: str) -> str:
    """The id under which a column is known outside its party: HMAC-SHA256(key, name), 16 hex digits."""
    return hmac.new(key, column.encode(), hashlib.sha256).hexdigest()[:16]


class VerticalParty:
    """One institution's agent: its columns, optionally the label, and the protocol handlers."""

    def __init__(self, name: str, frame: pd.DataFrame, label: str | None = None, feature_key: bytes = b"") -> None:
        self.name = name
        self.label = label
        self.is_label_holder = label is not None
        self.features = frame.drop(columns=[label]) if label is not None else frame
        self._label_values = frame[label] if label is not None else None
        self.feature_key = feature_key
        self.classes_: np.ndarray | None = None
        self._binner: PartyBinner | None = None
        self._codes: np.ndarray | None = None
        self._y = np.zeros(0, np.float64)  # class codes or regression targets
        self._global_to_local = np.zeros(0, np.int64)
        self._partition: SamplePartition | None = None
        self._candidates: NodeSplits | None = None
        self._own_bits = np.zeros(0, np.uint8)
        self._splits: list[PartySplits] = []
        self._criterion = 0
        self._n_stats = 0
        self.model: PartialForest | None = None
        self._predict_X: np.ndarray | None = None

    # -- dispatch -------------------------------------------------------------------------------
    def handle(self, message: Message) -> Message:
        """Answer one protocol message."""
        handler = getattr(self, f"_on_{message.kind}", None)
        if handler is None:
            raise ProtocolError(f"party {self.name!r} cannot handle message kind {message.kind!r}")
        return handler(message)

    # -- setup ----------------------------------------------------------------------------------
    def _on_setup(self, message: Message) -> Message:
        h = message.header
        self._criterion = int(h["criterion"])
        self._binner = PartyBinner(max_bins=int(h["max_bins"]), random_state=int(h["binning_seed"])).fit(self.features)
        self._codes = self._binner.transform(self.features)
        ids = np.array([opaque_feature_id(self.feature_key, str(c)) for c in self.features.columns], dtype=object)
        header = {"n_rows": len(self.features), "label_holder": self.is_label_holder}
        if self.is_label_holder:
            if self._criterion == SQUARED_ERROR:
                self._y = self._label_values.to_numpy(dtype=np.float64)
                header["n_classes"] = 0
            else:
                self.classes_, codes = np.unique(self._label_values.to_numpy(), return_inverse=True)
                self._y = codes.astype(np.float64)
                header["n_classes"] = len(self.classes_)
        return Message("setup_reply", header, {"feature_ids": ids.astype(str)})

    def _on_export_labels(self, message: Message) -> Message:
        if not self.is_label_holder:
            raise ProtocolError(f"party {self.name!r} holds no label")
        y = self._y if self._criterion == SQUARED_ERROR else self._y.astype(np.int32)
        return Message("labels", {}, {"y": y})

    def _on_configure(self, message: Message) -> Message:
        global_index = message.arrays["global_index"].astype(np.int64)
        self._global_to_local = np.full(int(message.header["n_features"]), -1, dtype=np.int64)
        self._global_to_local[global_index] = np.arange(len(global_index))
        self._n_stats = n_stats(self._criterion, int(message.header["n_classes"]))
        if "y" in message.arrays:
            self._y = message.arrays["y"].astype(np.float64)
        return Message("ack")

    # -- growth ---------------------------------------------------------------------------------
    def _on_begin_batch(self, message: Message) -> Message:
        h = message.header
        self._partition = SamplePartition.bootstrap(int(h["seed"]), list(h["trees"]), self._y, h["n_draws"])
        self._candidates = None
        return Message("ack")

    def _apply_previous_splits(self, arrays: dict[str, np.ndarray], my_index: int) -> None:
        split_mask = arrays["split_mask"].astype(bool)
        owners = arrays["split_owner"].astype(np.int64)
        idx = np.flatnonzero(split_mask)
        lengths = node_byte_lengths(self._partition.starts[idx], self._partition.ends[idx])
        pieces = [(owners == my_index, self._own_bits)]
        for key, blob in arrays.items():
            if key.startswith("bits_"):
                pieces.append((owners == int(key[5:]), blob))
        packed, offsets = scatter_node_bytes(pieces, lengths)
        self._partition.split(split_mask, packed, offsets)

    def _on_find_splits(self, message: Message) -> Message:
        a, h = message.arrays, message.header
        if "split_mask" in a:
            self._apply_previous_splits(a, int(h["party_index"]))
        part = self._partition
        feat_local = self._global_to_local[a["feat_global"].astype(np.int64)].astype(np.int32)
        if np.any(feat_local < 0):
            raise ProtocolError(f"party {self.name!r} was asked about features it does not hold")
        out = find_best_splits(
            self._codes, part.target, part.order, part.weight, part.starts, part.ends,
            a["feat_ptr"].astype(np.int64), feat_local, a["feat_rank"].astype(np.int32),
            self._binner.is_categorical, self._n_stats, self._criterion,
            float(h["min_samples_leaf"]), self._n_stats,
        )
        self._candidates, stats = out
        arrays = {"gain": self._candidates.gain, "rank": self._candidates.rank}
        if self.is_label_holder:
            arrays["stats"] = stats
        return Message("local_best", {}, arrays)

    def _on_apply_splits(self, message: Message) -> Message:
        a = message.arrays
        pos = a["positions"].astype(np.int64)
        c, part = self._candidates, self._partition
        starts, ends = part.starts[pos], part.ends[pos]
        offsets = offsets_from_lengths(node_byte_lengths(starts, ends))
        self._own_bits = pack_split_bits(
            self._codes, part.order, starts, ends, c.feature[pos], c.bin[pos], c.missing_left[pos],
            c.is_categorical[pos], c.cat_bits[pos], offsets,
        )
        self._splits.append(PartySplits(
            tree=a["tree"].astype(np.int32), node=a["node"].astype(np.int32), feature=c.feature[pos],
            bin=c.bin[pos], missing_left=c.missing_left[pos], is_categorical=c.is_categorical[pos],
            cat_bits=c.cat_bits[pos],
        ))
        return Message("partition_bits", {}, {"bits": self._own_bits})

    def _on_finalize(self, message: Message) -> Message:
        a = message.arrays
        self._partition = None
        self._candidates = None
        self.model = build_partial_forest(
            a["tree"], a["node"], a["left"], a["right"], int(message.header["n_trees"]),
            PartySplits.concatenate(self._splits), self._binner,
        )
        self._splits = []
        return Message("ack", {"owned_nodes": int(np.sum(self.model.feature >= 0))})

    # -- prediction -----------------------------------------------------------------------------
    def set_prediction_data(self, frame: pd.DataFrame) -> None:
        """Load the rows to predict (aligned with the other parties'); they never leave this party."""
        self._predict_X = encode_columns(frame, self.model.column_names, self.model.column_categories)
        m = self.model
        self._threshold_index = ThresholdIndex(m.feature, m.threshold, m.is_categorical, len(m.column_names))

    def _on_predict_leaves(self, message: Message) -> Message:
        m = self._require_prediction_model()
        start, stop = int(message.header["start"]), int(message.header["stop"])
        leaf_offsets, _, slot = m.leaves()
        X = np.asfortranarray(self._predict_X[start:stop])
        prefix, missing = self._threshold_index.bitmaps(X)
        sets = leaf_row_sets(
            X, prefix, missing, self._threshold_index.node_row, m.tree_offsets(), m.left, m.right, m.feature,
            m.missing_left, m.is_categorical, m.cat_bits, leaf_offsets, slot,
        )
        return Message("leaf_sets", {}, {"sets": sets})

    def _on_route(self, message: Message) -> Message:
        m = self._require_prediction_model()
        rows, nodes = message.arrays["rows"].astype(np.int64), message.arrays["nodes"].astype(np.int64)
        bits = route_step(self._predict_X, rows, nodes, m.feature, m.threshold, m.missing_left,
                          m.is_categorical, m.cat_bits)
        return Message("route_bits", {}, {"bits": pack_bits(bits)})

    def _require_prediction_model(self) -> PartialForest:
        if self.model is None or self._predict_X is None:
            raise ProtocolError(f"party {self.name!r} has no model or no prediction data loaded")
        return self.model


def build_partial_forest(tree, node, left, right, n_trees: int, splits: PartySplits, binner: PartyBinner) -> PartialForest:
    """Combine the master's structure with this party's own splits into its partial model."""
    n = len(tree)
    key = tree.astype(np.int64) * (1 << 32) + node.astype(np.int64)
    own_key = splits.tree.astype(np.int64) * (1 << 32) + splits.node.astype(np.int64)
    where = np.searchsorted(key, own_key)
    if len(own_key) and (np.any(where >= n) or np.any(key[np.minimum(where, n - 1)] != own_key)):
        raise ProtocolError("the forest structure does not contain every node this party split")
    feature = np.full(n, -1, np.int32)
    threshold = np.full(n, np.nan)
    missing_left = np.zeros(n, np.bool_)
    is_cat = np.zeros(n, np.bool_)
    cat_bits = np.zeros((n, 4), np.uint64)
    feature[where] = splits.feature
    missing_left[where] = splits.missing_left
    is_cat[where] = splits.is_categorical
    cat_bits[where] = splits.cat_bits
    for i, w in enumerate(where):
        if not splits.is_categorical[i]:
            threshold[w] = binner.columns[splits.feature[i]].threshold_value(int(splits.bin[i]))
    return PartialForest(
        tree=tree.astype(np.int32), node=node.astype(np.int32), left=left.astype(np.int32),
        right=right.astype(np.int32), feature=feature, threshold=threshold, missing_left=missing_left,
        is_categorical=is_cat, cat_bits=cat_bits, n_trees=n_trees,
        column_names=[c.name for c in binner.columns],
        column_categories=[c.categories if c.is_categorical else None for c in binner.columns],
    )
