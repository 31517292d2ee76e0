"""Vertical Federated Forest with encrypted labels (Paillier or Okamoto-Uchiyama).

The label holder's and the passive parties' steps.

Once per training the label holder encrypts, per sample, its label statistics packed into one plaintext
(the one-hot of classes 1..C-1, or a fixed-point target q) and the master relays the
ciphertexts. Per level, a passive party sums them per node, feature and bin (homomorphically), adds each
bin's total weight (class 0's count follows from it), packs several bins per ciphertext and returns them
with a layout sealed for the label holder. The label holder decrypts, scans
every split with the plain kernel's code (`best_splits_from_histograms`) and returns gains to the master
and, per node, the chosen split sealed for the party that owns the feature. Passive parties never hold the
decryption key and never see a plaintext label or statistic; the master sees only ciphertexts, sealed
blobs, gains and partition bitmaps, as in plain mode.

Boosting (SecureBoost) takes the same steps with each round's gradients in place of labels: the label holder
encrypts every row's (g, h) of the round, on the round's grid (`fedcore.trees.fixed_gradients`) and packed as
(q_g + 2^P, q_h), the passive parties sum them per node, feature and bin as above (ciphertexts per tree of
the round, every row weight 1), and the label holder decodes the exact integer sums to the float sums plain
mode adds up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fedcore.errors import ProtocolError
from fedcore.privacy.gmp_workers import (
    GmpWorkers,
    balanced_chunks,
    default_worker_count,
    encrypt_over_workers,
)
from fedcore.privacy.homomorphic import AdditivePrivateKey, CiphertextSpace
from fedcore.privacy.packing import (
    SlotLayout,
    encrypted_bin_sums,
    pack_bin_sums,
    weight_powers,
    weight_powers_bytes,
)
from fedcore.privacy.sealed import SealedChannel, arrays_to_bytes, bytes_to_arrays
from fedcore.trees.criteria import SQUARED_ERROR, VALUE_STATISTICS
from fedcore.trees.fixed_gradients import GradientGrid, slot_widths
from fedcore.trees.level_histograms import subtraction_plan
from fedcore.trees.splitting import NodeSplits, best_splits_from_histograms

FIXED_POINT_BITS = 20
"""Fraction bits of a non-integer regression target (integer targets are encoded exactly)."""
MAX_INTEGER_TARGET_BITS = 40
"""Integer targets spanning fewer bits than this are encoded exactly, at scale 1."""

_CHOICE = np.dtype([("feature", "<i4"), ("bin", "<i4"), ("missing_left", "u1"), ("is_categorical", "u1"),
                    ("cat_bits", "<u8", (4,))])
CHOICE_RECORD_BYTES = _CHOICE.itemsize + 16  # one sealed split choice: record plus Poly1305 tag


@dataclass(frozen=True)
class TargetEncoding:
    """How the label holder turns labels into slot integers, and slot sums back into split statistics."""

    criterion: int
    n_classes: int = 0
    offset: tuple[int, int] = (0, 1)  # regression: y_min as an integer ratio (numerator, denominator)
    scale: int = 1  # regression: q = (y - y_min) * scale

    @classmethod
    def for_labels(cls, y: np.ndarray, criterion: int, n_classes: int) -> tuple[TargetEncoding, np.ndarray]:
        """The encoding and the (n_rows, n_slots) integer values each sample encrypts.

        The one-hot of classes 1..C-1, or q (squared error's splits need only (w, wy): `criteria`). Class 0's
        count, or the weight, follows from the bin's total weight, which the passive party adds.
        """
        if criterion != SQUARED_ERROR:
            codes = y.astype(np.int64)
            values = np.zeros((len(y), max(n_classes - 1, 1)), dtype=object)
            above = codes > 0
            values[np.flatnonzero(above), codes[above] - 1] = 1
            return cls(criterion, n_classes), values
        y = np.asarray(y, dtype=np.float64)
        low = float(y.min()) if len(y) else 0.0
        integral = (bool(np.all(y == np.round(y)))
                    and float(y.max() - low if len(y) else 0) < 2.0**MAX_INTEGER_TARGET_BITS)
        scale = 1 if integral else 1 << FIXED_POINT_BITS
        if integral:
            q = [int(v) - int(low) for v in y.tolist()]
        else:
            q = [round((v - low) * scale) for v in y.tolist()]
        values = np.array(q, dtype=object).reshape(len(q), 1)
        return cls(criterion, 0, low.as_integer_ratio(), scale), values

    @property
    def n_stats(self) -> int:
        """Length of the plain kernel's statistics vector."""
        return 2 if self.criterion == SQUARED_ERROR else self.n_classes

    def statistics(self, sums: np.ndarray) -> np.ndarray:
        """Exact slot sums plus total weight to the float64 statistics the plain kernel would accumulate.

        `sums` holds Python ints, (n_bins, n_slots + 1).
        """
        if self.criterion != SQUARED_ERROR:
            out = np.empty((len(sums), self.n_classes), dtype=np.float64)
            for row, values in enumerate(sums.tolist()):
                counts = values[: self.n_classes - 1] if self.n_classes > 1 else []
                out[row] = [values[-1] - sum(counts), *counts]
            return out
        (a, d), s = self.offset, self.scale
        out = np.empty((len(sums), 2), dtype=np.float64)
        for row, (s1, s0) in enumerate(sums.tolist()):
            out[row, 0] = float(s0)
            out[row, 1] = (s0 * a * s + s1 * d) / (d * s)
        return out


class LabelHolderCrypto:
    """The label holder's side: the private key, the encoding, and a sealed channel per passive party."""

    def __init__(self, key: AdditivePrivateKey) -> None:
        """The label holder's state under `key`: no encoding, layout or channels until setup."""
        self.key = key
        self.encoding: TargetEncoding | GradientGrid | None = None
        self.layout: SlotLayout | None = None
        self.channels: dict[str, SealedChannel] = {}
        self.sequence = 0  # evaluation rounds so far; both ends of every channel count them
        # last level's histograms per party
        self._previous: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}

    def encrypt_labels(self, y: np.ndarray, criterion: int, n_classes: int, max_weight: int) -> np.ndarray:
        """Per sample, one ciphertext of its packed label statistics, as (n_rows, width) bytes."""
        self.encoding, values = TargetEncoding.for_labels(y, criterion, n_classes)
        self.layout = SlotLayout.for_values(values, max_weight, self.key.public)
        public = self.key.public
        return public.to_bytes(encrypt_over_workers(self.key, self.layout.encode(values)))

    def gradient_layout(self, n_rows: int) -> None:
        """Boosting: the slot layout of every round's (g, h) of `n_rows` rows (no row is encrypted yet).

        Refuses (ProtocolError) a key whose plaintext cannot hold one bin of every row's sums.
        """
        slot_bits, top = slot_widths(n_rows)
        layout = SlotLayout(2, slot_bits, top, self.key.public.plaintext_bits)
        if layout.bin_bits(n_rows) > layout.plaintext_bits:
            raise ProtocolError(f"encrypted gradients of {n_rows} rows need {layout.bin_bits(n_rows)}-bit "
                                f"plaintexts, the key holds {layout.plaintext_bits}: use a larger key")
        self.layout = layout

    def encrypt_gradients(self, grid: GradientGrid, integers: np.ndarray) -> np.ndarray:
        """Boosting: one ciphertext per tree of the round and row, (n_trees x n_rows, width) bytes.

        `integers` (n_trees, n_rows, 2) are the round's (g, h) on `grid`, which decodes this round's sums.
        """
        assert self.layout is not None, "gradient_layout comes first (export_labels)"
        self.encoding = grid
        slots = grid.slots(integers.reshape(-1, 2))
        return self.key.public.to_bytes(encrypt_over_workers(self.key, self.layout.encode(slots)))

    def announcement(self) -> dict:
        """What passive parties need: the public key and the slot layout."""
        assert self.layout is not None, "encrypt_labels or gradient_layout sets the layout, first"
        return {"public_key": self.key.public.to_json(), "layout": self.layout.to_json()}

    def _encoded(self) -> tuple[TargetEncoding | GradientGrid, SlotLayout]:
        """The label encoding and slot layout of `encrypt_labels`, which the protocol runs before any use."""
        assert self.encoding is not None and self.layout is not None, "encrypt_labels sets both, first"
        return self.encoding, self.layout

    def evaluate(self, party: str, packed: np.ndarray, sealed: np.ndarray, totals: np.ndarray,
                 node_rows: np.ndarray, min_leaf: float, n_class_orderings: int,
                 reg_lambda: float = 0.0) -> tuple[NodeSplits, np.ndarray]:
        """Decrypt one passive party's histograms of this level.

        Its best split per node, plus each node's choice sealed for that party ((n_nodes, CHOICE_RECORD_BYTES)
        uint8). `reg_lambda`: gradient statistics' L2 term (boosting).
        """
        encoding, layout = self._encoded()
        channel = self.channels.get(party)
        if channel is None:
            raise ProtocolError(f"the label holder has no sealed channel with {party!r}")
        layout_arrays = bytes_to_arrays(channel.open(np.asarray(sealed, np.uint8).tobytes(), self.sequence))
        plan = _HistogramPlan.from_arrays(layout_arrays, len(totals))
        node_weight = np.rint(totals[:, 0] if encoding.criterion in VALUE_STATISTICS else totals.sum(axis=1))
        if not np.array_equal(plan.node_weight, node_weight.astype(np.int64)):
            raise ProtocolError(f"the histogram layout of {party!r} disagrees with the label holder on node "
                                "sizes")
        ciphertexts = self.key.public.from_bytes(packed, f"encrypted histograms of {party!r}")
        node_weights = np.repeat(plan.node_weight[plan.pair_node], np.diff(plan.hist_ptr)).tolist()
        sums = layout.unpack(self.key.decrypt(ciphertexts), node_weights, plan.bin_weight.tolist())
        histograms = plan.histograms(sums, self._previous.get(party, []))
        self._previous[party] = histograms
        hist_ptr = np.concatenate([[0], np.cumsum([len(b) for b, _ in histograms], dtype=np.int64)])
        width = layout.n_slots + 1
        bins = np.concatenate([b for b, _ in histograms]) if histograms else np.zeros(0, np.uint8)
        stats = np.concatenate([v for _, v in histograms]) if histograms else np.zeros((0, width), object)
        statistics = encoding.statistics(stats.reshape(len(bins), width)).reshape(len(bins), encoding.n_stats)
        splits = best_splits_from_histograms(
            hist_ptr, bins, statistics, plan.pair_node, plan.categorical, totals, node_rows, plan.feat_ptr,
            plan.feat_local, plan.feat_rank, encoding.criterion, min_leaf, n_class_orderings, reg_lambda,
        )
        return splits, self._seal_choices(channel, splits)

    def _seal_choices(self, channel: SealedChannel, splits: NodeSplits) -> np.ndarray:
        records = np.zeros(len(splits.gain), dtype=_CHOICE)
        records["feature"], records["bin"] = splits.feature, splits.bin
        records["missing_left"], records["is_categorical"] = splits.missing_left, splits.is_categorical
        records["cat_bits"] = splits.cat_bits
        sealed = [channel.seal(record.tobytes(), self.sequence, slot) for slot, record in enumerate(records)]
        return np.frombuffer(b"".join(sealed), np.uint8).reshape(len(records), CHOICE_RECORD_BYTES)


