"""A horizontal model applied to an institution's own rows: held-out statistics and prediction tables.

The same functions run in the agent's process on the whole table and on its Dask workers block by block
(`fedcore.compute.dask_predict`); blocks' statistics merge exactly, so the answer does not depend on how
the rows are cut:

* classification: the confusion matrix, int64 counts (they add up), and the sum of the rows' log-losses;
  two classes: per probability cell (`fedcore.curves`) the rows, positives and probability sum, which the
  reply merges into the institution's curve groups (never a group of fewer than MIN_GROUP_ROWS rows);
* regression: (n, sum y, sum y^2, sum of squared errors, sum of absolute errors).

Float sums are kept exact as integer counts of the float64 mantissas per binary exponent (`exact_parts`):
they add up as integers, and `exact_value` rounds the total once, to the float64 nearest the true sum,
whatever the order or blocks.

Shared with the vertical agents: `predictions_table` (both settings' deliveries, at the version's decision
threshold) and `evaluation_arrays` (the label holder's held-out confusion and binary curve counts).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import pandas as pd

from fedcore.agents.checks import reported
from fedcore.curves import GRID, merged_groups, score_cells, score_groups
from fedcore.errors import InputError
from fedcore.horizontal.model import HorizontalForest
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.metrics import class_confusion, decide, row_log_losses
from fedcore.protocol.messages import Message

Statistics = dict[str, np.ndarray]
"""A held-out set's statistics by name, int64 arrays that add up over blocks."""

_LOW_BITS = 26
_EXPONENTS = 2100  # float64 exponents from frexp, -1073 .. 1024, shifted by _OFFSET
_OFFSET = 1074
_MANTISSA_BITS = 53


def exact_parts(columns: np.ndarray) -> np.ndarray:
    """Exact sums of each column of `columns` (n, m) as int64 (m, exponents, 2): they add up over blocks.

    Each value is M * 2**(e - 53) with M a 53-bit integer (`np.frexp`); M's high and low halves are summed
    per exponent e in int64, which holds up to 2**36 rows exactly.
    """
    columns = np.asarray(columns, dtype=np.float64)
    if not np.isfinite(columns).all():
        raise InputError("held-out statistics: a value is not finite")
    mantissa, exponent = np.frexp(columns)
    whole = np.ldexp(mantissa, _MANTISSA_BITS).astype(np.int64)
    index = exponent.astype(np.int64) + _OFFSET
    parts = np.zeros((columns.shape[1], _EXPONENTS, 2), dtype=np.int64)
    for j in range(columns.shape[1]):
        np.add.at(parts[j, :, 0], index[:, j], whole[:, j] >> _LOW_BITS)
        np.add.at(parts[j, :, 1], index[:, j], whole[:, j] & ((1 << _LOW_BITS) - 1))
    return parts


def exact_value(parts: np.ndarray) -> float:
    """The float64 nearest the exact sum that `parts` ((exponents, 2), from `exact_parts`) holds."""
    total = sum(((int(high) << _LOW_BITS) + int(low)) << i for i, (high, low) in enumerate(parts.tolist())
                if high or low)
    return float(Fraction(total, 1 << (_OFFSET + _MANTISSA_BITS)))


def holdout_statistics(model: HorizontalForest, schema: HorizontalSchema, rows: pd.DataFrame,
                       threshold: float | None = None) -> Statistics:
    """The model's errors on `rows`, as statistics that add up.

    Classification: "confusion", (C, C) int64 counts (truth, predicted), and "log_loss", `exact_parts` of
    the rows' log-losses (`fedcore.metrics.row_log_losses`), (1, exponents, 2); two classes also "cells",
    (2, GRID) rows and positives per probability cell, and "cell_sums", `exact_parts` of each cell's
    probabilities, (GRID, exponents, 2). Regression: "sums", `exact_parts` of (1, y, y^2, squared error,
    absolute error) per row, (5, exponents, 2).
    """
    n_values = schema.n_classes if schema.task == "classification" else 1
    values = model.predict_values(schema.encode(rows)) if len(rows) else np.zeros((0, n_values))
    truth = schema.encode_labels(rows[schema.label])
    if schema.task == "classification":
        confusion = np.zeros((schema.n_classes, schema.n_classes), np.int64)
        np.add.at(confusion, (truth, decide(values, threshold)), 1)  # at the decision threshold
        statistics = {"confusion": confusion, "log_loss": exact_parts(row_log_losses(truth, values)[:, None])}
        if schema.n_classes == 2:
            statistics.update(_cell_statistics(truth == 1, values[:, 1]))
        return statistics
    errors = truth - values[:, 0]
    return {"sums": exact_parts(np.column_stack([np.ones(len(truth)), truth, truth * truth, errors * errors,
                                                 np.abs(errors)]))}


