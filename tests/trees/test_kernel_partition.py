"""Partition kernels (fedcore/trees/partition.py) against plain Python.

Which samples go left under a split, how those bits are packed and merged across owners, and how a level's
samples are regrouped into the children's segments (stably, over several levels, with the double buffer
swapped each time). All comparisons are exact: these kernels only move integers around.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.data.binning import MISSING_BIN
from fedcore.errors import ProtocolError
from fedcore.randomness import bootstrap_counts
from fedcore.trees.partition import (
    ROW_CHUNK,
    SamplePartition,
    apply_partition,
    copy_bit_runs,
    node_byte_lengths,
    offsets_from_lengths,
    pack_split_bits,
    scatter_node_bytes,
)

MISSING = MISSING_BIN


def goes_left(code: int, bin_: int, missing_left: bool, is_cat: bool, bits: np.ndarray) -> bool:
    """The documented test on a bin code.

    Missing -> missing_left; categorical -> code in the bitset; numeric -> code <= bin.
    """
    if code == MISSING:
        return bool(missing_left)
    if is_cat:
        return bool((int(bits[code // 64]) >> (code % 64)) & 1)
    return code <= bin_


def pack(bits_per_node: list[list[bool]]) -> np.ndarray:
    """Pack per-node bit lists: bit k of a node is bit k % 8 of its byte k // 8, nodes byte aligned."""
    out = []
    for bits in bits_per_node:
        block = [0] * ((len(bits) + 7) // 8)
        for k, bit in enumerate(bits):
            if bit:
                block[k // 8] |= 1 << (k % 8)
        out += block
    return np.array(out, dtype=np.uint8)


def unpack(packed: np.ndarray, offset: int, n: int) -> list[bool]:
    """Bits 0..n-1 of the node block starting at byte `offset`."""
    return [bool((int(packed[offset + k // 8]) >> (k % 8)) & 1) for k in range(n)]


def random_splits(rng: np.random.Generator, n_nodes: int, codes: np.ndarray, is_cat_column: np.ndarray):
    """One random split per node: feature, bin (0..254), missing side, and a random category bitset."""
    feats = rng.integers(0, codes.shape[1], n_nodes).astype(np.int32)
    bins = rng.integers(0, 255, n_nodes).astype(np.int32)
    bins[::5] = MISSING - 1  # every value left
    missing_left = rng.random(n_nodes) < 0.5
    cat_bits = (rng.integers(0, 2**63, (n_nodes, 4), dtype=np.uint64)
                | (rng.integers(0, 2, (n_nodes, 4)).astype(np.uint64) << np.uint64(63)))
    return feats, bins, missing_left, is_cat_column[feats], cat_bits


def random_codes(rng: np.random.Generator, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes of two numeric and two categorical columns (all 255 values possible), 15% missing."""
    codes = rng.integers(0, 255, (n_rows, 4)).astype(np.uint8)
    codes[rng.random((n_rows, 4)) < 0.15] = MISSING
    return np.asfortranarray(codes), np.array([False, True, False, True])


def segments(sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """starts, ends of consecutive segments of the given sizes."""
    ends = np.cumsum(sizes, dtype=np.int64)
    return ends - np.asarray(sizes, dtype=np.int64), ends


SIZES = [0, 1, 7, 8, 9, 15, 16, 17, 64, 100, 3, 0, 250]


def test_byte_lengths_and_offsets() -> None:
    starts, ends = segments(SIZES)
    lengths = node_byte_lengths(starts, ends)
    assert lengths.tolist() == [-(-n // 8) for n in SIZES]
    np.testing.assert_array_equal(offsets_from_lengths(lengths), np.concatenate([[0], np.cumsum(lengths)]))
    assert offsets_from_lengths(np.zeros(0, np.int64)).tolist() == [0]


LARGE = [2 * ROW_CHUNK + 13, 5, ROW_CHUNK, 3, ROW_CHUNK + 1]
"""Nodes of several row chunks (parallel tasks), and one of exactly one."""


@pytest.mark.parametrize("seed", range(4))
def test_pack_split_bits_matches_the_test_row_by_row(seed: int) -> None:
    rng = np.random.default_rng(seed)
    codes, is_cat_column = random_codes(rng, 200)
    sizes = SIZES if seed < 2 else LARGE
    starts, ends = segments(sizes)
    order = rng.integers(0, 200, ends[-1]).astype(np.int32)
    feats, bins, ml, is_cat, cat_bits = random_splits(rng, len(sizes), codes, is_cat_column)
    offsets = offsets_from_lengths(node_byte_lengths(starts, ends))
    got = pack_split_bits(codes, order, starts, ends, feats, bins, ml, is_cat, cat_bits, offsets)
    expected = pack([[goes_left(int(codes[order[j], feats[i]]), int(bins[i]), ml[i], is_cat[i], cat_bits[i])
                      for j in range(starts[i], ends[i])] for i in range(len(sizes))])
    np.testing.assert_array_equal(got, expected)


def test_pack_split_bits_on_every_code() -> None:
    """Each code 0..255 once, under a numeric cut at 100 and a categorical set of the odd codes above 60.

    The boundaries (bin itself, bin + 1, 63/64 word edges, 254, missing) land on the right side.
    """
    codes = np.asfortranarray(np.arange(256, dtype=np.uint8)[:, None])
    odd = sum(1 << c for c in range(61, 255, 2))
    cat_bits = np.array([[(odd >> (64 * k)) & (2**64 - 1) for k in range(4)]] * 2, dtype=np.uint64)
    starts, ends = np.array([0, 0]), np.array([256, 256])
    offsets = offsets_from_lengths(node_byte_lengths(starts, ends))
    for ml in (False, True):
        got = pack_split_bits(codes, np.arange(256, dtype=np.int32), starts, ends, np.zeros(2, np.int32),
                              np.array([100, 100], np.int32), np.array([ml, ml]), np.array([False, True]),
                              cat_bits, offsets)
        numeric, categorical = unpack(got, 0, 256), unpack(got, 32, 256)
        assert numeric == [c <= 100 for c in range(255)] + [ml]
        assert categorical == [c > 60 and c % 2 == 1 for c in range(255)] + [ml]


@pytest.mark.parametrize("sizes", [SIZES, LARGE])
def test_apply_partition_is_a_stable_partition_of_split_nodes_only(sizes: list[int]) -> None:
    rng = np.random.default_rng(3)
    starts_all, ends_all = segments(sizes)
    n = int(ends_all[-1])
    order = rng.permutation(n).astype(np.int32)
    weight = rng.integers(1, 5, n).astype(np.int32)
    target = rng.normal(size=(n, 2))  # (g, h) rows: every column moves with its sample
    chosen = np.array([i for i in range(len(sizes)) if i % 3 != 1])  # some nodes do not split
    starts, ends = starts_all[chosen], ends_all[chosen]
    masks = [rng.random(ends[k] - starts[k]) < 0.4 for k in range(len(chosen))]
    packed = pack([m.tolist() for m in masks])
    offsets = offsets_from_lengths(node_byte_lengths(starts, ends))
    new_order, new_weight = np.full(n, -7, np.int32), np.full(n, -7, np.int32)
    new_target = np.full((n, 2), np.nan)
    n_left = apply_partition(order, weight, target, new_order, new_weight, new_target, starts, ends,
                             packed, offsets)
    assert n_left.tolist() == [int(m.sum()) for m in masks]
    untouched = np.ones(n, bool)
    for k, (s, e) in enumerate(zip(starts, ends, strict=True)):
        untouched[s:e] = False
        positions = np.arange(s, e)
        expected = np.concatenate([positions[masks[k]], positions[~masks[k]]])  # left first, each side stable
        np.testing.assert_array_equal(new_order[s:e], order[expected])
        np.testing.assert_array_equal(new_weight[s:e], weight[expected])
        np.testing.assert_array_equal(new_target[s:e], target[expected])
    assert np.all(new_order[untouched] == -7) and np.all(np.isnan(new_target[untouched]))


def test_scatter_node_bytes_places_each_owners_blocks() -> None:
    """Three owners (one owns nothing) interleaved over nodes of various byte lengths."""
    rng = np.random.default_rng(4)
    lengths = node_byte_lengths(*segments(SIZES))
    owner = rng.integers(0, 2, len(SIZES)) * 2  # owners 0 and 2; owner 1 owns no node
    blocks = [rng.integers(0, 256, n).astype(np.uint8) for n in lengths]
    pieces = [(owner == p,
               np.concatenate([np.zeros(0, np.uint8)] + [blocks[i] for i in np.flatnonzero(owner == p)]))
              for p in range(3)]
    merged, offsets = scatter_node_bytes(pieces, lengths)
    np.testing.assert_array_equal(offsets, offsets_from_lengths(lengths))
    np.testing.assert_array_equal(merged, np.concatenate(blocks))
    with pytest.raises(ProtocolError, match="bytes, expected"):  # the master relayed a wrong length
        scatter_node_bytes([(owner == 0, pieces[0][1][:-1])], lengths)


@pytest.mark.parametrize("n_draws", [None, 1, 37, 150])
def test_bootstrap_roots(n_draws: int | None) -> None:
    """Each tree's root segment.

    The rows drawn at least once, ascending, weighted by their draw counts, carrying their labels; all rows
    with weight 1 without bootstrap.
    """
    y = np.arange(100, dtype=np.float64) * 0.5
    trees = [0, 3, 4]
    part = SamplePartition.bootstrap(11, trees, y, n_draws)
    assert part.n_nodes == 3
    for k, tree in enumerate(trees):
        s, e = part.starts[k], part.ends[k]
        counts = np.ones(100, np.int64) if n_draws is None else bootstrap_counts(11, tree, 100, n_draws)
        rows = [r for r in range(100) if counts[r] > 0]
        assert part.order[s:e].tolist() == rows
        assert part.weight[s:e].tolist() == [int(counts[r]) for r in rows]
        assert part.target[s:e, 0].tolist() == [y[r] for r in rows]
        assert part.weight[s:e].sum() == (100 if n_draws is None else n_draws)
    assert part.ends[-1] == len(part.order) and np.all(part.starts[1:] == part.ends[:-1])


def test_partition_over_several_levels_matches_lists() -> None:
    """Five levels of random splits against a list-of-lists model of the open nodes.

    Some nodes stop, some children are empty; children replace their parent in place, left before right,
    samples stable.
    """
    rng = np.random.default_rng(8)
    y = rng.normal(size=120)
    part = SamplePartition.bootstrap(2, [0, 1, 2], y, 120)
    model = [[(int(part.order[j]), int(part.weight[j]), float(part.target[j, 0])) for j in range(s, e)]
             for s, e in zip(part.starts, part.ends, strict=True)]
    for _ in range(5):
        split_mask = rng.random(part.n_nodes) < 0.8
        idx = np.flatnonzero(split_mask)
        masks = [rng.random(len(model[i])) < rng.choice([0.0, 0.3, 1.0]) for i in idx]
        lengths = node_byte_lengths(part.starts[idx], part.ends[idx])
        part.split(split_mask, pack([m.tolist() for m in masks]), offsets_from_lengths(lengths))
        model = [child for i, m in zip(idx, masks, strict=True)
                 for child in ([s for s, keep in zip(model[i], m, strict=True) if keep],
                               [s for s, keep in zip(model[i], m, strict=True) if not keep])]
        assert part.n_nodes == len(model)
        np.testing.assert_array_equal(part.ends - part.starts, [len(node) for node in model])
        for k, node in enumerate(model):
            s, e = part.starts[k], part.ends[k]
            assert list(zip(part.order[s:e].tolist(), part.weight[s:e].tolist(), part.target[s:e, 0].tolist(),
                            strict=True)) == node
            # a node's rows ascend: a Dask party's blocks, concatenated in block order, give its bitmaps
            assert np.all(np.diff(part.order[s:e]) > 0)
    assert part.n_nodes > 8


def test_splitting_nothing_closes_every_node() -> None:
    part = SamplePartition.bootstrap(0, [0, 1], np.zeros(10), None)
    part.split(np.zeros(2, bool), np.zeros(0, np.uint8), np.zeros(1, np.int64))
    assert part.n_nodes == 0 and len(part.starts) == len(part.ends) == 0


@pytest.mark.parametrize("seed", range(6))
def test_copy_bit_runs_moves_each_run_as_unpacking_would(seed: int) -> None:
    """Runs of any length from any bit to any bit: the bytes and ones of an unpack, move, repack reference."""
    rng = np.random.default_rng(seed)
    n_bits = int(rng.integers(1, 400))
    src_bits = rng.integers(0, 2, n_bits).astype(np.uint8)
    src = np.packbits(src_bits, bitorder="little")
    cuts = np.sort(rng.choice(np.arange(1, n_bits), size=min(n_bits - 1, int(rng.integers(0, 12))),
                              replace=False)) if n_bits > 1 else np.array([], np.int64)
    starts = np.concatenate([[0], cuts]).astype(np.int64)
    lengths = np.diff(np.concatenate([starts, [n_bits]])).astype(np.int64)
    order = rng.permutation(len(starts))  # the runs placed in another order, with gaps between them
    gaps = rng.integers(0, 9, len(starts))
    dst_at = np.empty(len(starts), np.int64)
    at = 0
    for i in order:
        at += int(gaps[i])
        dst_at[i] = at
        at += int(lengths[i])
    n_bytes = (at + 7) // 8 + int(rng.integers(0, 3))
    expected_bits = np.zeros(8 * n_bytes, np.uint8)
    for s, n, d in zip(starts, lengths, dst_at, strict=True):
        expected_bits[d:d + n] = src_bits[s:s + n]
    dst, ones = copy_bit_runs(src, starts, lengths, dst_at, n_bytes)
    assert dst.tobytes() == np.packbits(expected_bits, bitorder="little").tobytes()
    assert ones.tolist() == [int(src_bits[s:s + n].sum()) for s, n in zip(starts, lengths, strict=True)]
