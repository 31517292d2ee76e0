"""Checks on horizontal party tables before anything is sent.

Each failure is a named error that says which party and which column, what was expected, what was found and
how to fix it.

`build_schema` is also where the simulation derives the agreed schema (in deployments it comes from the
data contracts): the column set and order of the first party, each column's kind, the category lists
(from identical pandas Categorical dtypes, or from an explicit `categories=` mapping) and the classes (the
union of the parties' labels: a class present at only some parties is fine).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from fedcore.data.binning import category_strings
from fedcore.data.numbers import numeric_values
from fedcore.data.split import named_parties as party_frames
from fedcore.errors import ColumnNotFoundError, InputError, LabelError, ParameterError, PartyShapeError
from fedcore.horizontal.schema import CATEGORICAL, NUMERIC, ColumnSpec, HorizontalSchema


class SchemaMismatchError(PartyShapeError):
    """Horizontal parties disagree on the column set or on a column's type."""


class CategoryMismatchError(SchemaMismatchError):
    """A categorical column has different category lists at different parties.

    Or it has values outside the declared list.
    """


MISSING_RANGES = (
    "PPD-ERT and Federated Extra-Trees in privacy gdp or ldp draw thresholds from declared feature "
    "domains, never from the data: pass "
    "feature_ranges={column: (low, high)} for the numeric columns (from the data contracts), or "
    "allow_data_ranges=True in a simulation to use the pooled data's ranges")

PartyFrames = Sequence[pd.DataFrame] | Mapping[str, pd.DataFrame]


def named_parties(parties: PartyFrames) -> dict[str, pd.DataFrame]:
    """Party frames by name (a list gets names party0, party1, ...), none with a column twice."""
    frames = party_frames(parties)
    for name, frame in frames.items():
        if frame.columns.duplicated().any():
            dup = frame.columns[frame.columns.duplicated()][0]
            raise SchemaMismatchError(f"party {name!r} has column {dup!r} twice")
    return frames


def column_kind(series: pd.Series) -> str:
    """`numeric` for numbers and booleans; `categorical` for pandas Categorical, strings and objects."""
    dtype = series.dtype
    if pd.api.types.is_bool_dtype(dtype) or (pd.api.types.is_numeric_dtype(dtype)
                                             and not isinstance(dtype, pd.CategoricalDtype)):
        return NUMERIC
    return CATEGORICAL


def build_schema(
    frames: dict[str, pd.DataFrame],
    label: str,
    task: str,
    categories: Mapping[str, Sequence] | None = None,
) -> HorizontalSchema:
    """Validate the party frames against each other and return the schema they share."""
    categories = dict(categories or {})
    first = next(iter(frames))
    _check_rows_and_label(frames, label)
    reference = _shared_feature_columns(frames, first, label)
    unknown = sorted(set(categories) - set(reference))
    if unknown:
        raise ColumnNotFoundError(f"categories= names columns {unknown} that are not feature columns")
    specs = [_column_spec(frames, first, column, categories.get(column)) for column in reference]
    classes = _check_labels(frames, label, task)
    return HorizontalSchema(columns=tuple(specs), label=label, task=task, classes=classes)


def _check_rows_and_label(frames: dict[str, pd.DataFrame], label: str) -> None:
    """Refuse a party without rows or without the label column."""
    for name, frame in frames.items():
        if len(frame) == 0:
            raise PartyShapeError(f"party {name!r} has no rows; give it data or leave it out of the "
                                  "federation")
        if label not in frame.columns:
            shown = ", ".join(repr(c) for c in list(frame.columns)[:10])
            raise ColumnNotFoundError(f"party {name!r} lacks the label column {label!r} (its columns: "
                                      f"{shown}); in the horizontal setting every institution "
                                      "holds the label")


