"""How a model is scored on held-out rows: accuracy and macro F1 for classes, RMSE and R^2 for numbers.

Plain numpy, so agents need no scikit-learn; the results equal scikit-learn's `accuracy_score`,
`f1_score(average="macro")`, `mean_squared_error` and `r2_score` (a test compares them).
"""

from __future__ import annotations

import numpy as np


def confusion_metrics(confusion: np.ndarray) -> dict[str, float]:
    """Accuracy and macro F1 from a summed confusion matrix (rows: truth, columns: prediction)."""
    total = confusion.sum()
    true_positive = np.diag(confusion).astype(np.float64)
    predicted, actual = confusion.sum(axis=0), confusion.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        f1 = np.where(predicted + actual > 0, 2 * true_positive / (predicted + actual), 0.0)
    present = (predicted + actual) > 0  # as scikit-learn: classes seen in the truth or the predictions
    return {"accuracy": float(true_positive.sum() / total) if total else float("nan"),
            "f1_macro": float(f1[present].mean()) if present.any() else float("nan")}


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray) -> np.ndarray:
    """Counts of (true class, predicted class) over the classes seen in either, in sorted order."""
    classes, codes = np.unique(np.concatenate([np.asarray(y_true), np.asarray(y_pred)]), return_inverse=True)
    truth, predicted = codes[:len(y_true)], codes[len(y_true):]
    confusion = np.zeros((len(classes), len(classes)), np.int64)
    np.add.at(confusion, (truth, predicted), 1)
    return confusion


def regression_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """RMSE and R^2 (1 for a perfect fit of a constant target, 0 for an imperfect one, as scikit-learn)."""
    y_true, y_pred = np.asarray(y_true, np.float64), np.asarray(y_pred, np.float64)
    residual = float(np.sum((y_true - y_pred) ** 2))
    spread = float(np.sum((y_true - y_true.mean()) ** 2)) if len(y_true) else 0.0
    r2 = 1.0 - residual / spread if spread > 0 else (1.0 if residual == 0 else 0.0)
    return {"rmse": float(np.sqrt(residual / len(y_true))) if len(y_true) else float("nan"), "r2": r2}


def metrics(task: str, y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """Accuracy and macro F1 for classification, RMSE and R^2 for regression."""
    if task == "classification":
        return confusion_metrics(confusion_matrix(y_true, y_pred))
    return regression_metrics(y_true, y_pred)
