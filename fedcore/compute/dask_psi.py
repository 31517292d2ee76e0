"""A vertical party's PSI on its own Dask workers: blinded, sorted and re-blinded block by block (issue #29).

Each block blinds its IDs where it is read (`blinded_ids`, the party's secret), and the blinded values go
to their key range with their row numbers (`dask_ranges.by_range`): the ranges in order are the party's
list sorted by value, which is exactly `PSIParty.outgoing` (its send order sorts the values). The agent
streams them range by range into its answer, repeated IDs are counted per range, and the master's
positions map to row numbers per range: the agent never holds every row's blinded ID. Re-blinding another
party's list runs chunk by chunk on the workers and streams back in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from fedcore.compute.dask_ranges import KEY_SIZE, by_range, key_frame, key_rows, repeats
from fedcore.compute.dask_table import ParquetTable, read_table_block, submit_blocks
from fedcore.errors import ParameterError
from fedcore.privacy._x25519_batch import scalarmult_chunk
from fedcore.privacy.psi import as_blinded, blinded_ids, checked_positions, refuse_duplicates

if TYPE_CHECKING:
    from distributed import Client


# -- what the workers run ------------------------------------------------------------------------------
def _blinded(block, table: ParquetTable, column: str, consortium: bytes | None, secret: bytes,
             n_ranges: int) -> pd.DataFrame:
    """The block's IDs blinded for PSI, as a `key_frame` with their row numbers in the table."""
    blinded = blinded_ids(read_table_block(block, table, [column])[column], consortium, secret)
    return key_frame(blinded, n_ranges, np.arange(block.start, block.start + len(blinded), dtype=np.int64))


def _rows_at(frame: pd.DataFrame, offsets: np.ndarray) -> np.ndarray:
    return frame["row"].to_numpy()[offsets]


def _reblind(values: np.ndarray, secret: bytes) -> np.ndarray:
    data = scalarmult_chunk(secret, np.ascontiguousarray(values).tobytes(), False)
    return np.frombuffer(data, np.uint8).reshape(-1, KEY_SIZE)


# -- the agent's side ----------------------------------------------------------------------------------
class BlockPSIParty:
    """`PSIParty` for a table on the workers: the same messages, made and kept there (see the module doc)."""

    def __init__(self, client: Client, name: str, table: ParquetTable, column: str, key: bytes | None,
                 secret: bytes, chunk_rows: int) -> None:
        """Blind the table's IDs on the workers and sort them into key ranges; repeated IDs are refused."""
        if table.n_rows == 0:
            raise ParameterError(f"PSI party {name!r} has no IDs; every party needs at least one ID")
        self.client, self.name, self.n_rows = client, name, table.n_rows
        self._secret, self._chunk_rows = secret, chunk_rows
        n = len(table.blocks)
        self._ranges = by_range(client, submit_blocks(client, _blinded, table, column=column, consortium=key,
                                                      secret=secret, n_ranges=n), n, with_rows=True)
        refuse_duplicates(name, sum(client.gather([client.submit(repeats, r, pure=False)
                                                   for r in self._ranges])), self.n_rows)
        sizes = client.gather([client.submit(len, r, pure=False) for r in self._ranges])
        self._starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    def __repr__(self) -> str:  # never show IDs or the secret
        """The name and row count only."""
        return f"BlockPSIParty({self.name!r}, {self.n_rows} rows)"

    def outgoing(self) -> Iterator[np.ndarray]:
        """`PSIParty.outgoing` in parts: the ranges' blinded values in order, each gathered when asked for."""
        for part in self._ranges:
            yield key_rows(self.client.gather(part))

    def reblind(self, parts: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        """`PSIParty.reblind` of a list in parts (a whole list: one part): the re-blinded chunks, in order.

        Every part is taken and checked before this returns (a message is read whole before its answer
        starts), the agent holding one at a time: each is cut into chunks that go straight to a worker
        (`client.scatter`: no task spec, which an in-process scheduler would keep, holds the values) and are
        re-blinded there; the answer gathers the re-blinded chunks in order, each let go once sent.
        """
        what, futures = f"PSI party {self.name!r} asked to re-blind", []
        for part in parts:
            part = as_blinded(part, what)
            for start in range(0, len(part), self._chunk_rows):
                chunk = self.client.scatter(part[start:start + self._chunk_rows], hash=False)
                futures.append(self.client.submit(_reblind, chunk, self._secret, pure=False))
        futures.reverse()
        return (self.client.gather(futures.pop()) for _ in range(len(futures)))

    def rows_from_positions(self, positions: np.ndarray) -> np.ndarray:
        """`PSIParty.rows_from_positions`: each range maps the positions that fall in it on its worker."""
        pos = checked_positions(self.name, positions, self.n_rows)
        where = np.searchsorted(self._starts, pos, side="right") - 1
        grouped = np.argsort(where, kind="stable")
        edges = np.searchsorted(where[grouped], np.arange(len(self._ranges) + 1))
        rows = np.empty(len(pos), np.int64)
        futures = {}
        for r in range(len(self._ranges)):
            if edges[r + 1] > edges[r]:
                picked = grouped[edges[r]:edges[r + 1]]
                offsets = pos[picked] - self._starts[r]
                futures[r] = (picked, self.client.submit(_rows_at, self._ranges[r], offsets, pure=False))
        for picked, future in futures.values():
            rows[picked] = self.client.gather(future)
        return rows

    def close(self) -> None:
        """Let the workers drop the ranges."""
        self._ranges = []
