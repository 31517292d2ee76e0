"""The table both simulators train on: checked columns, dates as numbers, and the train/test split."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from fedcore.data.columns import check_category_sizes, convert_dates
from fedcore.data.numbers import check_finite_columns
from fedcore.errors import ColumnNotFoundError, InputError, ParameterError


def prepare_table(table: pd.DataFrame, label: str, id_column: str | None = None,
                  drop: Sequence[str] = ()) -> pd.DataFrame:
    """Check that the label, id and `drop` columns exist and that there are rows; drop the id and `drop`."""
    _require_column(table, label, "label")
    if id_column is not None:
        if id_column == label:
            raise InputError(f"the id column and the label are the same column {label!r}")
        _require_column(table, id_column, "id")
    for column in drop:
        if column == label:
            raise InputError(f"the label column {label!r} cannot be dropped")
        _require_column(table, column, "dropped")
    left_out = list(dict.fromkeys([*([id_column] if id_column is not None else []), *drop]))
    table = table.drop(columns=left_out)
    if len(table) == 0:
        raise InputError("the table has no rows")
    if table.shape[1] < 2:
        raise InputError(f"the table holds no feature column besides the label {label!r}")
    return table


def prepare_input(table: pd.DataFrame, label: str, id_column: str | None = None,
                  drop: Sequence[str] = ()) -> tuple[pd.DataFrame, dict]:
    """The checked feature table both simulators train on, and what happened to its columns.

    Dates become numbers and string columns are checked to be categorical-sized; the second value is the
    JSON-ready note of the id, dropped and date columns (`columns` in the result).
    """
    table = prepare_table(table, label, id_column, drop)
    table, dates = convert_dates(table, keep=[label])
    check_category_sizes(table, keep=[label])
    check_finite_columns(table, skip=[label])  # the label's own check names it as the label
    return table, {"id": id_column, "dropped": list(drop), "dates": [d.to_dict() for d in dates]}


def _require_column(table: pd.DataFrame, column: str, role: str) -> None:
    if column not in table.columns:
        shown = ", ".join(repr(c) for c in list(table.columns)[:10])
        more = f", ... ({table.shape[1]} columns)" if table.shape[1] > 10 else ""
        raise ColumnNotFoundError(f"{role} column {column!r} not in the table; its columns are {shown}{more}")


def split_train_test(table: pd.DataFrame, label: str, task: str, test_size: float,
                     seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train and test rows; stratified by class for classification whenever every class can be stratified."""
    from sklearn.model_selection import train_test_split

    if not 0 < test_size < 1:
        raise ParameterError(f"test size must be a fraction in (0, 1), got {test_size}")
    stratify = table[label] if task == "classification" and _can_stratify(table[label], test_size) else None
    try:
        train, test = train_test_split(table, test_size=test_size, random_state=seed, stratify=stratify)
    except ValueError as error:
        raise InputError(f"cannot split {len(table)} rows into train and test: {error}") from error
    return train.reset_index(drop=True), test.reset_index(drop=True)


def _can_stratify(y: pd.Series, test_size: float) -> bool:
    counts = y.value_counts()
    n_test = int(np.ceil(test_size * len(y)))
    return bool(counts.min() >= 2 and len(y) - n_test >= len(counts) and n_test >= len(counts))
