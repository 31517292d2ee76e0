"""scikit-learn's forests on the pooled rows: the reference each simulated federation is compared with."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from fedcore.data.binning import category_strings, is_categorical_dtype
from fedcore.metrics import metrics
from fedcore.simulation.comparison import timed


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
    return (train_x.to_numpy(dtype=np.float64, na_value=np.nan),
            test_x.to_numpy(dtype=np.float64, na_value=np.nan))


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


def reference_extra_trees(task: str, train: pd.DataFrame, test: pd.DataFrame, label: str,
                          params: dict) -> dict:
    """scikit-learn's ExtraTrees with the same hyper-parameters on the pooled rows."""
    from sklearn.ensemble import ExtraTreesClassifier, ExtraTreesRegressor

    cls = ExtraTreesClassifier if task == "classification" else ExtraTreesRegressor
    train_x, test_x = one_hot(train.drop(columns=[label]), test.drop(columns=[label]))
    model = cls(n_estimators=params["n_estimators"], max_depth=params["max_depth"],
                max_features=params["max_features"], random_state=params["random_state"], n_jobs=-1)
    return timed_reference(model, task, train_x, train[label].to_numpy(), test_x, test[label].to_numpy())


def reference_boosting(task: str, train: pd.DataFrame, test: pd.DataFrame, label: str, params: dict) -> dict:
    """scikit-learn's HistGradientBoosting with the same rounds, depth, learning rate and L2, pooled rows.

    No early stopping, no leaf-count or leaf-size limits beyond ours (min_samples_leaf 1); categoricals
    one-hot encoded as for the forests' references.
    """
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    cls = HistGradientBoostingClassifier if task == "classification" else HistGradientBoostingRegressor
    train_x, test_x = one_hot(train.drop(columns=[label]), test.drop(columns=[label]))
    model = cls(max_iter=params["n_estimators"], max_depth=params["max_depth"],
                learning_rate=params["learning_rate"], l2_regularization=params["reg_lambda"],
                max_leaf_nodes=None, min_samples_leaf=1, early_stopping=False,
                random_state=params["random_state"])
    return timed_reference(model, task, train_x, train[label].to_numpy(), test_x, test[label].to_numpy())


def timed_reference(model: Any, task: str, train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                    test_y: np.ndarray) -> dict:
    """Fit and predict a scikit-learn reference model; its name, test metrics and both timings."""
    classification = task == "classification"
    output, train_s, predict_s = timed(lambda: model.fit(train_x, train_y),
                                       lambda: model.predict_proba(test_x) if classification
                                       else model.predict(test_x))
    scores = (metrics(task, test_y, model.classes_[np.argmax(output, axis=1)], output, model.classes_)
              if classification else metrics(task, test_y, output))
    return {"name": f"sklearn.{type(model).__name__}", "metrics": scores,
            "train_s": train_s, "predict_s": predict_s}
