"""How a model is scored on held-out rows, in terms a model-risk team accepts.

Classification: accuracy, macro F1, balanced accuracy and the base rate (from the confusion matrix), and,
given class probabilities, ROC AUC (one-vs-rest macro for more than two classes), average precision (PR AUC)
and log-loss. Regression: RMSE, R^2 and MAE. Plain numpy, so agents need no scikit-learn; the results equal
scikit-learn's functions (a test compares them). A metric the rows cannot define (one class present) is nan,
with the reason given as an `UndefinedMetricWarning`, not an error.
"""

from __future__ import annotations

import warnings

import numpy as np

LOWER_IS_BETTER = frozenset({"rmse", "mae", "log_loss"})
"""Metrics where a smaller value is the better model (every other metric: higher is better)."""

PROBABILITY_METRICS = ("roc_auc", "average_precision", "log_loss")
"""The metrics that need class probabilities, not only the predicted labels."""


class UndefinedMetricWarning(UserWarning):
    """A metric is nan because the held-out rows cannot define it (the message says why)."""


def _undefined(name: str, reason: str) -> float:
    """Nan for metric `name`, warning with `reason`."""
    warnings.warn(f"{name} is undefined: {reason}", UndefinedMetricWarning, stacklevel=3)
    return float("nan")


def default_metric(task: str) -> str:
    """The promotion metric a task gets unless configured: log-loss for a classifier, R^2 for regression.

    Never plain accuracy: on a rare label, always answering the majority class scores the base rate.
    """
    return "log_loss" if task == "classification" else "r2"


def better(metric: str, new: float, old: float) -> float:
    """How much better `new` is than `old` on `metric` (negative: worse), whichever direction is better."""
    return old - new if metric in LOWER_IS_BETTER else new - old


def promotion_refusal(metric: str, new: dict, production: dict | None, margin: float) -> str | None:
    """Why a version with metrics `new` must not replace `production`'s (None: promote it).

    A version whose `metric` is missing or nan is not promoted over a production that has a number for it
    (nan compares false, which would promote it); a production without that number is replaced.
    """
    old = (production or {}).get(metric)
    if old is None or not np.isfinite(old):
        return None
    value = new.get(metric)
    if value is None or not np.isfinite(value):
        state = "missing" if value is None else "nan"
        return f"{metric} is {state} for this version, production has {old:.4f}"
    worse = -better(metric, value, old)
    if worse > margin:
        return f"{metric} {value:.4f} vs production {old:.4f} (margin {margin:.4f})"
    return None


def confusion_metrics(confusion: np.ndarray) -> dict[str, float]:
    """Accuracy, macro F1, balanced accuracy and base rate from a summed confusion matrix.

    Rows are the truth, columns the prediction. The base rate is the share of the most frequent true class:
    the accuracy of always answering it, which accuracy must be read against.
    """
    total = confusion.sum()
    true_positive = np.diag(confusion).astype(np.float64)
    predicted, actual = confusion.sum(axis=0), confusion.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        f1 = np.where(predicted + actual > 0, 2 * true_positive / (predicted + actual), 0.0)
        recall = true_positive / actual
    present = (predicted + actual) > 0  # as scikit-learn: classes seen in the truth or the predictions
    if not total:
        return {name: float("nan") for name in ("accuracy", "f1_macro", "balanced_accuracy", "base_rate")}
    return {"accuracy": float(true_positive.sum() / total),
            "f1_macro": float(f1[present].mean()),
            "balanced_accuracy": float(recall[actual > 0].mean()),  # classes in the truth, as scikit-learn
            "base_rate": float(actual.max() / total)}


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray) -> np.ndarray:
    """Counts of (true class, predicted class) over the classes seen in either, in sorted order."""
    classes, codes = np.unique(np.concatenate([np.asarray(y_true), np.asarray(y_pred)]), return_inverse=True)
    truth, predicted = codes[:len(y_true)], codes[len(y_true):]
    confusion = np.zeros((len(classes), len(classes)), np.int64)
    np.add.at(confusion, (truth, predicted), 1)
    return confusion


def decide(proba: np.ndarray, threshold: float | None = None) -> np.ndarray:
    """Each row's predicted class code from class probabilities `proba` (n, C).

    `threshold` None: the most probable class (the first on a tie). Given, for two classes: the second
    (positive) class where its probability is at least `threshold`, as scikit-learn's `roc_curve` counts.
    """
    proba = np.asarray(proba, np.float64)
    if threshold is None or proba.shape[1] != 2:
        return np.argmax(proba, axis=1)
    return (proba[:, 1] >= threshold).astype(np.int64)


def class_confusion(codes: np.ndarray, predicted: np.ndarray, n_classes: int) -> np.ndarray:
    """(truth, predicted) counts over the model's `n_classes` codes; rows of unknown class (-1) left out."""
    codes, predicted = np.asarray(codes, np.int64), np.asarray(predicted, np.int64)
    known = codes >= 0
    confusion = np.zeros((n_classes, n_classes), np.int64)
    np.add.at(confusion, (codes[known], predicted[known]), 1)
    return confusion


