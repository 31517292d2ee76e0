"""Checks on vertical party tables before anything is sent.

Each failure is a named error that says which party and which column, what was expected and what was found.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedcore.data.numbers import check_finite_columns
from fedcore.errors import DuplicateColumnError, LabelError, LabelHolderError, PartyShapeError


def _check_shapes(frames: dict[str, pd.DataFrame], label: str | None = None) -> int:
    for name, frame in frames.items():
        if len(frame) == 0:
            raise PartyShapeError(f"party {name!r} has no rows")
    rows = {name: len(frame) for name, frame in frames.items()}
    if len(set(rows.values())) > 1:
        raise PartyShapeError(f"parties must hold the same aligned rows, found row counts {rows}")
    seen: dict[str, str] = {}
    for name, frame in frames.items():
        for column in frame.columns:
            if column == label:
                continue  # who holds the label is checked separately, with its own error
            if not isinstance(column, str):
                raise PartyShapeError(f"party {name!r} has a non-string column name {column!r}")
            if column in seen:
                raise DuplicateColumnError(f"column {column!r} is held by both party {seen[column]!r} and "
                                           f"party {name!r}; column names must be unique across parties")
            seen[column] = name
        if frame.columns.duplicated().any():
            dup = frame.columns[frame.columns.duplicated()][0]
            raise DuplicateColumnError(f"party {name!r} has column {dup!r} twice")
        check_finite_columns(frame, f"party {name!r}", skip=[label] if label is not None else ())
    return next(iter(rows.values()))


def validate_training_parties(frames: dict[str, pd.DataFrame], label: str, task: str) -> str:
    """Check shapes, columns and the label; return the label holder's name."""
    _check_shapes(frames, label)
    holders = [name for name, frame in frames.items() if label in frame.columns]
    if not holders:
        raise LabelHolderError(f"no party holds the label column {label!r}; parties' columns: "
                               + "; ".join(f"{n}: {list(f.columns)[:8]}" for n, f in frames.items()))
    if len(holders) > 1:
        raise LabelHolderError(f"label column {label!r} is held by {len(holders)} parties {holders}; exactly "
                               "one may hold it")
    for name, frame in frames.items():
        n_features = frame.shape[1] - (1 if name == holders[0] else 0)
        if n_features == 0 and name != holders[0]:
            raise PartyShapeError(f"party {name!r} has no feature columns")
    if sum(f.shape[1] for f in frames.values()) - 1 == 0:
        raise PartyShapeError("no party holds any feature column besides the label")
    check_label(frames[holders[0]][label], task, holder=holders[0])
    return holders[0]


def check_label(y: pd.Series, task: str, holder: str | None = None) -> None:
    """Refuse a label that cannot be learned from.

    Missing or infinite values, a single class, a non-numeric regression target. `holder` names the party
    holding it, when there are parties.
    """
    where = f"label {y.name!r}" + (f" at party {holder!r}" if holder is not None else "")
    n_missing = int(y.isna().sum())
    if n_missing:
        raise LabelError(f"{where} has {n_missing} missing values; drop or fill those rows")
    if task == "regression":
        if not pd.api.types.is_numeric_dtype(y) or pd.api.types.is_bool_dtype(y):
            raise LabelError(f"regression {where} must be numeric, found dtype {y.dtype}")
        n_infinite = int(np.isinf(y.to_numpy(dtype=np.float64)).sum())
        if n_infinite:
            raise LabelError(f"regression {where} has {n_infinite} infinite values")
    elif y.nunique() < 2:
        only = y.iloc[0].item() if isinstance(y.iloc[0], np.generic) else y.iloc[0]
        raise LabelError(f"{where} has a single class {only!r}; classification needs at least two")


def validate_prediction_parties(frames: dict[str, pd.DataFrame], expected: dict[str, list[str]]) -> int:
    """Check that prediction frames match the trained parties and columns; return the row count."""
    if set(frames) != set(expected):
        raise PartyShapeError(f"prediction needs the parties {sorted(expected)}, got {sorted(frames)}")
    rows = {name: len(frame) for name, frame in frames.items()}
    if len(set(rows.values())) > 1:
        raise PartyShapeError(f"parties must hold the same aligned rows, found row counts {rows}")
    if not next(iter(rows.values())):
        raise PartyShapeError("there are no rows to predict")
    for name, columns in expected.items():
        missing = [c for c in columns if c not in frames[name].columns]
        if missing:
            raise PartyShapeError(f"party {name!r} lacks the trained columns {missing}")
        check_finite_columns(frames[name][columns], f"party {name!r}")
    return next(iter(rows.values()))
