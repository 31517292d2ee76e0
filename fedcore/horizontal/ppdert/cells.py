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

import numba as nb
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
                            n_cells: int, multipliers: np.ndarray | None = None) -> np.ndarray:
    """A party's indicators (A, k, 2, n_cells) uint64 from its per-candidate min and max.

    `low`, `high` are +inf / -inf where the node has no value; [..., 0, c] = c >= cell(min), [..., 1, c] = c
    <= cell(max). With `multipliers` (`cell_multipliers`, one per indicator) each set indicator is its
    multiplier instead of 1 (a zero word read as 1), written in place into `multipliers`.
    """
    has = np.isfinite(low) & np.isfinite(high)
    first = cell_of(np.where(has, low, 0.0), grid_low, grid_high, n_cells)
    last = cell_of(np.where(has, high, 0.0), grid_low, grid_high, n_cells)
    shape = (*low.shape, 2, n_cells)
    out = np.ones(shape, dtype=np.uint64) if multipliers is None else multipliers.reshape(shape)
    _thermometers(first.reshape(-1), last.reshape(-1), has.reshape(-1), out.reshape(-1, 2, n_cells))
    return out


@nb.njit(cache=True)
def _thermometers(first: np.ndarray, last: np.ndarray, has: np.ndarray, out: np.ndarray) -> None:
    """Keep `out`'s word (at least 1) from `first` up and from `last` down where `has`, zero elsewhere.

    One pass over (m, 2, n_cells), no temporaries.
    """
    one, zero = np.uint64(1), np.uint64(0)  # max() with an int literal would round through float64
    for i in range(first.size):
        for side in range(2):
            for cell in range(out.shape[2]):
                on = has[i] and (cell >= first[i] if side == 0 else cell <= last[i])
                out[i, side, cell] = max(out[i, side, cell], one) if on else zero


def cell_multipliers(secret: bytes, round_id: int, size: int) -> np.ndarray:
    """Secret uniform 64-bit multipliers for a round's `size` cell indicators (mod 2**64).

    Multiplied into the indicators (`extreme_cell_indicators`), a sum over parties says whether any party's
    indicator is 1, not how many. AES-256-CTR of the party's own secret key (fresh per session, never sent),
    for this round (`keystream`); a zero word counts as 1 (probability 2**-64).
    """
    return keystream(secret, round_id, size, CELL_RING_BITS)


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
