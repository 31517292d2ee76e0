"""A level's split search: histogram subtraction gives the same splits, the plan matches the encrypted one's.

Subtraction derives a larger child's histograms as parent minus its smaller sibling's; the splits must be
bit for bit those of building every histogram from the rows (class counts with bootstrap weights, boosting's
(g, h) on their grid). And the search must not depend on the number of numba threads.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

from fedcore.data.binning import MISSING_BIN
from fedcore.data.split import split_vertical
from fedcore.trees.criteria import GINI, GRADIENT, SQUARED_ERROR
from fedcore.trees.fixed_gradients import GradientGrid
from fedcore.trees.level_histograms import find_best_splits, subtraction_plan
from fedcore.trees.partition import SamplePartition, node_byte_lengths, offsets_from_lengths, pack_split_bits
from fedcore.vertical.boosting_estimators import FederatedBoostingClassifier
from fedcore.vertical.estimators import FederatedForestClassifier
from tests.conftest import mixed_table
from tests.trees.test_model_digests import digest


def _reference_plan(feat_ptr, feat_local, node_rows, parents, previous):
    """The encrypted path's plan as first written: dictionaries, pair by pair."""
    derive_from = np.full(len(feat_local), -1, np.int64)
    sibling = np.full(len(feat_local), -1, np.int64)
    features = feat_local.tolist()
    for j, parent in enumerate(parents.tolist()):
        small, large = (2 * j, 2 * j + 1) if node_rows[2 * j] <= node_rows[2 * j + 1] else (2 * j + 1, 2 * j)
        if node_rows[small] < 2:
            continue
        small_pairs = {features[q]: q for q in range(feat_ptr[small], feat_ptr[small + 1])}
        for q in range(feat_ptr[large], feat_ptr[large + 1]):
            if features[q] in small_pairs and (parent, features[q]) in previous:
                derive_from[q] = previous[(parent, features[q])]
                sibling[q] = small_pairs[features[q]]
    return derive_from, sibling


