"""ROC, precision-recall and calibration curves of a binary classifier, as few label counts as draw them.

Computed where the labels are (the vertical label holder, issue #33) from the master's held-out predictions,
and only the curve leaves: the positive-class probabilities are cut into `GRID` equal cells, and cells are
merged from the top down until each group holds at least `MIN_GROUP_ROWS` rows. Per group the label holder
reports its lowest cell edge, its rows, its positives and its rows' mean predicted probability (the master's
own numbers). A group's positives are one label count over at least `MIN_GROUP_ROWS` rows, never a single
row's label, however the master crafts its predictions.

The curves' points are then exact functions of these counts: the ROC at threshold t (a group's lower edge)
is what scikit-learn's `roc_curve` gives for scores rounded down to their group's edge.

In the horizontal setting every institution holds labels: each reports its own groups of its held-out rows
(`score_groups` of its cells), and the master pools them at the edges every institution's groups share
(`pooled_groups`): each institution's groups are unions of cells, so they split exactly there.
"""

from __future__ import annotations

import numpy as np

GRID = 20
"""Equal cells of [0, 1] the positive-class probability is cut into before merging."""
MIN_GROUP_ROWS = 10
"""Fewest held-out rows a reported group may hold (a smaller one merges with the group below it)."""
COLUMNS = ("threshold", "rows", "positives", "mean_predicted")
"""The columns of a curve table, one row per group, highest threshold first."""


def score_groups(positive: np.ndarray, score: np.ndarray) -> np.ndarray:
    """The curve table (groups x COLUMNS, float64) of boolean labels `positive` and probabilities `score`.

    Groups run from the highest threshold down; the last one starts at 0, so every row is in one group.
    Fewer than MIN_GROUP_ROWS rows in all: one group.
    """
    return merged_groups(*cell_counts(positive, score))


def score_cells(score: np.ndarray) -> np.ndarray:
    """Each probability's grid cell: cell k holds [k / GRID, (k + 1) / GRID), 1 in the last."""
    score = np.clip(np.asarray(score, np.float64), 0.0, 1.0)
    return np.minimum((score * GRID).astype(np.int64), GRID - 1)


