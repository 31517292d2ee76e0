"""Prediction kernels (fedcore/trees/predictor.py) against plain Python walks over random forests.

Random partial forests: threshold prefix bitmaps, each party's one-round split sets (its own tests, both
branches elsewhere), the master's routing by them, that they say exactly what the paper's leaf sets say,
node-by-node routing, and column encoding. All comparisons are exact (bit sets and nodes).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from fedcore.data.binning import MISSING_BIN, fit_column
from fedcore.trees.partition import node_byte_lengths, offsets_from_lengths, pack_split_bits
from fedcore.trees.predictor import (
    ThresholdIndex,
    encode_columns,
    own_split_sets,
    route_by_split_sets,
    route_step,
)
from fedcore.trees.structure import leaf_numbering, tree_offsets
from fedcore.vertical.prediction_rows import owned_slots

GRID = np.array([-np.inf, -2.0, -0.5, 0.0, 0.25, 1.0, 3.0, np.inf])
"""Numeric values and thresholds share this grid, so x == threshold happens often."""


def test_left(x: float, threshold: float, missing_left: bool, is_cat: bool, bits: np.ndarray) -> bool:
    """The documented test of a raw value: NaN -> missing_left; categorical code in the bitset; x <= t."""
    if np.isnan(x):
        return bool(missing_left)
    if is_cat:
        code = int(x)
        return bool((int(bits[code // 64]) >> (code % 64)) & 1)
    return bool(x <= threshold)


test_left.__test__ = False  # a helper, not a test


@dataclass
class Forest:
    """A random forest structure and, per party, its partial view.

    The structure is sorted by tree, node, with breadth-first ids; the view: owner per node, and per party the
    arrays of PartialForest (feature -1 off its own nodes).
    """

    tree: np.ndarray
    left: np.ndarray
    right: np.ndarray
    owner: np.ndarray
    n_trees: int
    parties: list[dict[str, np.ndarray]]
    X: list[np.ndarray]  # per party, (n_rows, n_columns) float64: numbers, category codes, NaN
    is_cat_column: list[np.ndarray]


def random_tree(rng: np.random.Generator, max_depth: int) -> tuple[list[int], list[int]]:
    """left/right node ids (-1 for leaves) of one tree numbered breadth first, as the master numbers them."""
    left, right, level, depth = [-1], [-1], [0], 0
    while level and depth < max_depth:
        nxt = []
        for n in level:
            if rng.random() < (0.95 if depth < 2 else 0.6):
                left[n], right[n] = len(left), len(left) + 1
                left += [-1, -1]
                right += [-1, -1]
                nxt += [left[n], right[n]]
        level, depth = nxt, depth + 1
    return left, right


def random_columns(rng: np.random.Generator, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Two numeric columns on GRID (10% NaN) and two categorical code columns (one with codes up to 250)."""
    X = np.empty((n_rows, 4), order="F")
    X[:, 0] = rng.choice(GRID, n_rows)
    X[:, 1] = rng.choice(GRID[1:-1], n_rows) + rng.choice([0.0, 0.1], n_rows)
    X[:, 2] = rng.integers(0, 4, n_rows)
    X[:, 3] = rng.choice([0, 63, 64, 65, 127, 128, 200, 250], n_rows)
    X[rng.random((n_rows, 4)) < 0.1] = np.nan
    return X, np.array([False, False, True, True])


def random_forest(seed: int, n_rows: int, n_parties: int = 3, n_trees: int = 6, max_depth: int = 6) -> Forest:
    rng = np.random.default_rng(seed)
    trees = [random_tree(rng, max_depth) for _ in range(n_trees)]
    tree = np.concatenate([np.full(len(lt), t, np.int32) for t, (lt, _) in enumerate(trees)])
    left = np.concatenate([np.array(lt, np.int32) for lt, _ in trees])
    right = np.concatenate([np.array(rt, np.int32) for _, rt in trees])
    n = len(tree)
    owner = np.where(left >= 0, rng.integers(0, n_parties, n), -1)
    parties, Xs, cats = [], [], []
    for p in range(n_parties):
        X, is_cat_column = random_columns(rng, n_rows)
        mine = owner == p
        feature = np.where(mine, rng.integers(0, 4, n), -1).astype(np.int32)
        is_cat = mine & is_cat_column[np.maximum(feature, 0)]
        threshold = np.where(mine & ~is_cat, rng.choice(GRID[1:], n), np.nan)
        parties.append({
            "feature": feature, "threshold": threshold, "missing_left": mine & (rng.random(n) < 0.5),
            "is_cat": is_cat,
            "cat_bits": np.where(is_cat[:, None], rng.integers(0, 2**63, (n, 4), dtype=np.uint64)
                                * np.uint64(2) + np.uint64(1), np.uint64(0)).astype(np.uint64),
        })
        Xs.append(X)
        cats.append(is_cat_column)
    return Forest(tree, left, right, owner, n_trees, parties, Xs, cats)


