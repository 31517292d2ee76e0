"""What every horizontal party holds whatever its algorithm.

Its own rows and labels, which open node each row sits in, the current level's candidate splits, and
per-branch counting over them.

Federated Extra-Trees (`fet/party.py`) and PPD-ERT (`ppdert/party.py`) parties each hold a `PartyRows` and add
their own protocol on top; neither inherits the other's handlers. Also shared: the session check of `hello`
(`check_hello`) and taking the finished forest (`receive_model`).

The row work itself runs in the numba kernels of `fedcore.trees.rowwork` (no per-row Python): rows are
grouped by open node (`RowPartition`), and counting is a histogram per node.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from fedcore.errors import ProtocolError
from fedcore.horizontal.fet.marginals import histogram_counts
from fedcore.horizontal.model import MODEL_INT_FIELDS, HorizontalForest
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.privacy import ldp_draws
from fedcore.protocol.messages import Arrays, Header, Message
from fedcore.trees import rowwork

if TYPE_CHECKING:
    from fedcore.compute.dask_rows import DaskPartyRows
    from fedcore.privacy.ldp import LabelLDP


class RowPartition:
    """Which open node of the current level each row sits in, per tree slot of the batch.

    The rows of open node p are `order[starts[p]:ends[p]]`, ascending; `node_slot[p]` is its tree slot
    (-1 for a position no child took). Slot s owns `order[s * n_rows:(s + 1) * n_rows]`; rows of nodes
    that became leaves stay there unreferenced. Memory: 4 bytes per (tree, row), plus 24 bytes per open node
    (less than the level's candidates and counts already take).
    """

    def __init__(self, n_rows: int) -> None:
        """No tree batch yet: an empty partition of `n_rows` rows."""
        self.n_rows = n_rows
        self.n_slots = 0
        self.order = np.zeros(0, dtype=np.int32)
        self.starts = np.zeros(0, dtype=np.int64)
        self.ends = np.zeros(0, dtype=np.int64)
        self.node_slot = np.zeros(0, dtype=np.int64)

    @property
    def n_open(self) -> int:
        """Number of open nodes at this level (positions 0 .. n_open - 1)."""
        return len(self.starts)

    def reset(self, n_trees: int) -> None:
        """A new batch: every row sits in the root of every tree; root t is open node t."""
        if self.n_rows >= 1 << 31 or n_trees * self.n_rows >= 1 << 62:
            raise ProtocolError(f"{self.n_rows} rows x {n_trees} trees do not fit the row partition")
        self.n_slots = n_trees
        self.order = np.tile(np.arange(self.n_rows, dtype=np.int32), n_trees)
        self.starts = np.arange(n_trees, dtype=np.int64) * self.n_rows
        self.ends = self.starts + self.n_rows
        self.node_slot = np.arange(n_trees, dtype=np.int64)

    def node_sizes(self) -> np.ndarray:
        """Number of rows in each open node."""
        return self.ends - self.starts

    def apply(self, X: np.ndarray, chosen: np.ndarray, next_pos: np.ndarray,
              features: np.ndarray, thresholds: np.ndarray) -> None:
        """Move rows into the children of the nodes that split, and out of the others.

        `chosen` is each node's candidate (-1: no split); child 2i / 2i + 1 (left / right) of the i-th split
        node becomes open node next_pos[...] (-1: a leaf).
        """
        chosen, next_pos = self.check_decisions(chosen, next_pos, features, thresholds)
        n_next = int(next_pos.max()) + 1 if len(next_pos) else 0
        self.starts, self.ends, self.node_slot = rowwork.split_nodes(
            self.order, self.starts, self.ends, self.node_slot, X, chosen, next_pos,
            np.ascontiguousarray(features, dtype=np.int64),
            np.ascontiguousarray(thresholds, dtype=np.float64), n_next)

    def check_decisions(self, chosen: np.ndarray, next_pos: np.ndarray, features: np.ndarray,
                        thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`apply`'s arguments as int64 arrays, refused (ProtocolError) unless they fit the open nodes."""
        chosen = np.asarray(chosen, dtype=np.int64)  # no copy when the message's are int64 already
        next_pos = np.asarray(next_pos, dtype=np.int64)
        if chosen.ndim != 1 or next_pos.ndim != 1 or len(chosen) != self.n_open \
                or len(next_pos) != 2 * int((chosen >= 0).sum()):
            raise ProtocolError(f"split decisions for {len(chosen)} nodes and {len(next_pos)} children do "
                                f"not match the {self.n_open} open nodes of the previous level")
        if len(next_pos) and (features.shape[0] != self.n_open or chosen.max() >= features.shape[1]
                              or thresholds.shape != features.shape):
            raise ProtocolError(f"split decisions name candidates outside the {features.shape} of the "
                                "previous level")
        opened = next_pos[next_pos >= 0]
        if opened.size and (opened.max() >= len(next_pos) or np.bincount(opened).max() > 1):
            raise ProtocolError("split decisions must put each open child in its own open node, numbered "
                                f"below the {len(next_pos)} children")
        return chosen, next_pos

    def ldp_report_sums(self, X: np.ndarray, permanent: np.ndarray, first_row: int,
                        candidates: tuple[np.ndarray, np.ndarray], ldp: LabelLDP, key: np.ndarray,
                        report: int) -> tuple[np.ndarray, np.ndarray]:
        """One fresh instant report per row in an open node per tree, added to the branch it takes.

        The rows (X, their permanent bits) are the party's rows first_row, first_row + 1, ...: each report
        is drawn at (row, tree slot, `report`) under `key` (`fedcore.privacy.ldp_draws`) and added under each
        candidate: bit sums (A * k * 2, n_bits) and sizes (A * k * 2,) int64. Integers drawn by position:
        the sums of blocks of rows add up to the whole table's exactly. What the in-process party and each
        Dask block run.
        """
        features, thresholds = candidates
        n_bits = permanent.shape[1]
        size = features.size * 2
        sums = np.zeros((size, n_bits), dtype=np.int64)
        sizes = np.zeros(size, dtype=np.int64)
        rowwork.ldp_report_sums(self.order, self.starts, self.ends, self.node_slot, X, features, thresholds,
                                np.ascontiguousarray(permanent, dtype=np.uint8), int(first_row),
                                ldp_draws.check_key(key), int(report), *ldp.instant_thresholds(), sums, sizes)
        return sums, sizes

    def active_slots_per_row(self) -> int:
        """The most trees any single row is active in (for per-row privacy accounting)."""
        if self.n_open == 0 or self.n_rows == 0:
            return 0
        return int(rowwork.rows_active_count(self.order, self.starts, self.ends, self.n_rows).max())


class PartyRows:
    """One horizontal party's rows (encoded with the agreed schema) and their labels.

    Also the row partition of the current tree batch and the current level's candidates (features and
    thresholds, (open nodes, k)).
    """

    def __init__(self, name: str, frame: pd.DataFrame, schema: HorizontalSchema) -> None:
        """Encode `frame` with the agreed schema; no batch or candidates yet."""
        self.name = name
        self.schema = schema
        # column order: the kernels scan one candidate feature over a node's rows, in ascending row order
        self.X = np.asfortranarray(schema.encode(frame), dtype=np.float64)
        self.y = schema.encode_labels(frame[schema.label])
        self.n_rows = len(self.X)
        self.partition = RowPartition(self.n_rows)
        self.features = np.zeros((0, 0), np.int64)
        self.thresholds = np.zeros((0, 0))
        self._in_batch = False
        self._codes: np.ndarray | None = None
        self._q: np.ndarray | None = None
        self._q_shift: int | None = None
        self.permanent: np.ndarray | None = None  # LDP: each row's permanent response (`draw_permanent`)

    def clear(self) -> None:
        """No batch in progress (a new session, or the finished model)."""
        self.partition = RowPartition(self.n_rows)
        self._in_batch = False

    def close(self) -> None:
        """Nothing to release in process (`DaskPartyRows.close` releases its blocks on the cluster)."""

    def start_level(self, header: Header, arrays: Arrays, n_open: int) -> None:
        """A level's request: reset the partition on a new batch, or apply the previous level's decisions.

        `new_batch`, `n_trees` start a batch; `chosen`, `next_pos` are the decisions. The request must cover
        the `n_open` nodes then open.
        """
        if header.get("new_batch"):
            n_trees = self.check_batch_start(header, n_open)
            self.partition.reset(n_trees)
            self._in_batch = True
        elif not self._in_batch:
            raise ProtocolError(f"party {self.name!r}: a level of a tree batch that was never started (the "
                                "first level of a batch carries new_batch)")
        else:
            self.partition.apply(self.X, *level_decisions(arrays), self.features, self.thresholds)
        if n_open != self.partition.n_open:
            raise ProtocolError(f"party {self.name!r}: the request covers {n_open} open nodes, "
                                f"{self.partition.n_open} are open")

    def check_batch_start(self, header: Header, n_open: int) -> int:
        """A new batch's tree count, refused unless the request covers that many roots.

        Checked before anything per tree (the partition: trees x rows) is allocated.
        """
        n_trees = header.int("n_trees", 1)
        if n_trees != n_open:
            raise ProtocolError(f"party {self.name!r}: a new batch of {n_trees} trees, but the request "
                                f"covers {n_open} open nodes")
        return n_trees

    def _args(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(order, starts, ends, X): the partition and rows every counting kernel reads."""
        part = self.partition
        return part.order, part.starts, part.ends, self.X

    def ranges(self) -> tuple[np.ndarray, np.ndarray]:
        """Min and max of each candidate feature over each open node's rows: two (A, k) float64.

        NaN ignored (+inf / -inf when there is no other value).
        """
        return rowwork.node_ranges(*self._args(), np.ascontiguousarray(self.features, dtype=np.int64))

    def _candidates(self) -> tuple[np.ndarray, np.ndarray]:
        """The level's candidate features (int64) and thresholds (float64), contiguous for the kernels."""
        return (np.ascontiguousarray(self.features, dtype=np.int64),
                np.ascontiguousarray(self.thresholds, dtype=np.float64))

    def class_counts(self, dtype: np.dtype | type | None = None) -> np.ndarray:
        """Exact per-branch class counts of every candidate of every open node.

        (A, k, 2, C), in `dtype`, by default the narrowest unsigned type that holds the party's row count (no
        count exceeds it).
        """
        if self._codes is None:
            self._codes = np.ascontiguousarray(self.y, dtype=np.int64)
        dtype = (np.dtype(dtype) if dtype is not None
                 else np.result_type(np.min_scalar_type(self.n_rows), np.uint16))
        if not np.issubdtype(dtype, np.integer) or self.n_rows > np.iinfo(dtype).max:
            raise ValueError(f"class counts of {self.n_rows} rows do not fit {dtype}")
        out = np.zeros((*self.features.shape, 2, int(self.schema.n_classes)), dtype=dtype)
        return rowwork.class_counts(*self._args(), self._codes, *self._candidates(), out)

    def regression_sums(self, q: np.ndarray) -> np.ndarray:
        """Per-branch (count, sum of integer targets q) of every candidate of every open node.

        (A, k, 2, 2) int64.
        """
        return rowwork.regression_sums(*self._args(), np.ascontiguousarray(q, dtype=np.int64),
                                       *self._candidates())

    def shifted_regression_sums(self, shift: int) -> np.ndarray:
        """`regression_sums` of the targets as int64 fixed point q = round(y * 2**shift).

        Exact in float64 sums: the master picks the shift so that |sum of q| over all rows stays below 2**52.
        """
        if self._q is None or self._q_shift != shift:
            self._q = np.rint(np.ldexp(self.y, shift)).astype(np.int64)
            self._q_shift = shift
        return self.regression_sums(self._q)

    def active_slots_per_row(self) -> int:
        """The most trees any single row is active in (for per-row privacy accounting)."""
        return self.partition.active_slots_per_row()

    def marginal_histograms(self, low: np.ndarray, high: np.ndarray, bins: int,
                            n_classes: int = 0) -> np.ndarray:
        """Rows per cell of each feature's `bins` equal cells of [low, high] (`fet/marginals.py`).

        `n_classes` > 0: per cell and class, (d, bins, n_classes) (plan marginals).
        """
        return histogram_counts(self.X, low, high, bins, self.y if n_classes else None, n_classes)

    def label_abs_max(self) -> float:
        """The largest |y| (a regression party's hello bounds its targets by it)."""
        return float(np.abs(self.y).max()) if self.n_rows else 0.0

    def rows_digest(self) -> str:
        """SHA-256 of the encoded rows and labels (an agent binds its checkpoints to it)."""
        return hashlib.sha256(np.ascontiguousarray(self.X).tobytes()
                              + np.ascontiguousarray(self.y).tobytes()).hexdigest()

    def draw_permanent(self, ldp: LabelLDP, key: np.ndarray) -> None:
        """Draw each row's permanent response under `key` (at hello): kept for the session's reports."""
        self.permanent = ldp.permanent_bits(self.y, self.schema.n_classes, key)

    def ldp_report_sums(self, ldp: LabelLDP, key: np.ndarray, report: int) -> tuple[np.ndarray, np.ndarray]:
        """The level's instant reports summed per branch (`RowPartition.ldp_report_sums`) over all rows."""
        assert self.permanent is not None, "hello draws the permanent responses before any report"
        return self.partition.ldp_report_sums(self.X, self.permanent, 0, self._candidates(), ldp, key, report)


def narrow(counts: np.ndarray) -> np.ndarray:
    """Integer counts in the narrowest integer type that holds them (unsigned when none is negative).

    Deep levels send bytes, not int64s. The master widens them back.
    """
    if counts.size == 0:
        return counts.astype(np.uint8)
    low, high = int(counts.min()), int(counts.max())
    unsigned, signed = (np.uint8, np.uint16, np.uint32, np.uint64), (np.int8, np.int16, np.int32, np.int64)
    for wire in unsigned if low >= 0 else signed:
        if np.iinfo(wire).min <= low and high <= np.iinfo(wire).max:
            return counts.astype(wire)
    raise ValueError(f"counts in [{low}, {high}] fit no 64-bit integer type")


def level_decisions(arrays: Arrays) -> tuple[np.ndarray, np.ndarray]:
    """A level request's decisions on the previous level: `chosen` and `next_pos`, signed integer arrays."""
    return arrays.typed("chosen", "i"), arrays.typed("next_pos", "i")


def check_hello(name: str, algorithm: str, schema: HorizontalSchema, header: dict) -> None:
    """A session's `hello` must name this party's algorithm and the agreed schema."""
    if header.get("algorithm") != algorithm:
        raise ProtocolError(f"party {name!r} runs {algorithm!r}, the master asked for "
                            f"{header.get('algorithm')!r}")
    if header.get("schema") != schema.fingerprint():
        raise ProtocolError(f"party {name!r}: the master's schema fingerprint differs from the party's; "
                            "both must use the same data contract (columns, categories, classes)")


def receive_model(name: str, algorithm: str, schema: HorizontalSchema, message: Message) -> HorizontalForest:
    """The complete forest of a `model` message, which must be one of this party's algorithm."""
    h = message.header
    if h.get("algorithm") != algorithm:
        raise ProtocolError(f"party {name!r} trained {algorithm!r}; the master sent a {h.get('algorithm')!r} "
                            "model")
    n_trees, task, a = h.int("n_trees", 0), h.text("task"), message.arrays
    n_nodes = len(a.typed("tree", "iu"))
    for field in MODEL_INT_FIELDS:
        a.typed(field, "iu", size=n_nodes)
    for field in ("threshold", "weight"):
        a.typed(field, "f", size=n_nodes)
    a.typed("value", "f", 2 if a["value"].ndim == 2 else 1, size=n_nodes)
    forest = HorizontalForest.from_arrays(a, n_trees=n_trees, task=task, algorithm=algorithm, schema=schema)
    return checked_structure(name, forest, schema.n_features)


def checked_structure(name: str, forest: HorizontalForest, n_features: int) -> HorizontalForest:
    """A forest from the master that this party may walk rows down: refused unless every tree is well formed.

    Trees in order, each split's children inside its tree and after it (so a walk ends), its feature one of
    the schema's, every leaf value finite: a master's cycle would otherwise hang `apply` (on a Dask worker,
    again at every lineage replay) and a NaN weight would reach the fixed-point margins.
    """
    tree = forest.tree.astype(np.int64)
    if forest.n_nodes and (np.any(np.diff(tree) < 0) or tree[0] < 0 or tree[-1] >= forest.n_trees):
        raise ProtocolError(f"party {name!r}: the master's trees are not numbered 0..{forest.n_trees - 1} "
                            "in order")
    offsets = forest.tree_offsets()
    local = np.arange(forest.n_nodes) - offsets[tree]
    size = np.diff(offsets)[tree]
    internal = forest.feature >= 0
    left, right = forest.left.astype(np.int64), forest.right.astype(np.int64)
    well_formed = ~internal | ((left > local) & (left < size) & (right > local) & (right < size)
                               & (forest.feature < n_features))
    if not np.all(well_formed):
        raise ProtocolError(f"party {name!r}: the master's trees have a split whose children are not after "
                            "it in its tree, or whose feature is not the schema's")
    if not np.all(np.isfinite(forest.value)):
        raise ProtocolError(f"party {name!r}: the master's trees have a leaf value that is not finite")
    return forest


def own_rows(name: str, frame: pd.DataFrame | None, schema: HorizontalSchema,
             rows: DaskPartyRows | None) -> PartyRows | DaskPartyRows:
    """A party's rows: `frame` encoded in process, or `rows` already on a Dask cluster (exactly one given)."""
    if (frame is None) == (rows is None):
        raise ValueError(f"party {name!r}: give its rows either as a frame or on a Dask cluster (rows=), "
                         "exactly one")
    return PartyRows(name, frame, schema) if frame is not None else rows  # type: ignore[return-value]
