"""A vertical party's Parquet table on its Dask workers: ID hashes, aligned blocks (issue #29).

The agent holds the table's metadata (`ParquetTable`). Each block hashes its own IDs (`hash_ids`, the
same keyed hash) and keeps them on its worker; the workers count IDs repeated across blocks (the digests
regrouped into as many sorted key ranges as there are blocks by Dask's shuffle, `dask_ranges`), and
the agent streams the digests block by block, in block order, into its answer (`hash_parts`): the
in-process answer byte for byte, without the agent ever holding more than one block of them (issue #29).

Alignment puts the training rows in the master's canonical order, which is a keyed pseudo-random
permutation of the table's rows: training block k holds canonical training rows [k*block_rows,
(k+1)*block_rows), gathered from every table block that has some of them. Each table block reads its rows
once and cuts them into one piece per training block and per held-out block (the held-out rows, a
`training.holdout` share, are blocks of the same size in their own canonical order); a small task per
(table block, target block) pair picks the piece, and one task per target block puts its pieces in
canonical order. Every future is made by a task, so a lost worker's blocks are rebuilt from lineage. Only
the label holder's training labels (one column, which the protocol needs at the agent: it exports or
encrypts them) and, at evaluation, its held-out labels are gathered into the agent.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from fedcore.compute.dask_ranges import by_range, key_frame, repeats
from fedcore.compute.dask_table import ParquetTable, read_table_block, submit_blocks
from fedcore.errors import InputError
from fedcore.privacy.hashing import DIGEST_SIZE, hash_ids

if TYPE_CHECKING:
    from distributed import Client, Future


# -- what the workers run ------------------------------------------------------------------------------
def _hashes(block, table: ParquetTable, column: str, secret: bytes) -> np.ndarray:
    """The block's IDs' keyed digests (`hash_ids` with the consortium key `secret`), in row order."""
    return hash_ids(read_table_block(block, table, [column])[column], secret)


def _cut(block, table: ParquetTable, rows: list[np.ndarray], columns: list[str]) -> list[pd.DataFrame]:
    """The block's `columns`, read once and cut into pieces of the given row numbers (within the block)."""
    frame = read_table_block(block, table, columns)
    return [frame.iloc[r].reset_index(drop=True) for r in rows]


def _pick(pieces: list[Any], i: int) -> Any:
    return pieces[i]


def _assemble(order: np.ndarray, *pieces: pd.DataFrame) -> pd.DataFrame:
    """A training block: its pieces (table blocks in order) put in canonical order."""
    return pd.concat(pieces, ignore_index=True).iloc[order].reset_index(drop=True)


def _select(frame: pd.DataFrame, name: str) -> pd.Series:
    return frame[name]


def _keys(digests: np.ndarray, n_ranges: int) -> pd.DataFrame:
    return key_frame(digests, n_ranges)


def _as_rows(digests: np.ndarray) -> np.ndarray:
    """`S32` digests as the message's uint8 rows of 32 (a view)."""
    return np.ascontiguousarray(digests).view(np.uint8).reshape(len(digests), DIGEST_SIZE)


# -- the agent's side ----------------------------------------------------------------------------------
def hash_parts(client: Client, table: ParquetTable, column: str, key: bytes) -> list[Future]:
    """Every block's digests (`S32`), hashed and kept on the workers, in table order (`gathered` reads them).

    An ID repeated in two blocks is refused here (counted on the workers), as `hash_ids` refuses one
    repeated within a block.
    """
    parts = submit_blocks(client, _hashes, table, column=column, secret=key)
    n = len(parts)
    ranges = by_range(client, [client.submit(_keys, part, n, pure=False) for part in parts], n)
    repeated = sum(client.gather([client.submit(repeats, r, pure=False) for r in ranges]))
    del ranges
    if repeated:
        raise InputError(f"{table.what}: ID column {column!r} has {repeated} IDs that occur more than once "
                         "after normalisation (in different blocks of its files); each row needs a unique ID")
    return parts


def gathered(client: Client, parts: list[Future]) -> Iterator[np.ndarray]:
    """The blocks' digests as uint8 rows of 32, in order, each gathered only when asked for.

    So an answer streamed from them holds one block's digests at a time in the agent.
    """
    for part in parts:
        yield _as_rows(client.gather(part))


def block_hashes(client: Client, table: ParquetTable, column: str, key: bytes) -> np.ndarray:
    """Every row's digest (`S32`) in table order: `hash_parts` joined (for callers that need them all)."""
    parts = gathered(client, hash_parts(client, table, column, key))
    rows = np.concatenate([np.zeros((0, DIGEST_SIZE), np.uint8), *parts])
    return rows.view(f"S{DIGEST_SIZE}").ravel()


@dataclass
class Blocks:
    """Rows on the workers: block i is future `frames[i]` (made by a task) of `sizes[i]` rows."""

    frames: list[Future]
    sizes: list[int]

    @property
    def n_rows(self) -> int:
        """Rows in all the blocks."""
        return sum(self.sizes)

    def column(self, client: Client, name: str) -> list[Future]:
        """One column of the blocks, as futures (made by tasks) in block order."""
        return [client.submit(_select, f, name, pure=False) for f in self.frames]

    def gathered(self, client: Client, name: str) -> pd.Series:
        """One column of the blocks, gathered into the agent in row order (a label column)."""
        return gather_series(client, self.column(client, name))


@dataclass
class AlignedBlocks(Blocks):
    """A party's aligned rows on the workers: its training blocks, then its held-out ones.

    Training block k holds canonical training rows [k*block_rows, ...); `held`, the held-out rows in
    canonical order (as `align_frame(...)[holdout]` gives them), in blocks of the same size.
    """

    held: Blocks
    columns: list[str]