def node_test(forest: Forest, p: int, g: int, row: int) -> bool:
    """Does `row` go left at global node g, by party p's test (p must own g)?"""
    a = forest.parties[p]
    f = a["feature"][g]
    return test_left(forest.X[p][row, f], a["threshold"][g], a["missing_left"][g], a["is_cat"][g],
                     a["cat_bits"][g])


def reached_nodes(forest: Forest, p: int | None, t: int, row: int) -> list[int]:
    """Global nodes `row` reaches in tree t, following party p's tests on its nodes.

    Both branches elsewhere; p None: every owner's test (the full-information walk, one leaf).
    """
    base = int(np.searchsorted(forest.tree, t))
    out, stack = [], [0]
    while stack:
        g = base + stack.pop()
        out.append(g)
        if forest.left[g] < 0:
            continue
        o = int(forest.owner[g])
        if p is None or o == p:
            stack.append(forest.left[g] if node_test(forest, o, g, row) else forest.right[g])
        else:
            stack += [forest.left[g], forest.right[g]]
    return sorted(out)


def reached_leaves(forest: Forest, p: int | None, t: int, row: int) -> list[int]:
    """The leaves among `reached_nodes`."""
    return [g for g in reached_nodes(forest, p, t, row) if forest.left[g] < 0]