def _cell_statistics(positive: np.ndarray, score: np.ndarray) -> Statistics:
    """Rows, positives and exact probability sums per curve cell (`fedcore.curves.score_cells`)."""
    score = np.clip(np.asarray(score, np.float64), 0.0, 1.0)
    cell = score_cells(score)
    counts = np.stack([np.bincount(cell, minlength=GRID), np.bincount(cell[positive], minlength=GRID)])
    sums = np.stack([exact_parts(score[cell == k][:, None])[0] for k in range(GRID)])
    return {"cells": counts.astype(np.int64), "cell_sums": sums}


def merge_statistics(parts: Sequence[Statistics]) -> Statistics:
    """Blocks' `holdout_statistics` as the whole held-out set's (integer sums, name by name)."""
    total = {name: np.zeros_like(value, dtype=np.int64) for name, value in parts[0].items()}
    for part in parts:
        for name, value in part.items():
            total[name] += value
    return total


def evaluation_reply(schema: HorizontalSchema, statistics: Statistics) -> Message:
    """The `evaluation` answer from the held-out set's statistics.

    Float sums are rounded (`agents.checks.reported`; counts stay exact): the master sent the model, so
    full precision would let one crafted per row carry that row's target (or class) back.
    """
    if schema.task == "classification":
        confusion = statistics["confusion"]
        log_loss_sum = reported([exact_value(statistics["log_loss"][0])])
        arrays = {"confusion": confusion, "log_loss_sum": np.asarray(log_loss_sum, np.float64)}
        if "cells" in statistics:  # two classes: this institution's curve groups, means rounded
            rows, positives = statistics["cells"]
            cell_sums = np.array([exact_value(part) for part in statistics["cell_sums"]])
            curve = merged_groups(rows, positives, cell_sums)
            curve[:, 3] = reported(curve[:, 3])
            arrays["curve"] = curve
        return Message("evaluation", {"rows": int(confusion.sum())}, arrays)
    n, *sums = (exact_value(part) for part in statistics["sums"])
    sums_array = np.array([n, *reported(sums)], np.float64)
    return Message("evaluation", {"rows": int(n)}, {"sums": sums_array})


def prediction_frame(model: HorizontalForest, schema: HorizontalSchema, batch: pd.DataFrame,
                     id_column: str, threshold: float | None = None) -> pd.DataFrame:
    """The predictions of `batch`'s rows with their IDs: class and per-class probabilities, or the value."""
    classes = np.asarray(schema.classes, dtype=object) if schema.task == "classification" else None
    return predictions_table(batch[id_column].to_numpy(), model.predict_values(schema.encode(batch)), classes,
                             id_column, threshold)


def predictions_table(ids: np.ndarray | pd.Series, values: np.ndarray, classes: np.ndarray | None,
                      id_column: str, threshold: float | None = None) -> pd.DataFrame:
    """IDs and their predictions as both settings deliver them.

    The class with `proba_<class>` columns (`values` one column per class), or the value (`classes` None).
    The class: at the version's decision `threshold` for two classes (`fedcore.metrics.decide`).
    """
    out = pd.DataFrame({id_column: ids})
    if classes is not None:
        out["prediction"] = classes[decide(values, threshold)]
        for k, c in enumerate(classes):
            out[f"proba_{c}"] = values[:, k]
    else:
        out["prediction"] = values[:, 0]
    return out


def evaluation_arrays(codes: np.ndarray, proba: np.ndarray, threshold: float | None) -> dict[str, np.ndarray]:
    """What the vertical label holder's `metrics` reply draws from (issue #33's pictures), beside its metrics.

    "confusion": (C, C) counts of the held-out rows at the decision `threshold`; "curve" (two classes, both
    present): `fedcore.curves.score_groups`' label counts per probability group, no row's label.
    """
    arrays = {"confusion": class_confusion(codes, decide(proba, threshold), proba.shape[1])}
    if proba.shape[1] == 2 and (codes >= 0).all() and len(np.unique(codes)) == 2:
        arrays["curve"] = score_groups(codes == 1, proba[:, 1])
    return arrays
