"""32-byte keys (ID digests, PSI-blinded IDs) regrouped on the workers into sorted key ranges (issue #29).

Each block's keys become a frame of four big-endian uint64 columns (so sorting them sorts the bytes) and the
number of the key range it falls in (ranges of equal width over the first 8 bytes: the keys are uniform
hashes, so the ranges hold about the same rows). Dask's own peer-to-peer shuffle moves every key to its
range (`set_index` on the range number with known divisions: no quantile pass), and each range is sorted
by key. About one task a block at each step, where cutting every block for every range took one task per
pair of blocks. Range i's future is partition i, so reading the ranges in order reads every key in sorted
order, one range at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from distributed import Client, Future

KEY_SIZE = 32
KEY_COLUMNS = ["k0", "k1", "k2", "k3"]
_RANGE = "range"


def key_frame(keys: np.ndarray, n_ranges: int, rows: np.ndarray | None = None) -> pd.DataFrame:
    """`keys` ((n, 32) uint8, or `S32`) as sortable columns with their range, and their `rows` if given."""
    raw = np.ascontiguousarray(keys).view(np.uint8).reshape(-1, KEY_SIZE)
    words = raw.view(">u8").astype(np.uint64)  # big-endian words: their order is the bytes' order
    frame = pd.DataFrame(words, columns=KEY_COLUMNS)
    frame[_RANGE] = ((words[:, 0] >> np.uint64(32)) * np.uint64(n_ranges) >> np.uint64(32)).astype(np.int64)
    if rows is not None:
        frame["row"] = np.asarray(rows, np.int64)
    return frame


def key_rows(frame: pd.DataFrame) -> np.ndarray:
    """A frame's keys back as (n, 32) uint8 rows, in the frame's order."""
    words = np.column_stack([frame[c].to_numpy(np.uint64) for c in KEY_COLUMNS]) if len(frame) else \
        np.zeros((0, 4), np.uint64)
    return np.ascontiguousarray(words.astype(">u8")).view(np.uint8).reshape(len(frame), KEY_SIZE)


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    """One range's keys in byte order (its range number dropped)."""
    order = np.lexsort([frame[c].to_numpy() for c in reversed(KEY_COLUMNS)])
    return frame.iloc[order].reset_index(drop=True)


def repeats(frame: pd.DataFrame) -> int:
    """Keys of a sorted range that equal the one before them (a key's repeats beyond its first)."""
    if len(frame) < 2:
        return 0
    same = np.ones(len(frame) - 1, bool)
    for c in KEY_COLUMNS:
        values = frame[c].to_numpy()
        same &= values[1:] == values[:-1]
    return int(np.count_nonzero(same))


def by_range(client: Client, frames: list[Future], n_ranges: int, with_rows: bool = False) -> list[Future]:
    """Futures of the key ranges 0 .. n_ranges - 1, each sorted by key, from the blocks' `key_frame`s.

    `with_rows`: the frames carry their keys' row numbers (`key_frame(..., rows=...)`).
    """
    import dask
    import dask.dataframe as dd

    no_rows = np.zeros(0, np.int64) if with_rows else None
    meta = key_frame(np.zeros((0, KEY_SIZE), np.uint8), n_ranges, no_rows)
    parts = [dask.delayed(_same)(f) for f in frames]
    table = dd.from_delayed(parts, meta=meta, verify_meta=False)
    shuffled = table.set_index(_RANGE, divisions=list(range(n_ranges + 1)), sorted=False,
                               shuffle_method="p2p")
    ranged = shuffled.map_partitions(_sorted, meta=meta.drop(columns=[_RANGE]).reset_index(drop=True))
    return client.compute(ranged.to_delayed())


def _same(frame: pd.DataFrame) -> pd.DataFrame:
    return frame