def _shared_feature_columns(frames: dict[str, pd.DataFrame], first: str, label: str) -> list[str]:
    """The feature columns of party `first`, once every party is checked to hold exactly those."""
    reference = [c for c in frames[first].columns if c != label]
    if not reference:
        raise PartyShapeError(f"party {first!r} has no feature columns besides the label {label!r}")
    for column in reference:
        if not isinstance(column, str):
            raise SchemaMismatchError(f"party {first!r} has a non-string column name {column!r}")
    for name, frame in frames.items():
        columns = set(frame.columns) - {label}
        missing = [c for c in reference if c not in columns]
        extra = [c for c in frame.columns if c != label and c not in set(reference)]
        if missing:
            raise SchemaMismatchError(f"party {name!r} lacks columns {missing} that party {first!r} has; "
                                      "every institution must hold the same columns")
        if extra:
            raise SchemaMismatchError(f"party {name!r} has columns {extra} that party {first!r} lacks; "
                                      "every institution must hold the same columns")
    return reference


def _column_spec(frames: dict[str, pd.DataFrame], first: str, column: str,
                 declared: Sequence | None) -> ColumnSpec:
    kinds = {name: column_kind(frame[column]) for name, frame in frames.items()}
    expected = kinds[first]
    if declared is not None:
        expected = CATEGORICAL
    for name, kind in kinds.items():
        if kind != kinds[first] and declared is None:
            raise SchemaMismatchError(
                f"column {column!r} is {kinds[first]} (dtype {frames[first][column].dtype}) at party "
                f"{first!r} but {kind} (dtype {frames[name][column].dtype}) at party {name!r}; give it the "
                "same type at every institution")
    if expected == NUMERIC:
        for name, frame in frames.items():
            numeric_values(frame[column], f"party {name!r} column")  # infinities refused, naming the party
        return ColumnSpec(column, NUMERIC)
    if declared is not None:
        return _declared_categorical(frames, column, declared)
    return _agreed_categorical(frames, first, column)


def _declared_categorical(frames: dict[str, pd.DataFrame], column: str, declared: Sequence) -> ColumnSpec:
    """A categorical column with a `categories=` list, which every party's values must be in."""
    if isinstance(declared, str) or not isinstance(declared, Sequence | np.ndarray | pd.Index):
        raise ParameterError(f"categories[{column!r}] must be a list of category values, got {declared!r}")
    cats = [str(c) for c in declared]
    if len(set(cats)) != len(cats):
        raise ParameterError(f"categories[{column!r}] lists a category twice: {cats}")
    for name, frame in frames.items():
        present = set(category_strings(frame[column]).dropna().unique().tolist())
        outside = sorted(present - set(cats))
        if outside:
            raise CategoryMismatchError(
                f"column {column!r} at party {name!r} has values {outside[:5]} outside the declared "
                f"categories {cats}; add them to categories[{column!r}] or clean the data")
    return ColumnSpec(column, CATEGORICAL, tuple(cats))


def _agreed_categorical(frames: dict[str, pd.DataFrame], first: str, column: str) -> ColumnSpec:
    """A categorical column without a declared list: the same pandas Categorical at every party."""
    lists = {}
    for name, frame in frames.items():
        dtype = frame[column].dtype
        if not isinstance(dtype, pd.CategoricalDtype):
            raise InputError(
                f"column {column!r} at party {name!r} holds {dtype} values without an agreed category list; "
                f"declare it with categories={{{column!r}: [...]}} or give it a pandas Categorical dtype "
                "with the same categories at every institution")
        lists[name] = [str(c) for c in dtype.categories]
    for name, cats in lists.items():
        if cats != lists[first]:
            raise CategoryMismatchError(
                f"column {column!r} has categories {lists[first]} at party {first!r} but {cats} at party "
                f"{name!r}; use identical Categorical dtypes or pass categories={{{column!r}: [...]}}")
    return ColumnSpec(column, CATEGORICAL, tuple(lists[first]))


def _check_labels(frames: dict[str, pd.DataFrame], label: str, task: str) -> tuple | None:
    for name, frame in frames.items():
        y = frame[label]
        n_missing = int(y.isna().sum())
        if n_missing:
            raise LabelError(f"label {label!r} at party {name!r} has {n_missing} missing values; drop or "
                             "fill those rows")
        if task == "regression":
            if not pd.api.types.is_numeric_dtype(y) or pd.api.types.is_bool_dtype(y):
                raise LabelError(f"regression label {label!r} at party {name!r} must be numeric, found dtype "
                                 f"{y.dtype}")
            if not np.isfinite(y.to_numpy(dtype=np.float64)).all():
                raise LabelError(f"regression label {label!r} at party {name!r} has infinite values")
    if task == "regression":
        return None
    values = pd.concat([frame[label] for frame in frames.values()], ignore_index=True)
    if isinstance(values.dtype, pd.CategoricalDtype):
        values = values.astype(object)
    try:
        classes = np.unique(values.to_numpy())
    except TypeError as exc:
        raise LabelError(f"label {label!r} mixes value types that cannot be ordered ({exc}); "
                         "use one type (all strings or all numbers) at every institution") from exc
    if len(classes) < 2:
        only = classes[0].item() if isinstance(classes[0], np.generic) else classes[0]
        raise LabelError(f"label {label!r} has a single class {only!r} over all parties; classification "
                         "needs at least two")
    return tuple(c.item() if isinstance(c, np.generic) else c for c in classes)


