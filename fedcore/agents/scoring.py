"""A horizontal model applied to an institution's own rows: held-out statistics and prediction tables.

The same functions run in the agent's process on the whole table and on its Dask workers block by block
(`fedcore.compute.dask_predict`); blocks' statistics merge exactly, so the answer does not depend on how
the rows are cut:

* classification: the confusion matrix, int64 counts (they add up);
* regression: (n, sum y, sum y^2, sum of squared errors, sum of absolute errors), each sum kept exact as
  integer counts of the float64 mantissas per binary exponent (`exact_parts`): they add up as integers,
  and `exact_value` rounds the total once, to the float64 nearest the true sum, whatever the order or
  blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import pandas as pd

from fedcore.agents.checks import reported
from fedcore.errors import InputError
from fedcore.horizontal.model import HorizontalForest
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.protocol.messages import Message

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


def holdout_statistics(model: HorizontalForest, schema: HorizontalSchema, rows: pd.DataFrame) -> np.ndarray:
    """The model's errors on `rows`, as statistics that add up: confusion counts or regression parts.

    Classification: (C, C) int64 confusion counts (truth, predicted). Regression: `exact_parts` of
    (1, y, y^2, squared error, absolute error) per row, (5, exponents, 2) int64.
    """
    values = model.predict_values(schema.encode(rows)) if len(rows) else np.zeros((0, 1))
    truth = schema.encode_labels(rows[schema.label])
    if schema.task == "classification":
        confusion = np.zeros((schema.n_classes, schema.n_classes), np.int64)
        np.add.at(confusion, (truth, np.argmax(values, axis=1)), 1)
        return confusion
    errors = truth - values[:, 0]
    return exact_parts(np.column_stack([np.ones(len(truth)), truth, truth * truth, errors * errors,
                                        np.abs(errors)]))


def merge_statistics(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Blocks' `holdout_statistics` as the whole held-out set's (integer sums)."""
    total = np.zeros_like(parts[0], dtype=np.int64)
    for part in parts:
        total += part
    return total


def evaluation_reply(schema: HorizontalSchema, statistics: np.ndarray) -> Message:
    """The `evaluation` answer from the held-out set's statistics.

    Regression sums are rounded (`agents.checks.reported`; the count stays exact): the master sent the
    model, so full precision would let one crafted per row carry that row's target back.
    """
    if schema.task == "classification":
        return Message("evaluation", {"rows": int(statistics.sum())}, {"confusion": statistics})
    n, *sums = (exact_value(part) for part in statistics)
    sums_array = np.array([n, *reported(sums)], np.float64)
    return Message("evaluation", {"rows": int(n)}, {"sums": sums_array})


def prediction_frame(model: HorizontalForest, schema: HorizontalSchema, batch: pd.DataFrame,
                     id_column: str) -> pd.DataFrame:
    """The predictions of `batch`'s rows with their IDs: class and per-class probabilities, or the value."""
    classes = np.asarray(schema.classes, dtype=object) if schema.task == "classification" else None
    return predictions_table(batch[id_column].to_numpy(), model.predict_values(schema.encode(batch)), classes,
                             id_column)


def predictions_table(ids: np.ndarray | pd.Series, values: np.ndarray, classes: np.ndarray | None,
                      id_column: str) -> pd.DataFrame:
    """IDs and their predictions as both settings deliver them.

    The class with `proba_<class>` columns (`values` one column per class), or the value (`classes` None).
    """
    out = pd.DataFrame({id_column: ids})
    if classes is not None:
        out["prediction"] = classes[np.argmax(values, axis=1)]
        for k, c in enumerate(classes):
            out[f"proba_{c}"] = values[:, k]
    else:
        out["prediction"] = values[:, 0]
    return out
