"""Tree-table helpers (fedcore/trees/structure.py) against loops.

Tree offsets, the leaf numbering master and parties must agree on, and joining batches of a party's splits.
"""

from __future__ import annotations

import numpy as np

from fedcore.trees.grower import sort_records
from fedcore.trees.structure import NO_CHILD, PartySplits, leaf_numbering, tree_offsets


def random_structure(seed: int, n_trees: int) -> tuple[np.ndarray, np.ndarray]:
    """(tree, left) of n_trees trees numbered breadth first, sorted by (tree, node).

    Some trees are a lone leaf.
    """
    rng = np.random.default_rng(seed)
    tree, left = [], []
    for t in range(n_trees):
        lt, level = [NO_CHILD], [0]
        while level and len(lt) < 40:
            nxt = []
            for n in level:
                if rng.random() < 0.6 and t % 3:
                    lt[n] = len(lt)
                    lt += [NO_CHILD, NO_CHILD]
                    nxt += [lt[n], lt[n] + 1]
            level = nxt
        tree += [t] * len(lt)
        left += lt
    return np.array(tree, np.int32), np.array(left, np.int32)


def test_tree_offsets_index_each_trees_first_node() -> None:
    tree, _ = random_structure(1, 7)
    offsets = tree_offsets(tree, 7)
    assert offsets.tolist() == [tree.tolist().index(t) for t in range(7)] + [len(tree)]
    assert tree_offsets(np.zeros(0, np.int32), 2).tolist() == [0, 0, 0]


def test_leaf_numbering_counts_leaves_in_node_order_per_tree() -> None:
    tree, left = random_structure(2, 9)
    offsets, leaf_nodes, slot = leaf_numbering(tree, left, 9)
    expected_nodes, expected_slot, expected_offsets = [], [-1] * len(tree), [0]
    for t in range(9):
        k = 0
        for g in range(len(tree)):
            if tree[g] == t and left[g] == NO_CHILD:
                expected_nodes.append(g)
                expected_slot[g] = k
                k += 1
        expected_offsets.append(expected_offsets[-1] + k)
    assert leaf_nodes.tolist() == expected_nodes
    assert slot.tolist() == expected_slot and slot.dtype == np.int32
    assert offsets.tolist() == expected_offsets


def test_party_splits_concatenate_and_empty() -> None:
    rng = np.random.default_rng(3)

    def batch(n: int) -> PartySplits:
        return PartySplits(rng.integers(0, 9, n).astype(np.int32), rng.integers(0, 9, n).astype(np.int32),
                           rng.integers(0, 9, n).astype(np.int32), rng.integers(-1, 254, n).astype(np.int32),
                           rng.random(n) < 0.5, rng.random(n) < 0.5,
                           rng.integers(0, 2**63, (n, 4), dtype=np.uint64))

    parts = [batch(3), PartySplits.empty(), batch(5)]
    joined = PartySplits.concatenate(parts)
    for name in ("tree", "node", "feature", "bin", "missing_left", "is_categorical", "cat_bits"):
        np.testing.assert_array_equal(getattr(joined, name),
                                      np.concatenate([getattr(p, name) for p in parts]))
        assert getattr(joined, name).dtype == getattr(parts[0], name).dtype
    empty = PartySplits.concatenate([])
    assert len(empty.tree) == 0 and empty.cat_bits.shape == (0, 4) and empty.cat_bits.dtype == np.uint64


def test_a_batchs_level_records_join_sorted_by_tree_and_node() -> None:
    """The grower's `sort_records`: each field at its record's (tree, node) rank, as a lexsort puts it."""
    rng = np.random.default_rng(0)
    pieces = []
    for level in range(4):
        tree = np.sort(rng.integers(0, 5, 30)).astype(np.int32)
        node = (np.arange(30) + 100 * level).astype(np.int32)
        pieces.append({"tree": tree, "node": node, "value": rng.random((30, 2)), "depth": np.full(30, level)})
    joined = sort_records(pieces)
    tree, node = (np.concatenate([p[name] for p in pieces]) for name in ("tree", "node"))
    order = np.lexsort((node, tree))
    assert joined["tree"].dtype == np.int32 and joined["tree"].tolist() == tree[order].tolist()
    assert joined["node"].tolist() == node[order].tolist()
    np.testing.assert_array_equal(joined["value"], np.concatenate([p["value"] for p in pieces])[order])
    assert joined["depth"].tolist() == np.concatenate([p["depth"] for p in pieces])[order].tolist()
