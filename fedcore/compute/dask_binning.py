"""A vertical party's `PartyBinner` fitted over its aligned blocks on Dask, without the frame (issue #29).

`PartyBinner.fit` on the whole training frame, in two rounds of one task per block: each block reports,
per column, its sorted distinct category strings (categorical) or its count of non-NaN values (numeric);
the agent takes the union of the strings, draws each numeric column's subsample indices over the blocks'
counts (`subsample_indices`, same seed), and each block returns just its values at those indices (all
of them when the column has no more than `subsample`). `edges_from_values` then gives `fit_column`'s
edges bit for bit. The agent holds at most `subsample` values per numeric column, never a row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from fedcore.data.binning import (
    ColumnBinning,
    PartyBinner,
    categorical_binning,
    category_strings,
    check_max_bins,
    column_seed,
    edges_from_values,
    is_categorical_dtype,
    subsample_indices,
)
from fedcore.data.numbers import numeric_values

if TYPE_CHECKING:
    from distributed import Client, Future


def _present(series: pd.Series) -> np.ndarray:
    """A numeric column's non-NaN values, in row order."""
    values = numeric_values(series)
    return values[~np.isnan(values)]


def _facts(frame: pd.DataFrame, columns: list[str]) -> dict[str, list[str] | int]:
    """Per column: its sorted distinct strings (categorical) or its number of non-NaN values (numeric)."""
    return {c: (sorted(category_strings(frame[c]).dropna().unique().tolist())
                if is_categorical_dtype(frame[c]) else len(_present(frame[c]))) for c in columns}


def _values(frame: pd.DataFrame, wanted: dict[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    """Per numeric column, its non-NaN values at the block's `wanted` indices (None: all)."""
    out = {}
    for c, rows in wanted.items():
        present = _present(frame[c])
        out[c] = present if rows is None else present[rows]
    return out


def fit_on_blocks(binner: PartyBinner, client: Client, frames: Sequence[Future],
                  columns: Sequence[str]) -> PartyBinner:
    """`binner` fitted on the blocks' rows of `columns` concatenated in block order (see the module doc)."""
    check_max_bins(binner.max_bins)
    facts = client.gather([client.submit(_facts, f, list(columns), pure=False) for f in frames])
    fitted: dict[str, ColumnBinning] = {}
    chosen: dict[str, np.ndarray | None] = {}
    offsets: dict[str, np.ndarray] = {}
    for name in columns:
        per_block = [block[name] for block in facts]
        if per_block and isinstance(per_block[0], list):
            fitted[name] = categorical_binning(name, sorted(set().union(*per_block)), binner.max_bins)
            continue
        counts = np.array(per_block, np.int64)
        offsets[name] = np.concatenate([[0], np.cumsum(counts)])
        chosen[name] = subsample_indices(int(counts.sum()), binner.subsample,
                                         column_seed(name, binner.random_state))
    wanted: list[dict[str, np.ndarray | None]] = [{} for _ in frames]
    for name, indices in chosen.items():
        for b in range(len(frames)):
            if indices is None:
                wanted[b][name] = None
            else:
                lo, hi = offsets[name][b], offsets[name][b + 1]
                wanted[b][name] = indices[(indices >= lo) & (indices < hi)] - lo
    values = client.gather([client.submit(_values, f, w, pure=False) for f, w in zip(frames, wanted,
                                                                                      strict=True)])
    for name, indices in chosen.items():
        if indices is None:
            column = np.concatenate([np.zeros(0), *(block[name] for block in values)])
        else:  # each index's value where its block put it: the order `values[indices]` has in process
            column = np.empty(len(indices))
            for b, block in enumerate(values):
                column[(indices >= offsets[name][b]) & (indices < offsets[name][b + 1])] = block[name]
        fitted[name] = ColumnBinning(name=name, is_categorical=False,
                                     edges=edges_from_values(column, binner.max_bins))
    binner.columns = [fitted[name] for name in columns]
    return binner
