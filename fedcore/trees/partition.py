"""Which in-bag samples sit in which open node, for every tree of a batch, and how splits move them.

All trees of a batch share flat arrays (`order`: row indices, `weight`: bootstrap counts, `target`: the
labels, or boosting's (g, h) per tree, as (samples, T) rows carried along so histograms read them
sequentially); each open
node owns a contiguous segment. The open nodes of a level are kept in the master's order, so parties and
master refer to nodes by position and never need per-node dictionaries. A split moves the left samples
to the front of the node's segment (stably) and the node's two children replace it in the next level.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from fedcore.data.binning import MISSING_BIN
from fedcore.errors import ProtocolError
from fedcore.randomness import bootstrap_counts


def node_byte_lengths(starts: np.ndarray | int, ends: np.ndarray) -> np.ndarray:
    """Bytes of each node's packed partition bitmap (one bit per in-bag row, byte aligned per node)."""
    return (ends - starts + 7) // 8


def offsets_from_lengths(lengths: np.ndarray) -> np.ndarray:
    """Exclusive prefix sums with the total appended (length n+1)."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


ROW_CHUNK = 1 << 14
"""Rows of a node's segment per parallel task when splits are packed and applied (a multiple of 8: a task
writes whole bytes of the bitmap); a large node's rows are shared out, every row's place stays the same."""


def row_chunks(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each node's segment cut into `ROW_CHUNK`-row tasks: (node, first position, end position) per task."""
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    counts = np.maximum((ends - starts + ROW_CHUNK - 1) // ROW_CHUNK, 1)
    node = np.repeat(np.arange(len(starts), dtype=np.int64), counts)
    within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    lo = starts[node] + within * ROW_CHUNK
    return node, lo, np.minimum(lo + ROW_CHUNK, ends[node])


def pack_split_bits(codes, order, starts, ends, feats, bins, missing_left, is_cat, cat_bits,
                    byte_offsets) -> np.ndarray:
    """Packed bitmaps (bit = goes left) of the given nodes' samples under the given splits."""
    node, lo, hi = row_chunks(starts, ends)
    return _pack_split_bits(codes, order, starts, node, lo, hi, feats, bins, missing_left, is_cat, cat_bits,
                            byte_offsets)


@nb.njit(cache=True, nogil=True, parallel=True)
def _pack_split_bits(codes, order, starts, task_node, task_lo, task_hi, feats, bins, missing_left, is_cat,
                     cat_bits, byte_offsets):
    out = np.zeros(byte_offsets[-1], np.uint8)
    for t in nb.prange(task_node.shape[0]):
        i = task_node[t]
        s = starts[i]
        off = byte_offsets[i]
        f = feats[i]
        for j in range(task_lo[t], task_hi[t]):
            k = j - s
            b = codes[order[j], f]
            if b == MISSING_BIN:
                go_left = missing_left[i]
            elif is_cat[i]:
                go_left = (cat_bits[i, b >> 6] >> np.uint64(b & 63)) & np.uint64(1) == 1
            else:
                go_left = b <= bins[i]
            if go_left:
                out[off + (k >> 3)] |= np.uint8(1 << (k & 7))
    return out


def apply_partition(order, weight, target, new_order, new_weight, new_target, starts, ends, packed,
                    byte_offsets) -> np.ndarray:
    """Write each split node's samples into the new_* arrays at the node's segment, left ones first.

    Stably; returns the left counts. Segments of nodes that did not split are left unwritten. A large node's
    rows are moved by several tasks (`row_chunks`): each counts its left rows, then writes them after the
    left rows of the tasks before it (and its right rows after theirs), so every row lands where one pass
    would put it.
    """
    node, lo, hi = row_chunks(starts, ends)
    left = _left_counts(starts, node, lo, hi, packed, byte_offsets)
    n_left = np.bincount(node, weights=left, minlength=len(starts)).astype(np.int64)
    before = np.cumsum(left) - left  # left rows of all earlier tasks
    before -= before[np.searchsorted(node, node)]  # ... of the node's earlier tasks
    left_at = starts[node] + before
    right_at = starts[node] + n_left[node] + (lo - starts[node]) - before
    _move_rows(order, weight, target, new_order, new_weight, new_target, starts, node, lo, hi, packed,
               byte_offsets, left_at, right_at)
    return n_left


@nb.njit(cache=True, nogil=True, parallel=True)
def _left_counts(starts, task_node, task_lo, task_hi, packed, byte_offsets):
    """Left-going rows of each task's rows."""
    out = np.zeros(task_node.shape[0], np.int64)
    for t in nb.prange(task_node.shape[0]):
        i = task_node[t]
        off, s = byte_offsets[i], starts[i]
        nl = 0
        for j in range(task_lo[t], task_hi[t]):
            k = j - s
            nl += (packed[off + (k >> 3)] >> (k & 7)) & 1
        out[t] = nl
    return out


@nb.njit(cache=True, nogil=True, parallel=True)
def _move_rows(order, weight, target, new_order, new_weight, new_target, starts, task_node, task_lo, task_hi,
               packed, byte_offsets, left_at, right_at):
    """Each task's rows to its left and right places, in order (branch-free: the bits are unpredictable)."""
    for t in nb.prange(task_node.shape[0]):
        i = task_node[t]
        off, s = byte_offsets[i], starts[i]
        li, ri = left_at[t], right_at[t]
        for j in range(task_lo[t], task_hi[t]):
            k = j - s
            bit = np.int64((packed[off + (k >> 3)] >> (k & 7)) & 1)
            dst = ri + (li - ri) * bit
            li += bit
            ri += 1 - bit
            new_order[dst] = order[j]
            new_weight[dst] = weight[j]
            for c in range(target.shape[1]):
                new_target[dst, c] = target[j, c]


@nb.njit(cache=True, nogil=True, parallel=True)
def _compact_counts(counts, offsets, y):
    """Rows with a non-zero count per tree, those counts as weights and the rows' labels, tree after tree.

    Labels are (n_rows, T) rows.
    """
    order = np.empty(offsets[-1], np.int32)
    weight = np.empty(offsets[-1], np.int32)
    target = np.empty((offsets[-1], y.shape[1]), np.float64)
    for t in nb.prange(counts.shape[0]):
        k = offsets[t]
        for r in range(counts.shape[1]):
            c = counts[t, r]
            if c:
                order[k] = r
                weight[k] = c
                for j in range(y.shape[1]):
                    target[k, j] = y[r, j]
                k += 1
    return order, weight, target


def scatter_node_bytes(pieces: list[tuple[np.ndarray, np.ndarray]],
                       node_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-owner packed bitmaps into one, in node order.

    `pieces` holds, per owner, (mask of the nodes it owns, its packed bytes for those nodes in order).
    Returns (packed bytes of all nodes, byte offsets). The bitmaps and owners come from the master: a length
    that does not fit is its fault (ProtocolError).
    """
    offsets = offsets_from_lengths(node_lengths)
    merged = np.zeros(offsets[-1], dtype=np.uint8)
    for mask, blob in pieces:
        idx = np.flatnonzero(mask)
        if len(idx) == 0:
            continue
        lengths = node_lengths[idx]
        local = offsets_from_lengths(lengths)
        positions = np.repeat(offsets[idx] - local[:-1], lengths) + np.arange(local[-1])
        if len(blob) != local[-1]:
            raise ProtocolError(f"partition bitmap has {len(blob)} bytes, expected {local[-1]} for the "
                                "nodes its owner split")
        merged[positions] = blob
    return merged, offsets


def unpack_nodes(packed: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per-node packed bitmaps (byte aligned per node) as one array of bits (uint8 0/1), node after node."""
    lengths = np.asarray(lengths, np.int64)
    bits = np.unpackbits(np.asarray(packed, np.uint8), bitorder="little")
    firsts = offsets_from_lengths(node_byte_lengths(0, lengths))[:-1] * 8
    starts = offsets_from_lengths(lengths)
    return bits[np.repeat(firsts - starts[:-1], lengths) + np.arange(starts[-1])]


def pack_nodes(bits: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The inverse of `unpack_nodes`: bits node after node, packed byte aligned per node."""
    lengths = np.asarray(lengths, np.int64)
    byte_offsets = offsets_from_lengths(node_byte_lengths(0, lengths))
    padded = np.zeros(byte_offsets[-1] * 8, np.uint8)
    starts = offsets_from_lengths(lengths)
    padded[np.repeat(byte_offsets[:-1] * 8 - starts[:-1], lengths) + np.arange(starts[-1])] = bits
    return np.packbits(padded, bitorder="little")


def copy_bit_runs(src: np.ndarray, src_at: np.ndarray, lengths: np.ndarray, dst_at: np.ndarray,
                  n_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Runs of packed bits moved to new places: run i, `lengths[i]` bits from bit `src_at[i]` of `src`.

    Bits are numbered little-endian within bytes (`np.packbits(..., bitorder="little")`). Returns `n_bytes`
    zeroed bytes with each run written from bit `dst_at[i]` (runs must not overlap), and each run's count
    of ones: regrouping a level's bitmaps block by block or node by node touches each byte once, where
    unpacking them to one byte a bit and back took seconds a level at 10,000,000 rows (issue #29).
    """
    return _copy_bit_runs(np.asarray(src, np.uint8), np.asarray(src_at, np.int64),
                          np.asarray(lengths, np.int64), np.asarray(dst_at, np.int64), int(n_bytes))


_ONES = np.array([bin(v).count("1") for v in range(256)], np.int64)
"""Ones in each byte value."""


@nb.njit(cache=True, nogil=True)
def _copy_bit_runs(src, src_at, lengths, dst_at, n_bytes):
    dst = np.zeros(n_bytes, np.uint8)
    ones = np.zeros(lengths.shape[0], np.int64)
    for i in range(lengths.shape[0]):
        s, d, n = src_at[i], dst_at[i], lengths[i]
        k, count = 0, 0
        while k + 8 <= n:  # eight bits at a time: from any bit of src to any bit of dst
            a, b = s + k, d + k
            r, q = a & 7, b & 7
            v = np.int64(src[a >> 3]) >> r
            if r:
                v |= np.int64(src[(a >> 3) + 1]) << (8 - r)
            v &= 255
            dst[b >> 3] |= np.uint8((v << q) & 255)
            if q:
                dst[(b >> 3) + 1] |= np.uint8(v >> (8 - q))
            count += _ONES[v]
            k += 8
        while k < n:
            bit = (np.int64(src[(s + k) >> 3]) >> ((s + k) & 7)) & 1
            dst[(d + k) >> 3] |= np.uint8(bit << ((d + k) & 7))
            count += bit
            k += 1
        ones[i] = count
    return dst, ones


class SamplePartition:
    """In-bag samples of a batch of trees, grouped by the open nodes of the current level."""

    def __init__(self, order: np.ndarray, weight: np.ndarray, target: np.ndarray, starts: np.ndarray,
                 ends: np.ndarray) -> None:
        """Samples in `order` with their weights and targets, in node segments `starts`..`ends`."""
        self.order = order
        self.weight = weight
        self.target = target  # (samples, T): the label (class code or value), or (g, h), aligned with `order`
        self.starts = starts
        self.ends = ends
        self._spare: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # the split's output, reused

    @classmethod
    def bootstrap(cls, seed: int, trees: list[int], y: np.ndarray, n_draws: int | None, start: int = 0,
                  n_rows: int | None = None, totals: list[np.ndarray] | None = None) -> SamplePartition:
        """Roots of `trees`: the bootstrap sample of each (all rows with weight 1 if n_draws is None).

        `y` holds the label per row (class codes or values), or each tree's targets per row
        (len(trees), n_rows, T): boosting's (g, h), which takes every row once (no bootstrap); samples carry
        them along so that histogram building reads them sequentially. A block of rows (a Dask worker's)
        passes its first row `start`, the table's `n_rows` and the trees' chunk totals
        (`bootstrap_chunk_totals`): its rows get the whole table's counts, numbered from 0 within the block.
        """
        y = np.asarray(y, dtype=np.float64)
        per_tree = y.ndim == 3
        if per_tree and (n_draws is not None or y.shape[0] != len(trees)):
            raise ValueError("per-tree targets take every row once (no bootstrap), one target table per tree")
        table_rows = y.shape[-2] if per_tree else len(y) if n_rows is None else n_rows
        n_rows = y.shape[-2] if per_tree else len(y)
        columns = y if per_tree else y.reshape(n_rows, 1)
        if n_draws is None:
            order = np.tile(np.arange(n_rows, dtype=np.int32), len(trees))
            weight = np.ones(len(order), dtype=np.int32)
            target = (columns.reshape(len(trees) * n_rows, -1).copy() if per_tree  # splits write into it
                      else np.tile(columns, (len(trees), 1)))
            offsets = np.arange(len(trees) + 1, dtype=np.int64) * n_rows
        else:
            counts = np.stack([bootstrap_counts(seed, tree, table_rows, n_draws, start, start + n_rows,
                                                None if totals is None else totals[k])
                               for k, tree in enumerate(trees)]).reshape(len(trees), n_rows)
            offsets = offsets_from_lengths(np.count_nonzero(counts, axis=1))
            order, weight, target = _compact_counts(counts, offsets, columns)
        return cls(order, weight, target, offsets[:-1].copy(), offsets[1:].copy())

    @property
    def n_nodes(self) -> int:
        """Number of open nodes at this level."""
        return len(self.starts)

    def split(self, split_mask: np.ndarray, packed: np.ndarray, byte_offsets: np.ndarray) -> None:
        """Apply the level's partition bitmaps; the children of split nodes become the new open nodes."""
        idx = np.flatnonzero(split_mask)
        starts, ends = self.starts[idx], self.ends[idx]
        if self._spare is None:
            self._spare = (np.empty_like(self.order), np.empty_like(self.weight), np.empty_like(self.target))
        new_order, new_weight, new_target = self._spare
        n_left = apply_partition(self.order, self.weight, self.target, new_order, new_weight, new_target,
                                 starts, ends, packed, byte_offsets)
        self._spare = (self.order, self.weight, self.target)
        self.order, self.weight, self.target = new_order, new_weight, new_target
        new_starts = np.empty(2 * len(idx), dtype=np.int64)
        new_ends = np.empty(2 * len(idx), dtype=np.int64)
        new_starts[0::2], new_ends[0::2] = starts, starts + n_left
        new_starts[1::2], new_ends[1::2] = starts + n_left, ends
        self.starts, self.ends = new_starts, new_ends

    def split_copy(self, split_mask: np.ndarray, packed: np.ndarray,
                   byte_offsets: np.ndarray) -> SamplePartition:
        """The partition after `split`, as a new object; this one is left as it was (a Dask task's input)."""
        new = SamplePartition(self.order, self.weight, self.target, self.starts, self.ends)
        new.split(split_mask, packed, byte_offsets)
        new._spare = None  # it holds this partition's arrays: never written through the copy
        return new
