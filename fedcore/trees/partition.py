"""Which in-bag samples sit in which open node, for every tree of a batch, and how splits move them.

All trees of a batch share two flat arrays (`order`: row indices, `weight`: bootstrap counts); each open
node owns a contiguous segment. The open nodes of a level are kept in the master's order, so parties and
master refer to nodes by position and never need per-node dictionaries. A split moves the left samples
to the front of the node's segment (stably) and the node's two children replace it in the next level.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from fedcore.data.binning import MISSING_BIN
from fedcore.randomness import bootstrap_counts


def node_byte_lengths(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Bytes of each node's packed partition bitmap (one bit per in-bag row, byte aligned per node)."""
    return (ends - starts + 7) // 8


def offsets_from_lengths(lengths: np.ndarray) -> np.ndarray:
    """Exclusive prefix sums with the total appended (length n+1)."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


@nb.njit(cache=True, parallel=True)
def pack_split_bits(codes, order, starts, ends, feats, bins, missing_left, is_cat, cat_bits, byte_offsets):
    """Packed bitmaps (bit = goes left) of the given nodes' samples under the given splits."""
    out = np.zeros(byte_offsets[-1], np.uint8)
    for i in nb.prange(starts.shape[0]):
        s = starts[i]
        off = byte_offsets[i]
        f = feats[i]
        for k in range(ends[i] - s):
            b = codes[order[s + k], f]
            if b == MISSING_BIN:
                go_left = missing_left[i]
            elif is_cat[i]:
                go_left = (cat_bits[i, b >> 6] >> np.uint64(b & 63)) & np.uint64(1) == 1
            else:
                go_left = b <= bins[i]
            if go_left:
                out[off + (k >> 3)] |= np.uint8(1 << (k & 7))
    return out


@nb.njit(cache=True, parallel=True)
def apply_partition(order, weight, starts, ends, packed, byte_offsets):
    """Stably move each node's left samples to the front of its segment; returns left counts."""
    n_left = np.zeros(starts.shape[0], np.int64)
    for i in nb.prange(starts.shape[0]):
        s, e = starts[i], ends[i]
        n = e - s
        tmp_o = np.empty(n, order.dtype)
        tmp_w = np.empty(n, weight.dtype)
        off = byte_offsets[i]
        nl = 0
        for k in range(n):
            if (packed[off + (k >> 3)] >> (k & 7)) & 1:
                nl += 1
        li, ri = 0, nl
        for k in range(n):
            if (packed[off + (k >> 3)] >> (k & 7)) & 1:
                tmp_o[li] = order[s + k]
                tmp_w[li] = weight[s + k]
                li += 1
            else:
                tmp_o[ri] = order[s + k]
                tmp_w[ri] = weight[s + k]
                ri += 1
        order[s:e] = tmp_o
        weight[s:e] = tmp_w
        n_left[i] = nl
    return n_left


def scatter_node_bytes(pieces: list[tuple[np.ndarray, np.ndarray]], node_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-owner packed bitmaps into one, in node order.

    `pieces` holds, per owner, (mask of the nodes it owns, its packed bytes for those nodes in order).
    Returns (packed bytes of all nodes, byte offsets).
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
            raise ValueError(f"partition bitmap has {len(blob)} bytes, expected {local[-1]}")
        merged[positions] = blob
    return merged, offsets


class SamplePartition:
    """In-bag samples of a batch of trees, grouped by the open nodes of the current level."""

    def __init__(self, order: np.ndarray, weight: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        self.order = order
        self.weight = weight
        self.starts = starts
        self.ends = ends

    @classmethod
    def bootstrap(cls, seed: int, trees: list[int], n_rows: int, n_draws: int | None) -> SamplePartition:
        """Roots of `trees`: the bootstrap sample of each (all rows with weight 1 if n_draws is None)."""
        orders, weights = [], []
        for tree in trees:
            if n_draws is None:
                rows = np.arange(n_rows, dtype=np.int32)
                counts = np.ones(n_rows, dtype=np.float64)
            else:
                all_counts = bootstrap_counts(seed, tree, n_rows, n_draws)
                rows = np.flatnonzero(all_counts).astype(np.int32)
                counts = all_counts[rows].astype(np.float64)
            orders.append(rows)
            weights.append(counts)
        lengths = np.array([len(o) for o in orders], dtype=np.int64)
        offsets = offsets_from_lengths(lengths)
        return cls(np.concatenate(orders), np.concatenate(weights), offsets[:-1].copy(), offsets[1:].copy())

    @property
    def n_nodes(self) -> int:
        """Number of open nodes at this level."""
        return len(self.starts)

    def node_sizes(self) -> np.ndarray:
        """Number of in-bag rows in each open node."""
        return self.ends - self.starts

    def split(self, split_mask: np.ndarray, packed: np.ndarray, byte_offsets: np.ndarray) -> None:
        """Apply the level's partition bitmaps; the children of split nodes become the new open nodes."""
        idx = np.flatnonzero(split_mask)
        starts, ends = self.starts[idx], self.ends[idx]
        n_left = apply_partition(self.order, self.weight, starts, ends, packed, byte_offsets)
        new_starts = np.empty(2 * len(idx), dtype=np.int64)
        new_ends = np.empty(2 * len(idx), dtype=np.int64)
        new_starts[0::2], new_ends[0::2] = starts, starts + n_left
        new_starts[1::2], new_ends[1::2] = starts + n_left, ends
        self.starts, self.ends = new_starts, new_ends