def pack_rows(rows: list[int], n_rows: int) -> np.ndarray:
    """A row set as uint64 words: row r is bit r % 64 of word r // 64."""
    words = [0] * ((n_rows + 63) // 64)
    for r in rows:
        words[r // 64] |= 1 << (r % 64)
    return np.array(words, dtype=np.uint64)


def party_sets(forest: Forest, p: int) -> np.ndarray:
    """The kernel's one-round split sets of party p."""
    a = forest.parties[p]
    index = ThresholdIndex(a["feature"], a["threshold"], a["is_cat"], forest.X[p].shape[1])
    prefix, missing = index.bitmaps(forest.X[p])
    return own_split_sets(forest.X[p], prefix, missing, index.node_row,
                          tree_offsets(forest.tree, forest.n_trees), forest.left, forest.right, a["feature"],
                          a["missing_left"], a["is_cat"], a["cat_bits"], owned_slots(a["feature"]))


def global_child(forest: Forest, g: int, side: np.ndarray) -> int:
    """The global index of node g's child (`side`: its left or right array, tree-local ids)."""
    return int(np.searchsorted(forest.tree, forest.tree[g])) + int(side[g])


ROW_COUNTS = [1, 63, 64, 65, 130]


@pytest.mark.parametrize("n_rows", ROW_COUNTS)
def test_threshold_bitmaps_are_prefix_tests(n_rows: int) -> None:
    """Each prefix bitmap holds exactly the rows at or below its threshold.

    prefix[base[f] + k] holds the rows with x <= k-th distinct threshold of feature f (NaN never), missing[f]
    the NaN rows; every owned numeric node points at its own threshold; tail bits stay 0.
    """
    forest = random_forest(n_rows, n_rows)
    for p, a in enumerate(forest.parties):
        X = forest.X[p]
        index = ThresholdIndex(a["feature"], a["threshold"], a["is_cat"], X.shape[1])
        prefix, missing = index.bitmaps(X)
        assert prefix.shape == (index.base[-1], (n_rows + 63) // 64) and missing.shape[0] == X.shape[1]
        for f in range(X.shape[1]):
            used = a["threshold"][(a["feature"] == f) & ~a["is_cat"]]
            np.testing.assert_array_equal(index.thresholds[f], np.unique(used))
            for k, t in enumerate(index.thresholds[f]):
                rows = [r for r in range(n_rows) if not np.isnan(X[r, f]) and X[r, f] <= t]
                np.testing.assert_array_equal(prefix[index.base[f] + k], pack_rows(rows, n_rows))
            np.testing.assert_array_equal(missing[f],
                                          pack_rows(list(np.flatnonzero(np.isnan(X[:, f]))), n_rows))
        for g in range(len(a["feature"])):
            if a["feature"][g] >= 0 and not a["is_cat"][g]:
                assert index.flat[index.node_row[g]] == a["threshold"][g]
            else:
                assert index.node_row[g] == -1


@pytest.mark.parametrize("n_rows", ROW_COUNTS)
def test_split_sets_hold_the_rows_a_partys_own_tests_send_to_its_node_and_left(n_rows: int) -> None:
    """Row r is in owned node g's set iff party p's walk (both ways off its own) reaches g and goes left."""
    forest = random_forest(100 + n_rows, n_rows)
    for p in range(len(forest.parties)):
        owned = np.flatnonzero(forest.parties[p]["feature"] >= 0)
        got = party_sets(forest, p)
        assert got.shape == (len(owned), (n_rows + 63) // 64) and got.dtype == np.uint64
        expected = np.zeros_like(got)
        for t in range(forest.n_trees):
            for row in range(n_rows):
                for g in reached_nodes(forest, p, t, row):
                    if forest.owner[g] == p and node_test(forest, p, g, row):
                        slot = int(np.searchsorted(owned, g))
                        expected[slot, row // 64] |= np.uint64(1) << np.uint64(row % 64)
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("n_rows", ROW_COUNTS)
def test_routing_by_the_split_sets_is_the_full_information_leaf(n_rows: int) -> None:
    """The master's walk by every owner's bits ends each row in the leaf the walk with all tests reaches."""
    forest = random_forest(200 + n_rows, n_rows)
    set_row, sets = np.full(len(forest.tree), -1, np.int64), []
    for p in range(len(forest.parties)):
        owned = np.flatnonzero(forest.owner == p)
        set_row[owned] = sum(len(part) for part in sets) + np.arange(len(owned))
        sets.append(party_sets(forest, p))
    got = route_by_split_sets(np.concatenate(sets), set_row, tree_offsets(forest.tree, forest.n_trees),
                              forest.left, forest.right, n_rows)
    expected = np.array([[reached_leaves(forest, None, t, row)[0] for t in range(forest.n_trees)]
                         for row in range(n_rows)])
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("n_rows", ROW_COUNTS)
def test_split_sets_say_what_the_papers_leaf_sets_say(n_rows: int) -> None:
    """What the master learns is unchanged: a party's leaf sets follow from its split sets and back.

    Forward: a child of an owned node is reached by the node's reached rows going that way (left: the
    node's set; right: reached and not in it), a child of another's node by all its reached rows. Back: an
    owned node's set is the rows of the leaves under its left child.
    """
    forest = random_forest(300 + n_rows, n_rows)
    full = pack_rows(list(range(n_rows)), n_rows)
    leaf_offsets, leaf_nodes, _ = leaf_numbering(forest.tree, forest.left, forest.n_trees)
    for p in range(len(forest.parties)):
        owned = np.flatnonzero(forest.owner == p)
        sets = party_sets(forest, p)
        reached = {}
        for t in range(forest.n_trees):  # forward, from the root down (children after parents)
            base = int(np.searchsorted(forest.tree, t))
            reached[base] = full
            for g in range(base, int(np.searchsorted(forest.tree, t + 1))):
                if forest.left[g] < 0:
                    continue
                lc, rc = global_child(forest, g, forest.left), global_child(forest, g, forest.right)
                if forest.owner[g] == p:
                    went_left = sets[int(np.searchsorted(owned, g))]
                    reached[lc], reached[rc] = went_left, reached[g] & ~went_left
                else:
                    reached[lc] = reached[rc] = reached[g]
        walked = {g: pack_rows([row for row in range(n_rows)
                                if g in reached_leaves(forest, p, int(forest.tree[g]), row)], n_rows)
                  for g in leaf_nodes}
        for g in leaf_nodes:
            np.testing.assert_array_equal(reached[g], walked[g])
        for slot, g in enumerate(owned):  # back: the leaves under the left child
            under = _subtree_leaves(forest, global_child(forest, g, forest.left))
            np.testing.assert_array_equal(sets[slot], np.bitwise_or.reduce([walked[leaf] for leaf in under]))
    assert leaf_offsets[-1] == len(leaf_nodes)


def _subtree_leaves(forest: Forest, g: int) -> list[int]:
    """The global leaves under node g."""
    if forest.left[g] < 0:
        return [g]
    return (_subtree_leaves(forest, global_child(forest, g, forest.left))
            + _subtree_leaves(forest, global_child(forest, g, forest.right)))

def test_route_step_is_the_owner_test() -> None:
    n_rows = 90
    forest = random_forest(17, n_rows)
    rng = np.random.default_rng(0)
    for p, a in enumerate(forest.parties):
        owned = np.flatnonzero(a["feature"] >= 0)
        rows = rng.integers(0, n_rows, 500)
        nodes = rng.choice(owned, 500)
        got = route_step(forest.X[p], rows, nodes, a["feature"], a["threshold"], a["missing_left"],
                         a["is_cat"], a["cat_bits"])
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got,
                                      [node_test(forest, p, g, r) for r, g in zip(rows, nodes, strict=True)])


def test_training_partition_and_prediction_routing_agree() -> None:
    """A split on bin codes and the same split on raw values send every training row the same way.

    Training splits on codes (code <= bin, as pack_split_bits), prediction on raw values (x <=
    threshold_value(bin), as route_step); for every bin including 254 (all values left), both missing
    directions and categorical sets.
    """
    rng = np.random.default_rng(21)
    frame = pd.DataFrame({"x": rng.normal(size=300).round(2),
                          "c": rng.choice(list("pqrstu"), 300).astype(object)})
    frame.loc[rng.random(300) < 0.1, "x"] = np.nan
    frame.loc[rng.random(300) < 0.1, "c"] = None
    columns = [fit_column(frame[name], max_bins=16) for name in ("x", "c")]
    codes = np.asfortranarray(np.stack([c.transform(frame[c.name]) for c in columns], axis=1))
    X = encode_columns(frame, ["x", "c"], [None, columns[1].categories])
    n_bins = columns[0].n_bins
    bins = np.array(list(range(n_bins)) + [MISSING_BIN - 1] + [0] * 4, np.int32)
    n = len(bins)
    feats = np.array([0] * (n - 4) + [1] * 4, np.int32)
    is_cat = feats == 1
    cat_bits = np.zeros((n, 4), np.uint64)
    cat_bits[is_cat, 0] = rng.integers(1, 63, 4).astype(np.uint64)
    for ml in (False, True):
        missing_left = np.full(n, ml)
        starts, ends = np.zeros(n, np.int64), np.full(n, 300, np.int64)
        offsets = offsets_from_lengths(node_byte_lengths(starts, ends))
        packed = pack_split_bits(codes, np.arange(300, dtype=np.int32), starts, ends, feats, bins,
                                 missing_left, is_cat, cat_bits, offsets)
        threshold = np.array([columns[0].threshold_value(int(b)) if not c else np.nan
                              for b, c in zip(bins, is_cat, strict=True)])
        rows = np.tile(np.arange(300), n)
        nodes = np.repeat(np.arange(n), 300)
        routed = route_step(X, rows, nodes, feats, threshold, missing_left, is_cat, cat_bits)
        trained = np.unpackbits(packed, bitorder="little").reshape(n, -1)[:, :300].ravel()
        np.testing.assert_array_equal(routed, trained)


def test_encode_columns() -> None:
    """Numbers as numbers, categories as vocabulary codes, in a Fortran-ordered float64 matrix.

    Unparseable numbers, and unknown or missing categories, become NaN.
    """
    frame = pd.DataFrame({
        "n": pd.Series([1.5, None, "7", "x", -2], dtype=object),
        "c": pd.Series(["b", "zz", None, "a", "b"], dtype=object),
        "k": pd.Categorical(["y", "x", "y", None, "x"]),
        "f": [True, False, True, True, False],
    })
    X = encode_columns(frame, ["n", "c", "k", "f"], [None, ["a", "b", "c"], ["x", "y"], ["False", "True"]])
    expected = np.array([[1.5, 1, 1, 1], [np.nan, np.nan, 0, 0], [7, np.nan, 1, 1], [np.nan, 0, np.nan, 1],
                         [-2, 1, 0, 0]], dtype=np.float64)
    np.testing.assert_array_equal(X, expected)
    assert X.dtype == np.float64 and X.flags.f_contiguous


def test_encode_columns_unknown_categories_without_deprecated_pandas_behaviour() -> None:
    """An unknown category at prediction time must become NaN without relying on deprecated pandas."""
    frame = pd.DataFrame({"c": pd.Series(["a", "zz", None], dtype=object)})
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        X = encode_columns(frame, ["c"], [["a", "b"]])
    np.testing.assert_array_equal(X[:, 0], [0.0, np.nan, np.nan])
