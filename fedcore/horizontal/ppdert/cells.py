"""PPD-ERT thresholds that follow the data (`thresholds="histogram"`), under secure aggregation.

Extra-Trees draw each candidate threshold uniformly between the node's smallest and largest value of the
feature. PPD-ERT as published draws it in the feature's declared domain instead, so on a skewed column
most thresholds land where the node has no rows. Here the master learns, per open node and candidate,
only the GRID CELLS holding the node's smallest and largest value over all parties, and draws the
threshold uniformly between the lower edge of the first and the upper edge of the last:

1. Every open node carries a box: per feature an interval known to hold all its rows' values (the
   declared domain at the roots). Each candidate's interval is cut into `n_cells` equal cells: the grid.
2. Each party finds the cell of its own smallest value (c_lo) and of its largest (c_hi) among the node's
   rows, and sends two indicator vectors over the cells: `c >= c_lo` and `c <= c_hi`, each entry
   multiplied by a fresh secret random non-zero 64-bit number, masked for secure aggregation in the
   64-bit ring (`CELL_RING_BITS`).
3. The master's sum is non-zero exactly where some party's indicator is 1, except with probability about
   2**-64 per cell when two or more parties' terms cancel. A sum of one or more uniform non-zero terms is
   uniform (over the non-zero values for one term, over the ring for more), so its value says nothing
   about how many parties hold the cell: the master learns the global first and last populated cells
   and nothing else, not which party, not how many, not how many rows, not the parties' own ranges (FET's
   master sees every party's exact min and max). (Odd multipliers, as first written, leaked the number
   of parties modulo 2 through the sum's lowest bit.)
4. The children inherit the box, narrowed to each candidate's populated span, and at the chosen split
   to either side of its threshold: deeper nodes get finer grids, following the data.

The master sends every party the first and last populated cell of each candidate (`populated_cells`);
master and parties place the threshold alike, the seed-shared uniform within that span
(`populated_spans`; `span_thresholds`, `fedcore/horizontal/boxes.py`), so the master chooses no threshold,
at most a span of whole cells. The parties then count classes per branch as in the domain mode. Parties
learn every candidate's span, the populated cells of the union of the node's rows.

Every party keeps the open nodes' boxes too (`NodeBoxes.after_decisions`; the boxes live in
`fedcore/horizontal/boxes.py`, shared with FET's DP modes) and refuses a grid that is not exactly a node's
box, so a master cannot probe a narrower interval than the protocol reveals.
"""

from __future__ import annotations

import numpy as np

from fedcore.privacy.secagg import keystream
from fedcore.privacy.settings import CELL_CHOICES as CELL_CHOICES  # the grid sizes a privacy setting takes
from fedcore.privacy.settings import DEFAULT_CELLS as DEFAULT_CELLS

CELL_RING_BITS = 64
"""Ring the extreme-cell indicators are masked in: a cancelled sum (a populated cell read as empty) has
probability about 2**-64 per cell, so the forest is the single-party forest in practice (2**-31 of the
32-bit ring would be met in a large run)."""


def cell_of(values: np.ndarray, grid_low: np.ndarray, grid_high: np.ndarray, n_cells: int) -> np.ndarray:
    """The grid cell of each value in [grid_low, grid_high] cut into n_cells.

    int64, clamped into range (a value outside its box falls in the nearest end cell; a point interval has one
    cell, 0). Halved operands keep the width finite for any finite interval (1e308 wide included).
    """
    width = grid_high / 2 - grid_low / 2
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        position = np.floor((values / 2 - grid_low / 2) / width * n_cells)
    position = np.where(np.isfinite(position) & (width > 0), position, 0.0)
    return np.clip(position, 0, n_cells - 1).astype(np.int64)


def extreme_cell_indicators(low: np.ndarray, high: np.ndarray, grid_low: np.ndarray, grid_high: np.ndarray,
                            n_cells: int) -> np.ndarray:
    """A party's indicators (A, k, 2, n_cells) uint64 from its per-candidate min and max.

    `low`, `high` are +inf / -inf where the node has no value; [..., 0, c] = c >= cell(min), [..., 1, c] = c
    <= cell(max).
    """
    cells = np.arange(n_cells)
    has = np.isfinite(low) & np.isfinite(high)
    first = cell_of(np.where(has, low, 0.0), grid_low, grid_high, n_cells)
    last = cell_of(np.where(has, high, 0.0), grid_low, grid_high, n_cells)
    out = np.empty((*low.shape, 2, n_cells), dtype=np.uint64)
    out[..., 0, :] = (cells >= first[..., None]) & has[..., None]
    out[..., 1, :] = (cells <= last[..., None]) & has[..., None]
    return out


def hide_multiplicity(indicators: np.ndarray, secret: bytes, round_id: int) -> np.ndarray:
    """Each indicator times a secret uniform non-zero 64-bit number (mod 2**64).

    A sum over parties says whether any party's indicator is 1, not how many. The multipliers are ChaCha20 of
    the party's own secret key (fresh per session, never sent), for this round; a zero word becomes 1
    (probability 2**-64).
    """
    words = keystream(secret, round_id, indicators.size, CELL_RING_BITS).reshape(indicators.shape)
    hidden = np.maximum(words, np.uint64(1))  # the key stream is read-only: one copy, multiplied in place
    hidden *= indicators
    return hidden


NO_CELL = 255
"""The cell index sent for a candidate whose node holds no value of the feature (uint8 on the wire)."""


def populated_cells(cell_sums: np.ndarray, n_cells: int) -> tuple[np.ndarray, np.ndarray]:
    """The first and last populated cell of each candidate, from the summed indicators.

    The indicators are (A, k, 2, n_cells); the cells (A, k) uint8, NO_CELL for both where the node holds no
    value of the feature.
    """
    above_min = cell_sums[..., 0, :] != 0
    below_max = cell_sums[..., 1, :] != 0
    has = above_min.any(axis=-1) & below_max.any(axis=-1)
    first = np.argmax(above_min, axis=-1)
    last = np.maximum(first, n_cells - 1 - np.argmax(below_max[..., ::-1], axis=-1))
    return (np.where(has, first, NO_CELL).astype(np.uint8), np.where(has, last, NO_CELL).astype(np.uint8))


def populated_spans(first: np.ndarray, last: np.ndarray, grid_low: np.ndarray, grid_high: np.ndarray,
                    n_cells: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The span from the lower edge of cell `first` to the upper edge of cell `last`, and whether it exists.

    (A, k) x 3: low, high and has (not NO_CELL). Master and parties compute it alike, bit for bit.
    """
    has = first != NO_CELL
    first = np.where(has, first, 0).astype(np.int64)
    last = np.where(has, last, 0).astype(np.int64)
    low = cell_edge(grid_low, grid_high, first, n_cells)
    return low, cell_edge(grid_low, grid_high, last + 1, n_cells), has


def cell_edge(grid_low: np.ndarray, grid_high: np.ndarray, edge: np.ndarray, n_cells: int) -> np.ndarray:
    """Lower edge of cell `edge` (edge n_cells: the interval's upper end, exactly).

    A weighted mean of the ends, finite for any finite interval.
    """
    fraction = edge / n_cells
    inner = grid_low * (1 - fraction) + grid_high * fraction
    return np.where(edge >= n_cells, grid_high, np.where(edge <= 0, grid_low, inner))