class EncryptedRows(Protocol):
    """Where a passive party's samples are (`fedcore.vertical.rows.LocalRows` or `DaskVerticalRows`)."""

    def node_sizes(self) -> np.ndarray:
        """Distinct in-bag rows of each open node."""
        ...

    def encrypted_bin_sums(self, crypto: PassiveCrypto, nodes: np.ndarray,
                           features: np.ndarray) -> tuple[list[tuple], np.ndarray]:
        """`encrypted_bin_sums` of each (node, feature) job over its node's samples; each node's weight."""
        ...


class PassiveCrypto:
    """A passive party's side: the public key, the label ciphertexts, and its channel to the label holder."""

    def __init__(self, public: CiphertextSpace, layout: SlotLayout, ciphertexts: list, channel: SealedChannel,
                 workers: int | None = None, powers_budget: int | None = None, local: bool = True,
                 rows: int | None = None) -> None:
        """`workers`: processes for the bin sums.

        By default one per core for large tables, else none, and no more than `powers_budget` bytes hold:
        each keeps Enc(y)^w for w = 1..3 (`weight_powers_bytes`). `local` False: the party's rows, and the
        bin sums, are on a Dask cluster (`fedcore.compute.dask_vertical`), so this process keeps no powers.
        `rows`: the rows the workers are sized for when `ciphertexts` come later (boosting's `load_round`).
        """
        self.public = public
        self.layout = layout
        self.channel = channel
        if not local:
            workers = 0
            ciphertexts = []
        if workers is None:
            rows = len(ciphertexts) if rows is None else rows
            each = weight_powers_bytes(public.ciphertext_bytes, rows)
            workers = default_worker_count(rows, each, powers_budget)
        self.pool = GmpWorkers(workers) if workers > 1 else None
        if self.pool is not None:  # each worker keeps its own Enc(y)^w; this process needs none
            self.powers: list[list] = []
            self.pool.all("load_labels", public.to_json(), list(ciphertexts))
        else:
            # Enc(y)^w for w = 1..3; powers[0] are the ciphertexts
            self.powers = weight_powers(public, ciphertexts)
        self.local = local
        self.per_tree = False  # boosting: a round's ciphertexts, n_rows per tree of the round (`load_round`)
        self.sequence = 0  # find_splits rounds so far
        # last level: each pair's (node, feature), node -1 where it has no histogram
        self._previous: tuple[np.ndarray, np.ndarray] | None = None
        self.pairs_computed = 0
        self.pairs_derived = 0
        """Histograms summed here, and those the label holder derives by subtraction (for reports)."""

    def load_round(self, ciphertexts: list) -> None:
        """Boosting: this round's (g, h) ciphertexts, tree after tree, in place of the last round's.

        Every row weighs 1 (no bootstrap), so no powers beyond the ciphertexts themselves are kept. Not
        `local` (rows on Dask): the party's rows take them (`DaskVerticalRows.load_ciphertexts`), none here.
        """
        self.per_tree = True
        if self.pool is not None:
            self.pool.all("load_labels", self.public.to_json(), list(ciphertexts))
        elif self.local:
            self.powers = weight_powers(self.public, ciphertexts, largest=1)

    def histograms(self, rows: EncryptedRows, feat_ptr: np.ndarray, feat_local: np.ndarray,
                   feat_rank: np.ndarray, is_categorical: np.ndarray,
                   parents: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Packed encrypted histograms of every (node, candidate feature) and their sealed layout.

        `rows` computes the bin sums over the party's samples (in process, or per block on Dask).
        `parents` are the previous level's positions of the nodes that split into this level's sibling
        pairs (None on a batch's first level). Where both siblings and their parent consider a feature,
        only the smaller sibling's histogram is computed: the label holder subtracts it from the parent's.
        """
        self.sequence += 1
        pair_node = np.repeat(np.arange(len(feat_ptr) - 1, dtype=np.int64), np.diff(feat_ptr))
        node_rows = rows.node_sizes()
        derive_from, sibling = subtraction_plan(feat_ptr, feat_local, node_rows, parents, self._previous)
        self.pairs_derived += int(np.sum(derive_from >= 0))
        job_pairs = [q for q, node in enumerate(pair_node.tolist())
                     if node_rows[node] >= 2 and derive_from[q] < 0]  # as the plain kernel; or derived
        job_nodes = [int(pair_node[q]) for q in job_pairs]
        results, node_weight = rows.encrypted_bin_sums(self, np.array(job_nodes, np.int64),
                                                       feat_local[job_pairs].astype(np.int64))
        bins, sums, totals, bin_node_weights = [], [], [], []
        counts = np.zeros(len(feat_local), np.int64)
        for q, node, (pair_bins, pair_sums, pair_totals) in zip(job_pairs, job_nodes, results, strict=True):
            bins.append(pair_bins)
            sums.extend(pair_sums)
            totals.extend(pair_totals)
            bin_node_weights.extend([int(node_weight[node])] * len(pair_bins))
            counts[q] = len(pair_bins)
        self.pairs_computed += len(job_pairs)
        plan = {
            "hist_ptr": np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]),
            "bins": np.concatenate(bins) if bins else np.zeros(0, np.uint8),
            "feat_ptr": feat_ptr.astype(np.int64), "feat_local": feat_local.astype(np.int32),
            "feat_rank": feat_rank.astype(np.int32),
            "categorical": is_categorical[feat_local].astype(np.bool_), "derive_from": derive_from,
            "sibling": sibling, "node_weight": node_weight,
            # sealed, not packed: half the bits per bin; in the narrowest unsigned type that holds them
            "bin_weight": np.array(totals, np.min_scalar_type(max(totals, default=0))),
        }
        self._previous = (np.where(node_rows[pair_node] >= 2, pair_node, -1), feat_local.astype(np.int64))
        packed = self.public.to_bytes(pack_bin_sums(self.public, sums, bin_node_weights, self.layout)) \
            if sums else np.zeros((0, self.public.ciphertext_bytes), np.uint8)
        sealed = self.channel.seal(arrays_to_bytes(plan), self.sequence - 1)
        return packed, np.frombuffer(sealed, np.uint8)

    def bin_sums(self, jobs: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> list[tuple]:
        """`encrypted_bin_sums` of each (rows, weights, bins) job, in order.

        Here, or split by rows over the worker processes.
        """
        if self.pool is None:
            return [encrypted_bin_sums(self.public, self.powers, *job) for job in jobs]
        chunks = [c for c in balanced_chunks([len(job[0]) for job in jobs], self.pool.count) if len(c)]
        answers = self.pool.each("bin_sums", [([jobs[i] for i in chunk],) for chunk in chunks])
        out: list = [None] * len(jobs)
        for chunk, answer in zip(chunks, answers, strict=True):
            for i, result in zip(chunk.tolist(), answer, strict=True):
                out[i] = result
        return out

    def close(self) -> None:
        """Stop the worker processes, if any."""
        if self.pool is not None:
            self.pool.close()

    def open_choices(self, records: np.ndarray, positions: np.ndarray, n_nodes: int) -> NodeSplits:
        """The label holder's split choices for the nodes at `positions` (other nodes stay empty)."""
        records = np.asarray(records, np.uint8)
        if records.shape != (len(positions), CHOICE_RECORD_BYTES):
            raise ProtocolError(f"split choices must be ({len(positions)}, {CHOICE_RECORD_BYTES}) bytes, "
                                f"got {list(records.shape)}")
        out = NodeSplits(
            gain=np.full(n_nodes, -np.inf), rank=np.full(n_nodes, -1, np.int32),
            feature=np.full(n_nodes, -1, np.int32), bin=np.zeros(n_nodes, np.int32),
            missing_left=np.zeros(n_nodes, np.bool_), is_categorical=np.zeros(n_nodes, np.bool_),
            cat_bits=np.zeros((n_nodes, 4), np.uint64),
        )
        for row, position in zip(records, positions.tolist(), strict=True):
            record = np.frombuffer(self.channel.open(row.tobytes(), self.sequence - 1, position), _CHOICE)[0]
            out.feature[position], out.bin[position] = record["feature"], record["bin"]
            out.missing_left[position] = bool(record["missing_left"])
            out.is_categorical[position] = bool(record["is_categorical"])
            out.cat_bits[position] = record["cat_bits"]
        return out


@dataclass
class _HistogramPlan:
    """A passive party's layout of one level's histograms, checked before the label holder uses it."""

    hist_ptr: np.ndarray
    bins: np.ndarray
    feat_ptr: np.ndarray
    feat_local: np.ndarray
    feat_rank: np.ndarray
    categorical: np.ndarray
    pair_node: np.ndarray
    derive_from: np.ndarray
    sibling: np.ndarray
    node_weight: np.ndarray
    bin_weight: np.ndarray

    def histograms(self, sums: np.ndarray, previous: list[tuple[np.ndarray, np.ndarray]]
                   ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per pair: (bins, slot sums), decrypted or derived as parent minus smaller sibling."""
        out = [(self.bins[a:b], sums[a:b])
               for a, b in zip(self.hist_ptr[:-1], self.hist_ptr[1:], strict=True)]
        for q in np.flatnonzero(self.derive_from >= 0).tolist():
            parent, sibling = int(self.derive_from[q]), int(self.sibling[q])
            if not (parent < len(previous) and 0 <= sibling < len(out) and self.derive_from[sibling] < 0):
                raise ProtocolError("malformed histogram layout: a derived histogram names no usable parent "
                                    "or sibling")
            parent_bins, parent_sums = previous[parent]
            child_bins, child_sums = out[sibling]
            where = np.searchsorted(parent_bins, child_bins)
            if len(child_bins) and (where.max() >= len(parent_bins)
                                    or np.any(parent_bins[where] != child_bins)):
                raise ProtocolError("malformed histogram layout: a sibling has bins its parent lacks")
            derived = parent_sums.copy()
            derived[where] -= child_sums
            out[q] = (parent_bins, derived)
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], n_nodes: int) -> _HistogramPlan:
        try:
            feat_ptr = arrays["feat_ptr"].astype(np.int64)
            hist_ptr = arrays["hist_ptr"].astype(np.int64)
            plan = cls(hist_ptr, arrays["bins"].astype(np.uint8), feat_ptr,
                       arrays["feat_local"].astype(np.int32), arrays["feat_rank"].astype(np.int32),
                       arrays["categorical"].astype(np.bool_),
                       (np.repeat(np.arange(n_nodes, dtype=np.int64), np.diff(feat_ptr))
                        if len(feat_ptr) == n_nodes + 1 else np.zeros(0, np.int64)),
                       arrays["derive_from"].astype(np.int64),
                       arrays["sibling"].astype(np.int64), arrays["node_weight"].astype(np.int64),
                       arrays["bin_weight"].astype(np.int64))
            if arrays["bin_weight"].dtype.kind not in "iu":
                raise ValueError(f"bin weights must be integers, got {arrays['bin_weight'].dtype}")
        except (KeyError, ValueError) as error:
            raise ProtocolError(f"malformed histogram layout: {error}") from error
        n_pairs = len(plan.feat_local)
        if (len(feat_ptr) != n_nodes + 1 or feat_ptr[0] != 0 or feat_ptr[-1] != n_pairs
                or np.any(np.diff(feat_ptr) < 0)
                or len(hist_ptr) != n_pairs + 1 or hist_ptr[0] != 0 or hist_ptr[-1] != len(plan.bins)
                or np.any(np.diff(hist_ptr) < 0) or len(plan.feat_rank) != n_pairs
                or len(plan.categorical) != n_pairs
                or len(plan.derive_from) != n_pairs or len(plan.sibling) != n_pairs
                or len(plan.node_weight) != n_nodes or len(plan.bin_weight) != len(plan.bins)):
            raise ProtocolError("malformed histogram layout: pointers do not match the level's nodes and "
                                "bins")
        running = np.concatenate([[0], np.cumsum(plan.bin_weight)])
        pair_weight, computed = running[hist_ptr[1:]] - running[hist_ptr[:-1]], np.diff(hist_ptr) > 0
        if np.any(plan.bin_weight < 1) or not np.array_equal(pair_weight[computed],
                                                              plan.node_weight[plan.pair_node][computed]):
            raise ProtocolError("malformed histogram layout: bin weights do not add up to their node's "
                                "weight")
        return plan
