"""The party-side row kernels (fedcore.trees.rowwork) against brute-force NumPy references.

The kernels are driven by fedcore.horizontal.rows; the references use the old (tree slot x row) position
matrix. Exact equality on random inputs with NaNs, signed zeros, empty nodes, rows in leaves, k = 1 and k > 1
and many trees.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.errors import ProtocolError
from fedcore.horizontal.rows import PartyRows, RowPartition, narrow
from fedcore.privacy.ldp import LabelLDP
from fedcore.protocol.messages import Arrays, Header
from fedcore.randomness import counter_key
from fedcore.trees import rowwork
from tests.privacy.reports import instant_bits


# -- references: the (slot, row) -> open node matrix and brute-force loops over it ------------------------
def positions(part: RowPartition) -> np.ndarray:
    """The old layout: pos[slot, row] = open node of the row in that tree (-1: in a leaf)."""
    pos = np.full((part.n_slots, part.n_rows), -1, np.int64)
    for p in range(part.n_open):
        rows = part.order[part.starts[p]:part.ends[p]]
        assert np.all(np.diff(rows) > 0), "a node lists its rows in ascending order"
        assert part.starts[p] == part.ends[p] or part.node_slot[p] >= 0
        assert np.all(pos[part.node_slot[p], rows] == -1), "a row sits in one node per tree"
        pos[part.node_slot[p], rows] = p
    return pos


def apply_reference(pos, X, chosen, next_pos, features, thresholds):
    """RowPartition.apply as it was: NaN goes right, x <= t left, rows of nodes that do not split leave."""
    rank = np.cumsum(chosen >= 0) - 1
    new = np.full_like(pos, -1)
    for s, r in zip(*np.nonzero(pos >= 0), strict=True):
        p = pos[s, r]
        if chosen[p] >= 0:
            right = not X[r, features[p, chosen[p]]] <= thresholds[p, chosen[p]]
            new[s, r] = next_pos[2 * rank[p] + right]
    return new


def entries(pos):
    slot, rows = np.nonzero(pos >= 0)  # slot-major, row-minor
    return slot, rows, pos[slot, rows]


def ranges_reference(pos, X, features):
    n_open, k = features.shape
    low, high = np.full(n_open * k, np.inf), np.full(n_open * k, -np.inf)
    _, rows, p = entries(pos)
    values = X[rows[:, None], features[p]]
    codes = p[:, None] * k + np.arange(k)
    present = ~np.isnan(values)
    np.minimum.at(low, codes[present], values[present])
    np.maximum.at(high, codes[present], values[present])
    return low.reshape(n_open, k), high.reshape(n_open, k)


def branch_codes(pos, X, features, thresholds):
    _, rows, p = entries(pos)
    k = features.shape[1]
    right = ~(X[rows[:, None], features[p]] <= thresholds[p])
    return rows, (p[:, None] * k + np.arange(k)) * 2 + right


# -- random partitions ----------------------------------------------------------------------------------
class FakeSchema:
    def __init__(self, n_classes):
        self.n_classes = n_classes


def random_rows(rng, n_rows, n_features, n_classes, nan_share=0.15):
    X = rng.integers(-3, 4, size=(n_rows, n_features)).astype(np.float64)  # many ties
    X[rng.random(X.shape) < 0.1] = -0.0
    X[rng.random(X.shape) < nan_share] = np.nan
    X[:, 0] = np.nan  # a feature with no value at all
    rows = PartyRows.__new__(PartyRows)
    rows.name, rows.schema = "p", FakeSchema(n_classes)
    rows.X = np.asfortranarray(X)  # column-major, as `PartyRows` holds it (one compiled layout)
    rows.y, rows.n_rows = rng.integers(0, n_classes, n_rows), n_rows
    rows.partition = RowPartition(n_rows)
    rows._codes, rows._in_batch = None, False
    return rows


def draw_candidates(rng, n_open, k, n_features):
    features = np.stack([rng.choice(n_features, k, replace=False) for _ in range(n_open)]) if n_open else \
        np.zeros((0, k), np.int64)
    thresholds = rng.integers(-3, 4, size=(n_open, k)) + rng.choice([0.0, 0.5], size=(n_open, k))
    thresholds[rng.random((n_open, k)) < 0.05] = np.nan  # no usable range: every row goes right
    return features.astype(np.int64), thresholds


def draw_decisions(rng, n_open, k):
    chosen = np.where(rng.random(n_open) < 0.8, rng.integers(0, k, n_open), -1)
    n_children = 2 * int((chosen >= 0).sum())
    is_open = rng.random(n_children) < 0.85
    next_pos = np.full(n_children, -1)
    next_pos[is_open] = rng.permutation(int(is_open.sum()))
    if is_open.any() and not is_open.all() and rng.random() < 0.5:  # a position no child takes: an empty node
        next_pos[next_pos == next_pos.max()] += 1
    return chosen.astype(np.int32), next_pos.astype(np.int32)


def levels(seed, n_rows=300, n_features=6, n_classes=5, n_trees=7, k=3, depth=5):
    """Yield (rows, pos, features, thresholds) per level of a random tree batch.

    The partition under test moves with the reference matrix, checked at each step.
    """
    rng = np.random.default_rng(seed)
    rows = random_rows(rng, n_rows, n_features, n_classes)
    rows.start_level(Header({"new_batch": True, "n_trees": n_trees}), Arrays(), n_trees)
    pos = np.repeat(np.arange(n_trees)[:, None], n_rows, axis=1)
    for _ in range(depth):
        features, thresholds = draw_candidates(rng, rows.partition.n_open, k, n_features)
        rows.features, rows.thresholds = features, thresholds
        assert np.array_equal(positions(rows.partition), pos)
        yield rows, pos, features, thresholds
        chosen, next_pos = draw_decisions(rng, rows.partition.n_open, k)
        n_open = int(next_pos.max()) + 1 if len(next_pos) else 0
        rows.start_level(Header(), Arrays({"chosen": chosen, "next_pos": next_pos}), n_open)
        pos = apply_reference(pos, rows.X, chosen, next_pos, features, thresholds)
        if n_open == 0:
            break
    assert np.array_equal(positions(rows.partition), pos)


CASES = [dict(seed=1), dict(seed=2, k=1), dict(seed=3, n_trees=40, n_rows=120, k=4, depth=7),
         dict(seed=6, n_trees=1, n_rows=50, k=2, depth=8), dict(seed=5, n_rows=0, n_trees=3)]


# -- the kernels --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_apply_ranges_and_class_counts_match_the_position_matrix(case) -> None:
    for rows, pos, features, thresholds in levels(**case):
        low, high = rows.ranges()
        ref_low, ref_high = ranges_reference(pos, rows.X, features)
        # equal including the sign of zeros (-0.0 == 0.0 would hide a difference)
        assert low.dtype == high.dtype == np.float64
        assert low.tobytes() == ref_low.tobytes() and high.tobytes() == ref_high.tobytes()
        n_open, k = features.shape
        C = rows.schema.n_classes
        r, codes = branch_codes(pos, rows.X, features, thresholds)
        ref = np.bincount((codes * C + rows.y[r, None]).reshape(-1), minlength=n_open * k * 2 * C)
        counts = rows.class_counts()
        assert counts.dtype == np.uint16 and np.array_equal(counts, ref.reshape(n_open, k, 2, C))
        wide = rows.class_counts(np.int64)
        assert wide.dtype == np.int64 and np.array_equal(wide, counts)


@pytest.mark.parametrize("case", CASES[:3])
def test_regression_sums_are_exact_integers(case) -> None:
    big = 1 << 45
    for rows, pos, features, thresholds in levels(**case):
        q = np.random.default_rng(len(pos)).integers(-big, big, rows.n_rows)
        n_open, k = features.shape
        r, codes = branch_codes(pos, rows.X, features, thresholds)
        n = np.bincount(codes.reshape(-1), minlength=n_open * k * 2)
        s = np.zeros(n_open * k * 2, dtype=object)  # Python integers: no rounding anywhere
        np.add.at(s, codes.reshape(-1), np.repeat(q[r], k).astype(object))
        sums = rows.regression_sums(q)
        assert sums.dtype == np.int64
        assert np.array_equal(sums[..., 0], n.reshape(n_open, k, 2))
        assert sums[..., 1].reshape(-1).tolist() == s.tolist()


@pytest.mark.parametrize("ldp", [LabelLDP(mechanism="bloom", n_bits=16, n_hashes=2),
                                 LabelLDP(mechanism="krr", report_epsilon=2.0),
                                 LabelLDP(mechanism="oue", report_epsilon=2.0)])
def test_ldp_report_sums_add_each_rows_report_drawn_at_its_slot_and_level(ldp) -> None:
    """Row r in tree slot s at report t adds its `instant_report` of (r, s, t) to each branch it takes."""
    permanent_key, key = counter_key(4, "ldp_permanent"), counter_key(4, "ldp_instant")
    for report, (rows, pos, features, thresholds) in enumerate(levels(seed=7, n_trees=9, n_rows=90)):
        C = rows.schema.n_classes
        ldp = ldp.sized_for(C)
        rows.draw_permanent(ldp, permanent_key)
        np.testing.assert_array_equal(rows.permanent, ldp.permanent_bits(rows.y, C, permanent_key))
        reports = np.stack([instant_bits(ldp, rows.permanent, key, report=report + 10, slot=s)
                            for s in range(pos.shape[0])])  # (slot, row, bit): every row's report
        slots, r, _ = entries(pos)
        _, codes = branch_codes(pos, rows.X, features, thresholds)
        size = features.size * 2
        ref_sums = np.zeros((size, rows.permanent.shape[1]), np.int64)
        for j in range(codes.shape[1]):
            np.add.at(ref_sums, codes[:, j], reports[slots, r].astype(np.int64))
        sums, sizes = rows.ldp_report_sums(ldp, key, report + 10)
        assert sums.dtype == sizes.dtype == np.int64
        assert np.array_equal(sums, ref_sums)
        assert np.array_equal(sizes, np.bincount(codes.reshape(-1), minlength=size))


def test_active_slots_per_row() -> None:
    for rows, pos, _, _ in levels(seed=9, n_trees=12):
        expected = int((pos >= 0).sum(axis=0).max()) if pos.size else 0
        assert rows.partition.active_slots_per_row() == expected


def test_results_do_not_depend_on_the_number_of_threads() -> None:
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba runs one thread here: there is no other thread count to compare with")
    before = numba.get_num_threads()
    try:
        outputs = []
        for threads in (1, numba.config.NUMBA_NUM_THREADS):
            numba.set_num_threads(threads)
            out = []
            ldp = LabelLDP(mechanism="bloom").sized_for(5)  # instant draws too
            for report, (rows, _, _, _) in enumerate(levels(seed=11, n_trees=20, k=4, depth=6)):
                rows.draw_permanent(ldp, counter_key(2, "ldp_permanent"))
                out += [*rows.ranges(), rows.class_counts(), rows.partition.order.copy(), rows.permanent,
                        *rows.ldp_report_sums(ldp, counter_key(2, "ldp_instant"), report)]
            outputs.append(out)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(outputs[0], outputs[-1], strict=True))
    finally:
        numba.set_num_threads(before)


def test_split_nodes_is_stable_and_leaves_other_segments_alone() -> None:
    rng = np.random.default_rng(3)
    X = np.asfortranarray(rng.random((50, 2)))  # column-major, as the party holds it
    X[rng.random(50) < 0.2, 1] = np.nan
    order = rng.permutation(50).astype(np.int32)
    before = order.copy()
    starts, ends, slot = np.array([0, 20, 30]), np.array([20, 30, 45]), np.array([0, 0, 1])
    chosen = np.array([1, -1, 0])  # node 1 does not split; node 2 splits on its candidate 0 (feature 1)
    features, thresholds = np.array([[0, 1], [0, 1], [1, 0]]), np.full((3, 2), 0.5)
    new_starts, new_ends, new_slot = rowwork.split_nodes(order, starts, ends, slot, X, chosen,
                                                         np.array([2, -1, 0, 1]), features, thresholds, 4)
    for node, (s, e) in ((0, (0, 20)), (2, (30, 45))):
        seg = before[s:e]
        goes_left = X[seg, 1] <= 0.5
        assert np.array_equal(order[s:e], np.concatenate([seg[goes_left], seg[~goes_left]]))
        middle = s + int(goes_left.sum())
        if node == 0:  # left child at position 2, right child a leaf
            assert (new_starts[2], new_ends[2], new_slot[2]) == (0, middle, 0)
        else:
            assert (new_starts[0], new_ends[0], new_slot[0]) == (30, middle, 1)
            assert (new_starts[1], new_ends[1], new_slot[1]) == (middle, 45, 1)
    assert new_slot[3] == -1 and new_starts[3] == new_ends[3]  # a position no child took: empty
    assert np.array_equal(order[20:30], before[20:30]) and np.array_equal(order[45:], before[45:])


def test_bad_decisions_are_refused() -> None:
    rows = next(levels(seed=13, n_trees=2, k=2))[0]
    with pytest.raises(ProtocolError, match="do not match"):
        rows.start_level(Header(), Arrays({"chosen": np.array([0], np.int32),
                                           "next_pos": np.array([0, 1], np.int32)}), 2)
    with pytest.raises(ProtocolError, match="candidates outside"):
        rows.start_level(Header(), Arrays({"chosen": np.array([2, -1], np.int32),
                                           "next_pos": np.array([0, 1], np.int32)}), 2)
    for next_pos in ([0, 0], [0, 2]):  # two children in one node; a position beyond the children
        with pytest.raises(ProtocolError, match="its own open node"):
            rows.start_level(Header(), Arrays({"chosen": np.array([0, -1], np.int32),
                                               "next_pos": np.array(next_pos, np.int32)}), 1)


def test_class_counts_refuse_a_type_too_narrow_for_the_rows() -> None:
    rows = next(levels(seed=15, n_rows=300))[0]
    with pytest.raises(ValueError, match="do not fit"):
        rows.class_counts(np.uint8)


def test_narrow_counts_keep_their_values() -> None:
    assert narrow(np.array([0, 255])).dtype == np.uint8
    assert narrow(np.array([3, 70000])).dtype == np.uint32
    assert narrow(np.array([-5, 200])).dtype == np.int16
    assert narrow(np.zeros(0, np.int64)).size == 0
    values = np.array([[1, -(1 << 40)], [7, 1 << 40]])
    assert np.array_equal(narrow(values).astype(np.int64), values)
