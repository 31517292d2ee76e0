"""The held-out curves' label counts (fedcore.curves) against scikit-learn's curves on the same scores."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import (
    average_precision_score,
    confusion_matrix,
    precision_recall_curve,
    roc_auc_score,
    roc_curve,
)

from fedcore.curves import (
    GRID,
    MIN_GROUP_ROWS,
    calibration_points,
    confusion_at,
    curve_metrics,
    pooled_groups,
    pr_points,
    roc_points,
    score_groups,
    youden_group,
)


def grouped_scores(table: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Each score rounded down to the threshold of the group it falls in."""
    cell = np.minimum((np.clip(score, 0, 1) * GRID).astype(np.int64), GRID - 1) / GRID
    edges = table[:, 0]  # highest first; the last is 0
    return edges[np.argmax(cell[:, None] >= edges[None, :] - 1e-12, axis=1)]


def sample(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    positive = rng.random(n) < 0.3
    score = np.clip(0.3 + 0.3 * positive + rng.normal(scale=0.2, size=n), 0, 1)
    return positive, score


@pytest.mark.parametrize("n, seed", [(500, 0), (57, 1), (2000, 2)])
def test_roc_and_pr_points_are_scikit_learns_on_the_grouped_scores(n, seed):
    positive, score = sample(n, seed)
    table = score_groups(positive, score)
    assert table[:, 1].sum() == n and table[:, 2].sum() == positive.sum() and table[-1, 0] == 0
    assert (table[:, 1] >= MIN_GROUP_ROWS).all()
    grouped = grouped_scores(table, score)
    fpr, tpr, _ = roc_curve(positive, grouped, drop_intermediate=False)
    np.testing.assert_array_equal(roc_points(table), np.column_stack([fpr, tpr]))
    precision, recall, _ = precision_recall_curve(positive, grouped, drop_intermediate=False)
    np.testing.assert_array_equal(pr_points(table), np.column_stack([recall, precision])[-2::-1])


def test_calibration_is_each_groups_mean_score_and_positive_share():
    positive, score = sample(800, 3)
    table = score_groups(positive, score)
    grouped = grouped_scores(table, score)
    edges = np.sort(np.unique(grouped))
    expected = [(score[grouped == e].mean(), positive[grouped == e].mean()) for e in edges]
    np.testing.assert_allclose(calibration_points(table), expected, rtol=1e-12)


def test_crafted_scores_reveal_no_single_rows_label():
    """One row alone in each cell (a master probing labels) still lands in groups of MIN_GROUP_ROWS rows."""
    rng = np.random.default_rng(4)
    score = np.r_[(np.arange(GRID) + 0.5) / GRID, np.full(40, 0.01)]
    positive = rng.random(len(score)) < 0.5
    table = score_groups(positive, score)
    assert (table[:, 1] >= MIN_GROUP_ROWS).all() and table[:, 1].sum() == len(score)


def test_fewer_rows_than_a_group_is_one_group():
    table = score_groups(np.array([True, False, True]), np.array([0.9, 0.2, 0.55]))
    np.testing.assert_array_equal(table[:, :3], [[0.0, 3, 2]])


def test_the_confusion_at_a_groups_threshold_and_youdens_choice_are_scikit_learns():
    positive, score = sample(700, 5)
    table = score_groups(positive, score)
    grouped = grouped_scores(table, score)
    for group, threshold in enumerate(table[:, 0]):
        expected = confusion_matrix(positive, grouped >= threshold)
        np.testing.assert_array_equal(confusion_at(table, group), expected)
    fpr, tpr, thresholds = roc_curve(positive, grouped, drop_intermediate=False)
    assert table[youden_group(table), 0] == thresholds[np.argmax(tpr - fpr)]


def test_a_threshold_is_kept_for_a_binary_label_only() -> None:
    from fedcore.session import held_out_evaluation

    three = np.array([[5, 1, 0], [0, 4, 2], [1, 0, 7]])
    metrics, evaluation, threshold = held_out_evaluation({"accuracy": 0.8}, three, ["a", "b", "c"], None, 0.3)
    assert threshold is None and evaluation["decision_threshold"] is None and metrics == {"accuracy": 0.8}
    _, evaluation, threshold = held_out_evaluation({}, np.array([[5, 1], [2, 4]]), ["no", "yes"], None, 0.3)
    assert threshold == 0.3 and evaluation["decision_threshold"] == 0.3


@pytest.mark.parametrize("sizes", [(700, 650, 900), (700, 40, 900), (30, 25, 12)])
def test_pooled_groups_are_the_pooled_rows_groups_at_the_edges_every_institution_has(sizes):
    """Horizontal: each institution's own groups, pooled at their shared edges, count the pooled rows there.

    Each pooled group holds exactly the rows of all institutions whose score is in [its edge, the next
    edge above); no institution reported a group under MIN_GROUP_ROWS rows (or its only group).
    """
    parts = [sample(n, seed) for seed, n in enumerate(sizes)]
    tables = [score_groups(*part) for part in parts]
    for table in tables:
        assert len(table) == 1 or (table[:, 1] >= MIN_GROUP_ROWS).all()
    pooled = pooled_groups(tables)
    shared = set.intersection(*[set(np.rint(t[:, 0] * GRID).astype(int).tolist()) for t in tables])
    assert np.rint(pooled[:, 0] * GRID).astype(int).tolist() == sorted(shared, reverse=True)
    positive = np.concatenate([p for p, _ in parts])
    score = np.concatenate([s for _, s in parts])
    cell = np.minimum((score * GRID).astype(np.int64), GRID - 1)
    upper = [GRID, *np.rint(pooled[:-1, 0] * GRID).astype(int).tolist()]
    for (edge, rows, positives, mean), top in zip(pooled, upper, strict=True):
        inside = (cell >= round(edge * GRID)) & (cell < top)
        assert (rows, positives) == (inside.sum(), positive[inside].sum())
        assert mean == pytest.approx(score[inside].mean(), rel=1e-12)
    # one institution alone: its own table back
    np.testing.assert_array_equal(pooled_groups(tables[:1]), tables[0])


@pytest.mark.parametrize("sizes", [(500,), (57,), (700, 650, 900), (700, 40, 900)])
def test_curve_metrics_are_scikit_learns_on_the_grouped_scores(sizes):
    """ROC AUC and average precision of a (pooled) curve table: scikit-learn's, scores rounded to groups."""
    parts = [sample(n, seed) for seed, n in enumerate(sizes)]
    pooled = pooled_groups([score_groups(*part) for part in parts])
    positive = np.concatenate([p for p, _ in parts])
    score = np.concatenate([s for _, s in parts])
    grouped = grouped_scores(pooled, score)
    got = curve_metrics(pooled)
    assert got == {"roc_auc": pytest.approx(roc_auc_score(positive, grouped), rel=1e-12, abs=1e-15),
                   "average_precision": pytest.approx(average_precision_score(positive, grouped), rel=1e-12,
                                                      abs=1e-15)}
    assert got["roc_auc"] != roc_auc_score(positive, score)  # grouping ties rows: not the per-row value
