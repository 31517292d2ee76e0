"""A horizontal party's rows on a Dask cluster: `DaskPartyRows`, a drop-in for `PartyRows`.

The rows live on the workers as one future per block (`fedcore.compute.blocks`): the block's encoded X
(float64, column order) and labels, read and encoded by the worker itself for a Parquet source, or
encoded there from an in-memory frame's rows given inline in the task. Which open node each of a block's
rows sits in is a future too,
the block's `RowPartition`: a new batch's is made from the block's row count, and each level's from the
previous level's and the master's decisions, by a task that copies it first (a task never changes its
inputs). Nothing lives on a worker outside futures, so when a worker is lost Dask rebuilds its blocks and
partitions from their lineage (reading the Parquet row group again, replaying the levels' decisions).
The level's decisions and candidates travel inside the tasks (the scheduler keeps them with the task, so
the lineage holds them); when they are large they go once into a task of their own, held until the batch
ends.

Per level, the per-node statistics are one task per block over every open node of every tree of the
batch, run by the same numba kernels as in process (`fedcore.trees.rowwork`), and combined here in block
order:

* class counts and regression (count, sum of q) sums: integer sums, so any order gives the in-process
  counts exactly, in the same integer type;
* minima and maxima: block by block, an equal value replacing the current one, as the kernel does row by
  row, so even the sign of a zero is the in-process one;
* LDP bit sums and branch sizes: int64 sums of reports whose random words are addressed by (report, tree
  slot, row) position (`fedcore.privacy.ldp_draws`), so a block draws exactly its rows' words; each block's
  permanent responses are drawn on its worker at hello (a future per block, rebuilt from lineage like the
  rows).

So the party's replies, and the forest, are the in-process party's, for any number of workers and any
placement of the blocks.

The agent process holds the blocks' descriptions, the futures and the level's small arrays; the rows and
their partitions stay on the workers.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from fedcore.compute import DEFAULT_BLOCK_ROWS
from fedcore.compute.blocks import (
    Block,
    encode_block,
    frame_blocks,
    load_block,
    parquet_blocks,
    rebuildable,
)
from fedcore.compute.level_clock import LevelClock
from fedcore.errors import ProtocolError
from fedcore.horizontal.fet.marginals import histogram_counts
from fedcore.horizontal.rows import RowPartition, level_decisions
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.trees import rowwork

if TYPE_CHECKING:
    from distributed import Client, Future

    from fedcore.compute.dask_table import ParquetTable
    from fedcore.privacy.ldp import LabelLDP
    from fedcore.protocol.messages import Arrays, Header

INLINE_BYTES = 16 << 20
"""A level's arrays travel inside each block's task up to this many bytes over all blocks (else in a task
of their own)."""


# -- what the workers run (module functions: pickled by reference) -------------------------------------
def _reset(n_rows: int, n_trees: int) -> RowPartition:
    """A new batch: every row of the block in the root of every tree."""
    part = RowPartition(n_rows)
    part.reset(n_trees)
    return part


def _apply(part: RowPartition, data: tuple[np.ndarray, np.ndarray], decisions: tuple) -> RowPartition:
    """The block's partition after a level's decisions, on a copy (the input future stays as it was)."""
    chosen, next_pos, features, thresholds = decisions
    new = RowPartition(part.n_rows)
    new.n_slots, new.starts, new.ends, new.node_slot = part.n_slots, part.starts, part.ends, part.node_slot
    new.order = part.order.copy()
    new.apply(data[0], chosen, next_pos, features, thresholds)
    return new


def _ranges(part: RowPartition, data: tuple[np.ndarray, np.ndarray],
            features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return rowwork.node_ranges(part.order, part.starts, part.ends, data[0], features)


def _class_counts(part: RowPartition, data: tuple[np.ndarray, np.ndarray], candidates: tuple,
                  n_classes: int) -> np.ndarray:
    features, thresholds = candidates
    dtype = np.result_type(np.min_scalar_type(part.n_rows), np.uint16)
    out = np.zeros((*features.shape, 2, n_classes), dtype=dtype)
    return rowwork.class_counts(part.order, part.starts, part.ends, data[0], data[1], features, thresholds,
                                out)


def _regression_sums(part: RowPartition, data: tuple[np.ndarray, np.ndarray], candidates: tuple,
                     shift: int) -> np.ndarray:
    features, thresholds = candidates
    q = np.rint(np.ldexp(data[1], shift)).astype(np.int64)  # as `PartyRows.shifted_regression_sums`
    return rowwork.regression_sums(part.order, part.starts, part.ends, data[0], q, features, thresholds)


# LDP's keys travel as `words_key`: `Client.submit` takes `key` for itself
def _permanent(data: tuple[np.ndarray, np.ndarray], first_row: int, ldp: LabelLDP, n_classes: int,
               words_key: np.ndarray) -> np.ndarray:
    """The block's permanent LDP responses: rows first_row, first_row + 1, ... of the party."""
    return ldp.permanent_bits(data[1], n_classes, words_key, first_row)