def _binary_auc(positive: np.ndarray, score: np.ndarray) -> float:
    """ROC AUC of `score` for the boolean `positive`: the Mann-Whitney statistic with tied scores halved."""
    order = np.sort(score)
    ranks = (np.searchsorted(order, score, "left") + np.searchsorted(order, score, "right") + 1) / 2.0
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def _binary_average_precision(positive: np.ndarray, score: np.ndarray) -> float:
    """Average precision: precision at each distinct score threshold, weighted by the recall it adds."""
    order = np.argsort(-score, kind="mergesort")
    score, positive = score[order], positive[order]
    last = np.r_[np.flatnonzero(np.diff(score)), len(score) - 1]  # the last row of each tied score
    true_pos = np.cumsum(positive)[last].astype(np.float64)
    precision = true_pos / (last + 1)
    recall_gain = np.diff(np.r_[0.0, true_pos]) / true_pos[-1]
    return float(np.sum(recall_gain * precision))


def probability_metrics(codes: np.ndarray, proba: np.ndarray) -> dict[str, float]:
    """ROC AUC, average precision and log-loss of class probabilities `proba` (n, C) for true class `codes`.

    `codes` index `proba`'s columns (-1: a class the model does not know). Two classes: the second is the
    positive one. More: the macro mean of one-vs-rest scores, defined only when every class occurs.
    Probabilities are clipped to [eps, 1 - eps] for log-loss, as scikit-learn does (rows are not rescaled).
    """
    codes = np.asarray(codes, np.int64)
    proba = np.asarray(proba, np.float64)
    n_classes = proba.shape[1]
    if len(codes) == 0:
        return {name: _undefined(name, "no held-out rows") for name in PROBABILITY_METRICS}
    if (codes < 0).any():
        return {name: _undefined(name, "a held-out label is a class the model was not trained on")
                for name in PROBABILITY_METRICS}
    seen = np.bincount(codes, minlength=n_classes)
    result: dict[str, float] = {}
    if n_classes == 2:
        positive = codes == 1
        if seen.min() == 0:
            reason = "only one class in the held-out rows"
            result["roc_auc"] = _undefined("roc_auc", reason)
            result["average_precision"] = (_undefined("average_precision", reason) if not positive.any()
                                           else _binary_average_precision(positive, proba[:, 1]))
        else:
            result["roc_auc"] = _binary_auc(positive, proba[:, 1])
            result["average_precision"] = _binary_average_precision(positive, proba[:, 1])
    elif seen.min() == 0:
        reason = f"class {int(np.argmin(seen))} does not occur in the held-out rows"
        result["roc_auc"] = _undefined("roc_auc", reason)
        result["average_precision"] = _undefined("average_precision", reason)
    else:
        result["roc_auc"] = float(np.mean([_binary_auc(codes == k, proba[:, k]) for k in range(n_classes)]))
        result["average_precision"] = float(np.mean([_binary_average_precision(codes == k, proba[:, k])
                                                     for k in range(n_classes)]))
    result["log_loss"] = float(np.mean(row_log_losses(codes, proba)))
    return result


def row_log_losses(codes: np.ndarray, proba: np.ndarray) -> np.ndarray:
    """Each row's -log of its true class's probability, clipped to [eps, 1 - eps] as scikit-learn does.

    Their mean is the log-loss; horizontal institutions report their sum (`fedcore.agents.scoring`).
    """
    eps = np.finfo(np.float64).eps
    clipped = np.clip(np.asarray(proba, np.float64), eps, 1 - eps)
    return -np.log(clipped[np.arange(len(codes)), np.asarray(codes, np.int64)])


def regression_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """RMSE, R^2 (1 for a perfect fit of a constant target, 0 for an imperfect one, as scikit-learn), MAE."""
    y_true, y_pred = np.asarray(y_true, np.float64), np.asarray(y_pred, np.float64)
    residual = float(np.sum((y_true - y_pred) ** 2))
    spread = float(np.sum((y_true - y_true.mean()) ** 2)) if len(y_true) else 0.0
    r2 = 1.0 - residual / spread if spread > 0 else (1.0 if residual == 0 else 0.0)
    if not len(y_true):
        return {"rmse": float("nan"), "r2": r2, "mae": float("nan")}
    return {"rmse": float(np.sqrt(residual / len(y_true))), "r2": r2,
            "mae": float(np.mean(np.abs(y_true - y_pred)))}


def class_codes(y_true: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Each label's column in `classes` (-1 for a label not among them)."""
    lookup = {value: k for k, value in enumerate(np.asarray(classes).tolist())}
    return np.array([lookup.get(value, -1) for value in np.asarray(y_true).tolist()], np.int64)


def metrics(task: str, y_true: np.ndarray, y_pred: np.ndarray, proba: np.ndarray | None = None,
            classes: np.ndarray | None = None) -> dict[str, float]:
    """Every held-out metric of the task; the probability ones only given `proba` (columns: `classes`)."""
    if task != "classification":
        return regression_metrics(y_true, y_pred)
    result = confusion_metrics(confusion_matrix(y_true, y_pred))
    if proba is not None:
        if classes is None:
            raise ValueError("metrics: class probabilities need the classes their columns stand for")
        result.update(probability_metrics(class_codes(y_true, classes), proba))
    return result