def cell_counts(positive: np.ndarray, score: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per grid cell: rows, positives and the sum of their probabilities."""
    score = np.clip(np.asarray(score, np.float64), 0.0, 1.0)
    cell = score_cells(score)
    return (np.bincount(cell, minlength=GRID), np.bincount(cell, weights=np.asarray(positive, bool),
                                                           minlength=GRID),
            np.bincount(cell, weights=score, minlength=GRID))


def merged_groups(rows: np.ndarray, positives: np.ndarray, sums: np.ndarray) -> np.ndarray:
    """The curve table of per-cell counts: cells merged from the top until each group has MIN_GROUP_ROWS."""
    groups: list[list[float]] = []
    start = GRID
    for k in range(GRID - 1, -1, -1):
        if rows[k:start].sum() >= MIN_GROUP_ROWS or k == 0:
            groups.append([k, rows[k:start].sum(), positives[k:start].sum(), sums[k:start].sum()])
            start = k
    if len(groups) > 1 and groups[-1][1] < MIN_GROUP_ROWS:  # the bottom remainder joins the group above
        _, n, p, s = groups.pop()
        groups[-1] = [0, groups[-1][1] + n, groups[-1][2] + p, groups[-1][3] + s]
    table = np.array(groups, np.float64).reshape(-1, 4)
    table[:, 0] /= GRID
    with np.errstate(invalid="ignore", divide="ignore"):
        table[:, 3] = np.where(table[:, 1] > 0, table[:, 3] / table[:, 1], np.nan)
    return table


def pooled_groups(tables: list[np.ndarray]) -> np.ndarray:
    """One curve table of several institutions' tables (each `score_groups` of its own rows).

    The groups start at the thresholds every table has (0 always); each pooled group sums the groups of
    every table from its threshold up to the next: their rows, positives, and probability sums (a mean
    predicted probability times its rows). No group of a table is split, so each pooled group holds whole
    groups of at least MIN_GROUP_ROWS rows (or a table's only group).
    """
    edges = [set(np.rint(np.asarray(t)[:, 0] * GRID).astype(np.int64).tolist()) for t in tables]
    shared = sorted(set.intersection(*edges), reverse=True) if edges else [0]
    out = np.zeros((len(shared), len(COLUMNS)))
    for table in tables:
        table = np.asarray(table, np.float64)
        start = np.rint(table[:, 0] * GRID).astype(np.int64)
        slot = np.array([next(i for i, edge in enumerate(shared) if edge <= s) for s in start], np.int64)
        np.add.at(out[:, 1], slot, table[:, 1])
        np.add.at(out[:, 2], slot, table[:, 2])
        np.add.at(out[:, 3], slot, np.where(table[:, 1] > 0, np.nan_to_num(table[:, 3]) * table[:, 1], 0.0))
    out[:, 0] = np.array(shared, np.float64) / GRID
    with np.errstate(invalid="ignore", divide="ignore"):
        out[:, 3] = np.where(out[:, 1] > 0, out[:, 3] / out[:, 1], np.nan)
    return out


def cumulative(table: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """True and false positives at each group's threshold (predicting positive at or above it), P and N."""
    true_pos = np.cumsum(table[:, 2])
    false_pos = np.cumsum(table[:, 1] - table[:, 2])
    return true_pos, false_pos, float(true_pos[-1]), float(false_pos[-1])


def roc_points(table: np.ndarray) -> np.ndarray:
    """(false positive rate, true positive rate) from (0, 0) through each group's threshold to (1, 1)."""
    true_pos, false_pos, p, n = cumulative(table)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.column_stack([np.r_[0.0, false_pos / n], np.r_[0.0, true_pos / p]])


def pr_points(table: np.ndarray) -> np.ndarray:
    """(recall, precision) at each group's threshold, highest threshold first."""
    true_pos, false_pos, p, _ = cumulative(table)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.column_stack([true_pos / p, true_pos / (true_pos + false_pos)])


def curve_metrics(table: np.ndarray) -> dict[str, float]:
    """ROC AUC and average precision of a curve table: scikit-learn's, each score rounded down to its group.

    The horizontal master's `roc_auc` and `average_precision` (no single party ranks every institution's
    rows; the pooled groups are what it has): the area under `roc_points` by the trapezoid rule, and the
    precision at each group's threshold weighted by the recall it adds. Exact on the grouped scores, so they
    differ from the per-row values by what grouping ties (tested against scikit-learn on both).
    """
    roc = roc_points(table)
    recall, precision = pr_points(table).T
    return {"roc_auc": float(np.trapezoid(roc[:, 1], roc[:, 0])),
            "average_precision": float(np.sum(np.diff(np.r_[0.0, recall]) * precision))}


def calibration_points(table: np.ndarray) -> np.ndarray:
    """(mean predicted probability, observed positive share) per non-empty group, lowest first."""
    kept = table[table[:, 1] > 0][::-1]
    return np.column_stack([kept[:, 3], kept[:, 2] / kept[:, 1]])


def confusion_at(table: np.ndarray, group: int) -> np.ndarray:
    """The 2 x 2 confusion (truth x predicted) predicting positive at or above `group`'s threshold."""
    true_pos, false_pos, p, n = cumulative(table)
    tp, fp = true_pos[group], false_pos[group]
    return np.array([[n - fp, fp], [p - tp, tp]], np.int64)


def youden_group(table: np.ndarray) -> int:
    """The group whose threshold gives the largest TPR - FPR (Youden's J; the highest threshold on a tie)."""
    rates = roc_points(table)[1:]
    return int(np.argmax(rates[:, 1] - rates[:, 0]))
