"""Simulate a vertical federation on one table and compare it with a centralized reference.

`simulate_vertical` splits a table into train and test rows, deals the training columns out to simulated
parties, trains Federated Forest over the in-process transport, and reports test metrics next to
scikit-learn's random forest on the pooled data and to the same engine with every column at one party
(M = 1), which must agree exactly (design principle 2). The `fedforest simulate` command and the
benchmarks both call it; it returns a JSON-ready dict.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import numpy as np
import pandas as pd

from fedcore.data.binning import category_strings, is_categorical_dtype
from fedcore.data.columns import check_category_sizes, convert_dates
from fedcore.data.labels import infer_task
from fedcore.data.numbers import check_finite_columns
from fedcore.data.split import split_vertical
from fedcore.errors import (
    ColumnNotFoundError,
    InputError,
    ParameterError,
)
from fedcore.metrics import metrics
from fedcore.vertical.estimators import FederatedForestClassifier, FederatedForestRegressor
from fedcore.vertical.validation import check_label

TASKS = ("auto", "classification", "regression")
# `max_features` default: the engine's and scikit-learn's own per task (sqrt for classes, all for regression).
TASK_DEFAULT = "default"
# Master structure arrays that must match between the federated and the single-party run (not `owner`).
STRUCTURE_FIELDS = ("tree", "node", "left", "right", "depth", "weight", "value")


def prepare_table(table: pd.DataFrame, label: str, id_column: str | None = None,
                  drop: Sequence[str] = ()) -> pd.DataFrame:
    """Check that the label, id and `drop` columns exist and that there are rows; drop the id and `drop` columns."""
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
    """The checked feature table both simulators train on (dates as numbers, strings categorical-sized), and
    the JSON-ready note of what happened to its columns (`columns` in the result)."""
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


def _engine(task: str, params: dict, progress: bool) -> FederatedForestClassifier | FederatedForestRegressor:
    """An unfitted engine; building it validates the parameters before any work starts."""
    cls = FederatedForestClassifier if task == "classification" else FederatedForestRegressor
    model = cls(**params, progress=progress)
    model.params  # noqa: B018 - validates the parameters now, before any work (scikit-learn style: not in __init__)
    return model


def _fit_engine(model, task: str, parties: list[pd.DataFrame], label: str, test: list[pd.DataFrame],
                caption: str) -> dict:
    """Train `model` on `parties`, predict `test`; return model, outputs, predictions and timings."""
    if model.progress:
        sys.stderr.write(f"fedforest: {caption}\n")
    started = time.perf_counter()
    model.fit(parties, label=label)
    train_s = time.perf_counter() - started
    started = time.perf_counter()
    if task == "classification":
        output = model.predict_proba(test)
        predictions = model.classes_[np.argmax(output, axis=1)]
    else:
        output = predictions = model.predict(test)
    predict_s = time.perf_counter() - started
    return {"model": model, "output": output, "predictions": predictions, "train_s": train_s, "predict_s": predict_s}


def same_structure(a, b) -> bool:
    """Whether two master forest structures have exactly the same trees, nodes, children and values."""
    return a.n_trees == b.n_trees and all(
        np.array_equal(getattr(a, name), getattr(b, name)) for name in STRUCTURE_FIELDS)


def one_hot(train: pd.DataFrame, test: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Float matrices for scikit-learn: categoricals one-hot (fitted on train), numbers as is with NaN."""
    categorical = [c for c in train.columns if is_categorical_dtype(train[c])]

    def encode(frame: pd.DataFrame) -> pd.DataFrame:
        frame = frame.copy()
        for column in categorical:
            frame[column] = category_strings(frame[column])
        return pd.get_dummies(frame, columns=categorical, dummy_na=False)

    train_x = encode(train)
    test_x = encode(test).reindex(columns=train_x.columns, fill_value=0)
    return (train_x.to_numpy(dtype=np.float64, na_value=np.nan), test_x.to_numpy(dtype=np.float64, na_value=np.nan))