def gather_series(client: Client, parts: list[Future]) -> pd.Series:
    """Blocks of one column, gathered into the agent and put end to end."""
    return pd.concat(client.gather(parts), ignore_index=True)


Targets = list[tuple[list[int], np.ndarray]]
"""Per target block: the table blocks it takes rows from, and the order of its pieces' rows."""


class _Plan:
    """Where the table rows given in canonical order go: target block k holds [k*block_rows, ...).

    Per table block, its rows each target block takes (row numbers within the block, in canonical order);
    per target block, the table blocks it takes rows from and the order that puts their pieces (table
    blocks in order) in canonical order. Made one target block at a time as the rows arrive (`add`, in
    parts of any size), so that no temporary array spans every row (issue #29: the agent's memory).
    """

    def __init__(self, table: ParquetTable, block_rows: int) -> None:
        """An empty plan over the blocks of `table`."""
        self._starts = np.array([b.start for b in table.blocks], np.int64)
        self._block_rows = block_rows
        self.within: list[list[np.ndarray]] = [[] for _ in range(len(self._starts))]
        self.targets: Targets = []
        self._pending: list[np.ndarray] = []
        self._n_pending = 0

    def add(self, rows: np.ndarray) -> None:
        """The next rows in canonical order; every full target block among those pending is planned."""
        self._pending.append(rows)
        self._n_pending += len(rows)
        while self._n_pending >= self._block_rows:
            self._target(self._take(self._block_rows))

    def finish(self) -> _Plan:
        """Plan the last, partial target block (if any rows are left); the plan itself."""
        if self._n_pending:
            self._target(self._take(self._n_pending))
        return self

    def _take(self, n: int) -> np.ndarray:
        """The first `n` pending rows (a copy of at most `n` rows, only when they span parts)."""
        taken = []
        while n > 0:
            head = self._pending[0]
            if len(head) <= n:
                taken.append(self._pending.pop(0))
            else:
                taken.append(head[:n])
                self._pending[0] = head[n:]
            n -= len(taken[-1])
            self._n_pending -= len(taken[-1])
        return taken[0] if len(taken) == 1 else np.concatenate(taken)

    def _target(self, chunk: np.ndarray) -> None:
        n_blocks = len(self._starts)
        source = np.searchsorted(self._starts, chunk, side="right") - 1
        by_block = np.argsort(source, kind="stable")  # offsets in the chunk grouped by table block, ascending
        edges = np.concatenate([[0], np.cumsum(np.bincount(source, minlength=n_blocks))])
        for b in range(n_blocks):
            self.within[b].append((chunk[by_block[edges[b]:edges[b + 1]]] - self._starts[b]).astype(np.int32))
        sources = [b for b in range(n_blocks) if edges[b + 1] > edges[b]]
        self.targets.append((sources, np.argsort(by_block, kind="stable").astype(np.int32)))


def _assembled(client: Client, cut: list[Future], targets: Targets, first: int) -> Blocks:
    """The target blocks of one plan, from the table blocks' pieces `first`, `first + 1`, ..."""
    frames, sizes = [], []
    for k, (sources, order) in enumerate(targets):
        picks = [client.submit(_pick, cut[b], first + k, pure=False) for b in sources]
        frames.append(client.submit(_assemble, order, *picks, pure=False))
        sizes.append(len(order))
    return Blocks(frames, sizes)


def align_blocks(client: Client, table: ParquetTable, positions: np.ndarray, holdout: np.ndarray,
                 id_column: str, block_rows: int, keep_id: bool = False) -> AlignedBlocks:
    """The rows at the master's (checked) `positions`, split by the `holdout` mask (see the module doc).

    Each table block reads its rows once and cuts its pieces of every training block, then of every
    held-out block. `keep_id`: the blocks keep the ID column (a prediction batch's, delivered with the
    predictions).
    """
    plans = AlignmentPlans(table, block_rows)
    plans.add(positions, holdout)
    return plans.blocks(client, id_column, keep_id)


class AlignmentPlans:
    """`align_blocks` with the positions in parts (the master's request read part by part, issue #29)."""

    def __init__(self, table: ParquetTable, block_rows: int) -> None:
        """No positions yet; target blocks of `block_rows` rows over the blocks of `table`."""
        self.table = table
        # a row's index in positions[~holdout] (positions[holdout]) is its canonical training (held-out)
        # position
        self._train, self._held = _Plan(table, block_rows), _Plan(table, block_rows)

    def add(self, positions: np.ndarray, holdout: np.ndarray) -> None:
        """The next (checked) positions and their holdout mask (bool or 0/1)."""
        holdout = holdout.astype(bool, copy=False)
        self._train.add(positions[~holdout])
        self._held.add(positions[holdout])

    def blocks(self, client: Client, id_column: str, keep_id: bool = False) -> AlignedBlocks:
        """The aligned blocks, once every part was added: their tasks submitted to the workers."""
        table = self.table
        columns = [c for c in table.columns if keep_id or c != id_column]
        train, held = self._train.finish(), self._held.finish()
        pieces = [a + b for a, b in zip(train.within, held.within, strict=True)]
        cut = submit_blocks(client, _cut, table, pieces, columns=columns)
        del pieces
        train.within, held.within = [], []
        trained = _assembled(client, cut, train.targets, 0)
        return AlignedBlocks(trained.frames, trained.sizes, _assembled(client, cut, held.targets,
                                                                       len(train.targets)), columns)