def _candidates(rng, n_nodes: int, n_features: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Random candidates: k distinct features per node, as (feat_ptr, feat_local)."""
    feat_local = np.concatenate([rng.choice(n_features, k, replace=False) for _ in range(n_nodes)])
    return np.arange(n_nodes + 1, dtype=np.int64) * k, feat_local.astype(np.int32)


@pytest.mark.parametrize("seed", range(5))
def test_subtraction_plan_is_the_dictionary_plan(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_prev, n_features = 12, 9
    prev_ptr, prev_feat = _candidates(rng, n_prev, n_features, 5)
    prev_rows = rng.integers(0, 6, n_prev)
    prev_node = np.repeat(np.arange(n_prev), 5)
    previous = {(int(n), int(f)): q for q, (n, f) in enumerate(zip(prev_node, prev_feat, strict=True))
                if prev_rows[n] >= 2}
    parents = np.sort(rng.choice(n_prev, 7, replace=False))
    feat_ptr, feat_local = _candidates(rng, 14, n_features, 5)
    node_rows = rng.integers(0, 8, 14)
    expected = _reference_plan(feat_ptr, feat_local, node_rows, parents, previous)
    got = subtraction_plan(feat_ptr, feat_local, node_rows, parents,
                           (np.where(prev_rows[prev_node] >= 2, prev_node, -1), prev_feat))
    assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert (got[0] >= 0).any()  # the case derives something


def _problem(criterion: int, seed: int):
    """Bin codes, a 3-tree root partition and each node's candidates (all features) of a random table."""
    rng = np.random.default_rng(seed)
    n_rows, n_features = 600, 6
    codes = rng.integers(0, 40, (n_rows, n_features)).astype(np.uint8)
    codes[rng.random((n_rows, n_features)) < 0.05] = MISSING_BIN
    codes[:, 2] = rng.integers(0, 4, n_rows)  # few bins: many empty ones after subtraction
    if criterion == GRADIENT:
        raw = np.stack([rng.normal(size=(3, n_rows)), rng.random((3, n_rows)) + 0.1], axis=-1)
        grid, q = GradientGrid.of(raw, n_rows)
        y = grid.values(q)
        part = SamplePartition.bootstrap(seed, [0, 1, 2], y, None)
    else:
        part = SamplePartition.bootstrap(seed, [0, 1, 2], rng.integers(0, 3, n_rows).astype(float), n_rows)
    return codes, part


@pytest.mark.parametrize("criterion", [GINI, GRADIENT])
@pytest.mark.parametrize("seed", range(3))
def test_subtracted_levels_find_the_same_splits(criterion: int, seed: int) -> None:
    codes, part = _problem(criterion, seed)
    n_stats = 3
    is_cat = np.array([False, False, True, False, False, False])
    derived = 0
    kept = None
    split_idx = np.zeros(0, np.int64)
    for depth in range(4):
        n_nodes = len(part.starts)
        feat_ptr = np.arange(n_nodes + 1, dtype=np.int64) * codes.shape[1]
        feat_local = np.tile(np.arange(codes.shape[1], dtype=np.int32), n_nodes)
        feat_rank = feat_local.copy()
        args = (codes, part.target, part.order, part.weight, part.starts, part.ends, feat_ptr, feat_local,
                feat_rank, is_cat, n_stats, criterion, 1.0, n_stats, 1.0)
        plain, plain_totals, _ = find_best_splits(*args)
        parents = None if depth == 0 else split_idx
        subtracted, totals, kept_next = find_best_splits(*args, parents, kept, True)
        if kept is not None:
            derived += int((subtraction_plan(feat_ptr, feat_local, part.ends - part.starts, parents,
                                             (np.where(kept.has, kept.pair_node, -1), kept.pair_feat))[0]
                            >= 0).sum())
        kept = kept_next
        for name in ("gain", "rank", "feature", "bin", "missing_left", "is_categorical", "cat_bits"):
            assert getattr(plain, name).tobytes() == getattr(subtracted, name).tobytes(), name
        assert plain_totals.tobytes() == totals.tobytes()
        split_mask = np.isfinite(plain.gain)
        split_idx = np.flatnonzero(split_mask)
        if not len(split_idx):
            break
        starts, ends = part.starts[split_idx], part.ends[split_idx]
        offsets = offsets_from_lengths(node_byte_lengths(starts, ends))
        c = plain
        bits = pack_split_bits(np.asfortranarray(codes), part.order, starts, ends, c.feature[split_idx],
                               c.bin[split_idx], c.missing_left[split_idx], c.is_categorical[split_idx],
                               c.cat_bits[split_idx], offsets)
        part.split(split_mask, bits, offsets)
    assert derived > 20  # most larger children were derived


def test_regression_histograms_are_never_kept() -> None:
    codes, part = _problem(GINI, 0)
    n = len(part.starts)
    _, _, kept = find_best_splits(codes, part.target, part.order, part.weight, part.starts, part.ends,
                                  np.arange(n + 1, dtype=np.int64), np.zeros(n, np.int32),
                                  np.zeros(n, np.int32), np.zeros(6, bool), 2, SQUARED_ERROR, 1.0, 2,
                                  keep=True)
    assert kept is None  # float sums: exact only over targets on their grid, which the kernel cannot check


def _models() -> list[str]:
    table = mixed_table(n_rows=400, seed=2, n_classes=3)
    out = []
    for model in (FederatedBoostingClassifier(n_estimators=3, max_depth=4, random_state=1),
                  FederatedForestClassifier(n_estimators=4, max_depth=6, max_features=None, random_state=1),
                  FederatedForestClassifier(n_estimators=4, max_depth=6, random_state=1)):
        model.fit(split_vertical(table, 2, label="target", seed=1, label_party=0), label="target")
        s = model.master_.structure
        arrays = {f: getattr(s, f) for f in ("tree", "node", "left", "right", "owner", "weight", "value")}
        for index, party in enumerate(model.parties_):
            arrays.update({f"{index}.{f}": np.asarray(getattr(party.model, f))
                           for f in ("feature", "threshold", "missing_left", "cat_bits")})
        out.append(digest(arrays))
    return out


def test_models_do_not_depend_on_the_number_of_threads() -> None:
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba runs one thread here: there is no other thread count to compare with")
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = _models()
        numba.set_num_threads(2)
        two = _models()
    finally:
        numba.set_num_threads(before)
    assert one == two