def reference_forest(task: str, train: pd.DataFrame, test: pd.DataFrame, label: str, params: dict) -> dict:
    """scikit-learn's random forest on the pooled table: name, test metrics and timings.

    Categoricals are one-hot encoded, so "sqrt" or a fraction of features counts one-hot columns here.
    """
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

    cls = RandomForestClassifier if task == "classification" else RandomForestRegressor
    train_x, test_x = one_hot(train.drop(columns=[label]), test.drop(columns=[label]))
    max_features = params["max_features"]
    if isinstance(max_features, int):  # the engine caps a count at the number of features; sklearn refuses
        max_features = min(max_features, train_x.shape[1])
    model = cls(n_estimators=params["n_estimators"], max_depth=params["max_depth"], max_features=max_features,
                bootstrap=True, random_state=params["random_state"], n_jobs=-1)
    return timed_reference(model, task, train_x, train[label].to_numpy(), test_x, test[label].to_numpy())


def timed_reference(model, task: str, train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                    test_y: np.ndarray) -> dict:
    """Fit and predict a scikit-learn reference model; its name, test metrics and both timings."""
    started = time.perf_counter()
    model.fit(train_x, train_y)
    train_s = time.perf_counter() - started
    started = time.perf_counter()
    predictions = model.predict(test_x)
    predict_s = time.perf_counter() - started
    return {"name": f"sklearn.{type(model).__name__}", "metrics": metrics(task, test_y, predictions),
            "train_s": train_s, "predict_s": predict_s}


def simulate_vertical(
    table: pd.DataFrame,
    label: str,
    *,
    id_column: str | None = None,
    drop: Sequence[str] = (),
    parties: int = 2,
    trees: int = 100,
    max_depth: int | None = None,
    max_features: str | int | float | None = TASK_DEFAULT,
    seed: int = 0,
    test_size: float = 0.2,
    task: str = "auto",
    privacy: str = "none",
    progress: bool = False,
) -> dict:
    """Train Federated Forest on `parties` simulated vertical parties of `table` and evaluate it on held-out
    rows against scikit-learn and the single-party run; return the JSON-ready result.

    With `privacy="paillier"` or `"ou"` the federated run encrypts the labels (at the mode's default key
    size) and the single-party run stays plain, so `single_party_identical` checks that encryption changes
    nothing.

    `communication` counts training plus the prediction of the test rows; `columns` says which column was
    the id, which were dropped and which dates became numbers (see `prepare_input`).
    """
    if task not in TASKS:
        raise ParameterError(f"task must be one of {list(TASKS)}, got {task!r}")
    table, column_notes = prepare_input(table, label, id_column, drop)
    if task == "auto":
        task = infer_task(table[label])
    check_label(table[label], task)
    if max_features == TASK_DEFAULT:
        max_features = "sqrt" if task == "classification" else 1.0
    params = {"n_estimators": trees, "max_depth": max_depth, "max_features": max_features, "random_state": seed}
    federated_model = _engine(task, {**params, "privacy": privacy}, progress)
    single_model = _engine(task, params, progress)
    train, test = split_train_test(table, label, task, test_size, seed)
    party_frames = split_vertical(train, parties, label=label, seed=seed)
    columns = [[c for c in frame.columns if c != label] for frame in party_frames]
    federated = _fit_engine(federated_model, task, party_frames, label, [test[c] for c in columns],
                            f"federated forest, {parties} parties, {trees} trees")
    single = _fit_engine(single_model, task, [train], label, [test.drop(columns=[label])],
                         f"single-party run of the same engine (M = 1), {trees} trees")
    identical = bool(np.array_equal(federated["output"], single["output"])
                     and same_structure(federated["model"].master_.structure, single["model"].master_.structure))
    y_test = test[label].to_numpy()
    communication = federated["model"].communication_
    single_communication = single["model"].communication_
    return {
        "setting": "vertical",
        "algorithm": "forest",
        "privacy": privacy,
        "task": task,
        "parties": parties,
        "rows_train": len(train),
        "rows_test": len(test),
        "metrics": metrics(task, y_test, federated["predictions"]),
        "reference": reference_forest(task, train, test, label, params),
        "single_party_identical": identical,
        "single_party": {"metrics": metrics(task, y_test, single["predictions"]), "train_s": single["train_s"],
                         "predict_s": single["predict_s"], "rounds": single_communication["rounds"],
                         "bytes": single_communication["bytes"]},
        "timing": {"train_s": federated["train_s"], "predict_s": federated["predict_s"]},
        "communication": {"rounds": communication["rounds"], "bytes": communication["bytes"]},
        "columns": column_notes,
    }