def _ldp_report_sums(part: RowPartition, data: tuple[np.ndarray, np.ndarray], permanent: np.ndarray,
                     first_row: int, candidates: tuple, ldp: LabelLDP, words_key: np.ndarray,
                     report: int) -> tuple[np.ndarray, np.ndarray]:
    return part.ldp_report_sums(data[0], permanent, first_row, candidates, ldp, words_key, report)


def _active_slots(part: RowPartition) -> int:
    return part.active_slots_per_row()


def _histograms(data: tuple[np.ndarray, np.ndarray], low: np.ndarray, high: np.ndarray,
                bins: int, n_classes: int) -> np.ndarray:
    return histogram_counts(data[0], low, high, bins, data[1] if n_classes else None, n_classes)


def _abs_max(data: tuple[np.ndarray, np.ndarray]) -> float:
    return float(np.abs(data[1]).max()) if len(data[1]) else 0.0


def _digest(data: tuple[np.ndarray, np.ndarray]) -> bytes:
    X, y = data
    return hashlib.sha256(np.ascontiguousarray(X).tobytes() + np.ascontiguousarray(y).tobytes()).digest()


def _n_rows(data: tuple[np.ndarray, np.ndarray]) -> int:
    return len(data[1])


def _placed(client: Client, tasks: list[tuple]) -> list[Future]:
    """One future per (function, *args) task, an equal share of consecutive ones per worker.

    Dask would place these first tasks as workers free up, unevenly; a lost worker's blocks may still be
    rebuilt anywhere.
    """
    workers = sorted(client.scheduler_info().get("workers", {}))
    # no workers known yet (the scheduler has none at this moment): Dask places them; it refuses
    # allow_other_workers without workers
    return [client.submit(*task, pure=False, workers=[workers[i * len(workers) // len(tasks)]] if workers
                          else None, allow_other_workers=bool(workers))
            for i, task in enumerate(tasks)]


class _OpenNodes(RowPartition):
    """The agent's view of the blocks' partitions: how many nodes are open (the same in every block).

    A partition of no rows with `n_open` open nodes, so that `check_decisions` checks a level's decisions
    here, once, as the in-process party does.
    """

    def __init__(self, n_open: int = 0) -> None:
        super().__init__(0)
        self.starts = self.ends = np.zeros(n_open, dtype=np.int64)


class DaskPartyRows:
    """One horizontal party's rows on a Dask cluster, with `PartyRows`' interface (see the module doc).

    Build it with `from_frame` (an in-memory frame in blocks of `block_rows`, each inline in its task),
    `from_parquet` (a Parquet file or dataset folder the workers read themselves) or `from_parquet_kept`
    (Parquet blocks keeping the rows a mask marks: an agent's training rows).
    """

    def __init__(self, name: str, schema: HorizontalSchema, client: Client, blocks: Sequence[Block],
                 data: Sequence[Future]) -> None:
        """Rows already on the cluster: one (X, y) future per block, in block order."""
        self.name = name
        self.schema = schema
        self.client = client
        self.blocks = list(blocks)
        self.data = list(data)
        self.n_rows = sum(b.n_rows for b in self.blocks)
        self.submit_order = list(range(len(self.blocks)))
        """The order blocks' tasks are submitted in (results are combined in block order whatever it is)."""
        self.partition = _OpenNodes()
        self.parts: list[Future] = []
        self._held: list[Future] = []  # the batch's large level arrays (boosting: the round's trees)
        self.permanent: list[Future] | None = None  # LDP: each block's permanent responses (`draw_permanent`)
        self.features = np.zeros((0, 0), np.int64)
        self.thresholds = np.zeros((0, 0))
        self._in_batch = False
        self.clock = LevelClock(name)
        """Each level's wall time, logged per tree batch (progress at the agent)."""
        self.rounds: list[tuple[float, list[str]]] = []
        """Each per-block round: its wall time (first submit to gather) and the keys of its tasks (benchmarks
        compare the two for the scheduling overhead)."""
        self._pending: list[str] = []
        self._round_start: float | None = None

    @classmethod
    def from_frame(cls, name: str, frame: pd.DataFrame, schema: HorizontalSchema, client: Client,
                   block_rows: int = DEFAULT_BLOCK_ROWS) -> DaskPartyRows:
        """An in-memory frame in blocks of `block_rows` rows, each encoded by a worker.

        Each block's rows travel inside the task that encodes them (the scheduler keeps a copy), so a lost
        worker's blocks are encoded again from it: scattered rows would have no lineage.
        """
        blocks = frame_blocks(len(frame), block_rows)
        columns = [*schema.names, schema.label]
        missing = [c for c in columns if c not in frame.columns]
        if missing:  # as `schema.encode` says, before anything reaches the cluster
            schema.encode(frame.iloc[:0])
        data = _placed(client, [(encode_block, frame.iloc[b.start:b.stop][columns], schema) for b in blocks])
        client.gather(client.map(_n_rows, data, pure=False))  # encoded: errors surface here
        return cls(name, schema, client, blocks, data)

    @classmethod
    def from_parquet(cls, name: str, source: str | os.PathLike, schema: HorizontalSchema, client: Client,
                     block_rows: int = DEFAULT_BLOCK_ROWS) -> DaskPartyRows:
        """A Parquet file or dataset folder, each block read and encoded by the worker that holds it."""
        blocks = parquet_blocks(source, block_rows)
        data = _placed(client, [(load_block, b, schema) for b in blocks])
        counts = client.gather(client.map(_n_rows, data, pure=False))
        assert counts == [b.n_rows for b in blocks], "a block read another number of rows than its metadata"
        return cls(name, schema, client, blocks, data)

    @classmethod
    def from_parquet_kept(cls, name: str, table: ParquetTable, keep: Sequence[np.ndarray],
                          schema: HorizontalSchema, client: Client) -> DaskPartyRows:
        """A table's blocks of which each keeps the rows its packed mask marks (an agent's training rows).

        The party's blocks are the kept rows, in block order, read as every other block read is
        (`fedcore.compute.dask_table.training_rows`: the whole table's dtypes, dates as numbers): the table
        the in-process party trains on.
        """
        from fedcore.compute.dask_table import reader, training_rows

        small = reader(table)
        data = _placed(client, [(training_rows, b, small, k, schema)
                                for b, k in zip(table.blocks, keep, strict=True)])
        counts = client.gather(client.map(_n_rows, data, pure=False))
        kept, start = [], 0
        for block, n in zip(table.blocks, counts, strict=True):
            kept.append(Block(block.index, start, start + n))
            start += n
        return cls(name, schema, client, kept, data)

    # -- the cluster ---------------------------------------------------------------------------------
    def _map(self, func: Callable, *per_block: Sequence, **shared: Any) -> list[Future]:
        """One task per block, submitted in `submit_order`; the futures in block order."""
        if self._round_start is None:
            self._round_start = time.perf_counter()
        futures: list[Any] = [None] * len(self.blocks)
        for i in self.submit_order:
            futures[i] = self.client.submit(func, *(args[i] for args in per_block), pure=False, **shared)
        self._pending.extend(f.key for f in futures)
        return futures

    def _gather(self, futures: list[Future]) -> list:
        """The blocks' results, in block order."""
        results = self.client.gather(futures)
        started = self._round_start if self._round_start is not None else time.perf_counter()
        self.rounds.append((time.perf_counter() - started, self._pending))
        self._pending, self._round_start = [], None
        return results

    def _shared(self, value: tuple[np.ndarray, ...] | np.ndarray) -> Any:
        """A level's arrays as every block's task takes them.

        Inline in the tasks while their copies, one per block, stay within `INLINE_BYTES` (no round trip to
        the scheduler; the scheduler keeps them with the tasks, so the partitions' lineage holds them);
        larger ones once, in a task of their own (`_once`).
        """
        if self._round_start is None:
            self._round_start = time.perf_counter()
        arrays = value if isinstance(value, tuple) else (value,)
        if sum(a.nbytes for a in arrays) * max(len(self.blocks), 1) <= INLINE_BYTES:
            return value
        return self._once(value)

    def _once(self, value: Any) -> Future:
        """`value` once on the cluster for many tasks: in a task of its own, held until a new batch starts.

        `blocks.rebuildable`: rebuilt like any task when a worker is lost, which a scattered value is not.
        """
        future = self.client.submit(rebuildable, value, pure=False)
        self._held.append(future)
        return future

    def close(self) -> None:
        """Release every future of this party (its rows leave the workers)."""
        self.data, self.parts, self._held, self.permanent = [], [], [], None

    def __getstate__(self) -> dict:
        """A fitted estimator's party pickles without the cluster: only training used the rows."""
        state = self.__dict__.copy()
        state.update(client=None, data=[], parts=[], _held=[], permanent=None)
        return state

    # -- PartyRows' interface ---------------------------------------------------------------------------
    def clear(self) -> None:
        """No batch in progress (a new session, or the finished model)."""
        self.clock.end_batch(self.client, len(self.blocks))
        self.parts, self._held = [], []
        self.partition = _OpenNodes()
        self._in_batch = False

    def start_level(self, header: Header, arrays: Arrays, n_open: int) -> None:
        """As `PartyRows.start_level`: a new batch's partitions, or the previous level's decisions applied."""
        if header.get("new_batch"):
            self.clock.end_batch(self.client, len(self.blocks))
        elif not self._in_batch:
            raise ProtocolError(f"party {self.name!r}: a level of a tree batch that was never started (the "
                                "first level of a batch carries new_batch)")
        self.clock.level()
        if header.get("new_batch"):
            n_trees = self.check_batch_start(header, n_open)
            largest = max((b.n_rows for b in self.blocks), default=0)
            if largest >= 1 << 31 or n_trees * largest >= 1 << 62:
                raise ProtocolError(f"{largest} rows x {n_trees} trees do not fit the row partition")
            self._held = []
            self.parts = self._map(_reset, [b.n_rows for b in self.blocks], n_trees=n_trees)
            self.partition = _OpenNodes(n_trees)
            self._in_batch = True
        else:
            chosen, next_pos = self.partition.check_decisions(*level_decisions(arrays),
                                                              self.features, self.thresholds)
            decisions = self._shared((chosen, next_pos, np.ascontiguousarray(self.features, dtype=np.int64),
                                       np.ascontiguousarray(self.thresholds, dtype=np.float64)))
            self.parts = self._map(_apply, self.parts, self.data, decisions=decisions)
            self.partition = _OpenNodes(int(next_pos.max()) + 1 if len(next_pos) else 0)
        if n_open != self.partition.n_open:
            raise ProtocolError(f"party {self.name!r}: the request covers {n_open} open nodes, "
                                f"{self.partition.n_open} are open")

    def check_batch_start(self, header: dict, n_open: int) -> int:
        """A new batch's tree count, refused unless the request covers that many roots."""
        n_trees = int(header["n_trees"])
        if n_trees != n_open:
            raise ProtocolError(f"party {self.name!r}: a new batch of {n_trees} trees, but the request "
                                f"covers {n_open} open nodes")
        return n_trees

    def _candidates(self) -> Any:
        return self._shared((np.ascontiguousarray(self.features, dtype=np.int64),
                              np.ascontiguousarray(self.thresholds, dtype=np.float64)))

    def ranges(self) -> tuple[np.ndarray, np.ndarray]:
        """Min and max of each candidate feature over each open node's rows, combined in block order."""
        features = self._shared(np.ascontiguousarray(self.features, dtype=np.int64))
        low = np.full(self.features.shape, np.inf)
        high = np.full(self.features.shape, -np.inf)
        for block_low, block_high in self._gather(self._map(_ranges, self.parts, self.data,
                                                            features=features)):
            # as the kernel, row by row: an equal value replaces the current one (the sign of a zero)
            low = np.where(block_low <= low, block_low, low)
            high = np.where(block_high >= high, block_high, high)
        return low, high

    def class_counts(self, dtype: np.dtype | type | None = None) -> np.ndarray:
        """Exact per-branch class counts, (A, k, 2, C), in `PartyRows.class_counts`' integer type."""
        dtype = (np.dtype(dtype) if dtype is not None
                 else np.result_type(np.min_scalar_type(self.n_rows), np.uint16))
        if not np.issubdtype(dtype, np.integer) or self.n_rows > np.iinfo(dtype).max:
            raise ValueError(f"class counts of {self.n_rows} rows do not fit {dtype}")
        total = np.zeros((*self.features.shape, 2, int(self.schema.n_classes)), dtype=np.int64)
        for counts in self._gather(self._map(_class_counts, self.parts, self.data,
                                             candidates=self._candidates(),
                                             n_classes=int(self.schema.n_classes))):
            total += counts
        return total.astype(dtype)

    def shifted_regression_sums(self, shift: int) -> np.ndarray:
        """Per-branch (count, sum of round(y * 2**shift)), (A, k, 2, 2) int64, summed over blocks."""
        total = np.zeros((*self.features.shape, 2, 2), dtype=np.int64)
        for sums in self._gather(self._map(_regression_sums, self.parts, self.data,
                                           candidates=self._candidates(), shift=int(shift))):
            total += sums
        return total

    def active_slots_per_row(self) -> int:
        """The most trees any single row is active in: the largest over the blocks."""
        if self.partition.n_open == 0 or self.n_rows == 0:
            return 0
        return max(self._gather(self._map(_active_slots, self.parts)), default=0)

    def marginal_histograms(self, low: np.ndarray, high: np.ndarray, bins: int,
                            n_classes: int = 0) -> np.ndarray:
        """`PartyRows.marginal_histograms`, one task per block: exact integer counts, summed."""
        total = np.zeros((len(low), bins, n_classes) if n_classes else (len(low), bins), dtype=np.int64)
        for counts in self._gather(self._map(_histograms, self.data, low=low, high=high, bins=bins,
                                             n_classes=n_classes)):
            total += counts
        return total

    def label_abs_max(self) -> float:
        """The largest |y| (regression's hello), over the blocks."""
        return max(self.client.gather(self._map(_abs_max, self.data)), default=0.0)

    def rows_digest(self) -> str:
        """A digest of the training rows (the agent's checkpoints): SHA-256 over the blocks' digests.

        Not the in-process party's digest (that one hashes the whole table at once): checkpoints taken in
        process start over on a cluster, and the other way round.
        """
        digest = hashlib.sha256(b"dask-blocks")
        for block, part in zip(self.blocks, self.client.gather(self._map(_digest, self.data)), strict=True):
            digest.update(f"{block.n_rows}:".encode() + part)
        return digest.hexdigest()

    def draw_permanent(self, ldp: LabelLDP, key: np.ndarray) -> None:
        """Each block's permanent LDP responses, drawn and kept on its worker (`PartyRows.draw_permanent`)."""
        ldp.check_classes(self.schema.n_classes)  # a bad mechanism is refused here, not on every worker
        self.permanent = self._map(_permanent, self.data, [b.start for b in self.blocks], ldp=ldp,
                                   n_classes=int(self.schema.n_classes), words_key=key)
        drawn = self._gather(self._map(len, self.permanent))  # drawn (errors surface here)
        assert drawn == [b.n_rows for b in self.blocks], "a block drew another number of responses than rows"

    def ldp_report_sums(self, ldp: LabelLDP, key: np.ndarray, report: int) -> tuple[np.ndarray, np.ndarray]:
        """The level's instant reports summed per branch: one task per block, int64 sums in block order."""
        assert self.permanent is not None, "hello draws the permanent responses before any report"
        n_bits = ldp.bits_for(self.schema.n_classes)
        sums = np.zeros((self.features.size * 2, n_bits), dtype=np.int64)
        sizes = np.zeros(self.features.size * 2, dtype=np.int64)
        for block_sums, block_sizes in self._gather(self._map(
                _ldp_report_sums, self.parts, self.data, self.permanent, [b.start for b in self.blocks],
                candidates=self._candidates(), ldp=ldp, words_key=key, report=int(report))):
            sums += block_sums
            sizes += block_sizes
        return sums, sizes