def resolve_feature_ranges(
    schema: HorizontalSchema,
    feature_ranges: Mapping[str, tuple[float, float]] | None,
    frames: dict[str, pd.DataFrame] | None = None,
    allow_data_ranges: bool = False,
) -> tuple[np.ndarray, np.ndarray, str]:
    """Declared (low, high) per feature (PPD-ERT, FET's DP modes), in schema order, and where they came from.

    Categorical columns take their code domain (0, n_categories - 1). Numeric columns need a declared
    finite range with low <= high; `allow_data_ranges` (simulation only) fills missing ones from the pooled
    data. Party values outside a declared range are refused (the data broke its contract).
    """
    low, high = schema.feature_domains()
    numeric = [c.name for c in schema.columns if not c.is_categorical]
    if feature_ranges is None and not allow_data_ranges:
        raise ParameterError(MISSING_RANGES)
    given = dict(feature_ranges or {})
    unknown = sorted(set(given) - set(numeric))
    if unknown:
        raise ColumnNotFoundError(f"feature_ranges names {unknown}, which are not numeric feature columns "
                                  f"(numeric columns: {numeric})")
    source = "declared"
    pooled_used = []
    for j, column in enumerate(schema.columns):
        if column.is_categorical:
            continue
        if column.name in given:
            lo, hi = _declared_range(column.name, given[column.name])
        elif allow_data_ranges and frames is not None:
            lo, hi = _pooled_range(column.name, frames)
            pooled_used.append(column.name)
        else:
            missing = [c for c in numeric if c not in given]
            raise ParameterError(f"feature_ranges lacks the numeric columns {missing}; declare a (low, high) "
                                 "for each (from the data contracts)")
        low[j], high[j] = lo, hi
        if frames is not None and column.name in given:
            _check_within_range(frames, column.name, lo, hi)
    if pooled_used:
        source = "pooled data (simulation convenience: the ranges were computed from all parties' rows)"
        if len(pooled_used) < len(numeric):
            source = f"declared, and pooled data for {pooled_used} (simulation convenience)"
    return low, high, source


def _declared_range(column: str, pair: tuple[float, float]) -> tuple[float, float]:
    """The (low, high) declared for `column`: two finite numbers with low <= high."""
    try:
        lo, hi = (float(pair[0]), float(pair[1]))
    except (TypeError, ValueError, IndexError) as exc:
        raise ParameterError(f"feature_ranges[{column!r}] must be a (low, high) pair of numbers, "
                             f"got {pair!r}") from exc
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise ParameterError(f"feature_ranges[{column!r}] must be finite with low <= high, got {pair!r}")
    return lo, hi


def _pooled_range(column: str, frames: dict[str, pd.DataFrame]) -> tuple[float, float]:
    """Min and max of `column` over every party's rows, NaN ignored ((0, 0) when there is no value)."""
    values = np.concatenate([numeric_values(f[column]) for f in frames.values()])
    values = values[~np.isnan(values)]
    return (float(values.min()), float(values.max())) if len(values) else (0.0, 0.0)


def _check_within_range(frames: dict[str, pd.DataFrame], column: str, lo: float, hi: float) -> None:
    """Refuse a party whose `column` has values outside its declared range [lo, hi]."""
    for name, frame in frames.items():
        values = numeric_values(frame[column])
        bad = (values < lo) | (values > hi)
        if bad.any():
            raise InputError(f"column {column!r} at party {name!r} has {int(bad.sum())} values outside "
                             f"its declared range [{lo}, {hi}]; fix the data or the declared range")
