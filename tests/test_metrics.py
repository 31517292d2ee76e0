"""The held-out scores agents report equal scikit-learn's, without scikit-learn in production."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.metrics import (
    UndefinedMetricWarning,
    better,
    confusion_metrics,
    metrics,
    probability_metrics,
    promotion_refusal,
)


def test_classification_scores_match_scikit_learn() -> None:
    from sklearn.metrics import accuracy_score, balanced_accuracy_score, confusion_matrix, f1_score

    rng = np.random.default_rng(0)
    truth, predicted = rng.integers(0, 4, 300), rng.integers(0, 4, 300)
    predicted[predicted == 3] = 2  # a class never predicted
    expected = {"accuracy": accuracy_score(truth, predicted),
                "f1_macro": f1_score(truth, predicted, average="macro"),
                "balanced_accuracy": balanced_accuracy_score(truth, predicted),
                "base_rate": np.bincount(truth).max() / len(truth)}
    matrix = confusion_matrix(truth, predicted, labels=[0, 1, 2, 3])
    assert confusion_metrics(matrix) == pytest.approx(expected)
    assert metrics("classification", truth, predicted) == pytest.approx(expected)
    names = np.array(["no", "yes", "maybe"])
    named_truth, named_predicted = names[truth % 3], names[predicted % 3]
    assert metrics("classification", named_truth, named_predicted) == pytest.approx(
        {"accuracy": accuracy_score(named_truth, named_predicted),
         "f1_macro": f1_score(named_truth, named_predicted, average="macro"),
         "balanced_accuracy": balanced_accuracy_score(named_truth, named_predicted),
         "base_rate": np.unique(named_truth, return_counts=True)[1].max() / len(named_truth)})


def test_regression_scores_match_scikit_learn() -> None:
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    rng = np.random.default_rng(1)
    truth = rng.normal(size=200)
    predicted = truth + rng.normal(scale=0.3, size=200)
    assert metrics("regression", truth, predicted) == pytest.approx(
        {"rmse": np.sqrt(mean_squared_error(truth, predicted)), "r2": r2_score(truth, predicted),
         "mae": mean_absolute_error(truth, predicted)})
    constant = np.full(5, 2.0)
    assert metrics("regression", constant, constant)["r2"] == r2_score(constant, constant) == 1.0
    assert metrics("regression", constant, constant + 1)["r2"] == r2_score(constant, constant + 1) == 0.0


def _scikit_learn_scores(truth: np.ndarray, proba: np.ndarray) -> dict[str, float]:
    """scikit-learn's scores of class probabilities (columns: classes 0..C-1)."""
    from sklearn.metrics import average_precision_score, log_loss, roc_auc_score

    classes = np.arange(proba.shape[1])
    if proba.shape[1] == 2:
        return {"roc_auc": roc_auc_score(truth, proba[:, 1]),
                "average_precision": average_precision_score(truth, proba[:, 1]),
                "log_loss": log_loss(truth, proba, labels=classes)}
    return {"roc_auc": roc_auc_score(truth, proba, multi_class="ovr", average="macro", labels=classes),
            "average_precision": average_precision_score(truth[:, None] == classes, proba, average="macro"),
            "log_loss": log_loss(truth, proba, labels=classes)}


@pytest.mark.parametrize("n_classes", [2, 4])
def test_probability_scores_match_scikit_learn_with_ties(n_classes: int) -> None:
    from sklearn.metrics import balanced_accuracy_score

    rng = np.random.default_rng(n_classes)
    truth = rng.integers(0, n_classes, 400)
    hit = truth[:, None] == np.arange(n_classes)
    raw = rng.integers(0, 6, (400, n_classes)).astype(np.float64) + 3.0 * hit
    raw[:10] = 0.0
    raw[:10, 0] = 1.0  # certain of class 0, right or wrong: probability 0 is clipped, as scikit-learn
    proba = raw / raw.sum(axis=1, keepdims=True)  # coarse values: many tied scores
    names = np.array(["a", "b", "c", "d"])[:n_classes]
    predicted = np.argmax(proba, axis=1)
    result = metrics("classification", names[truth], names[predicted], proba, names)
    expected = _scikit_learn_scores(truth, proba)
    for name in expected:
        assert result[name] == pytest.approx(expected[name], rel=1e-12), name
    assert result["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(truth, predicted), rel=1e-12)
    assert result["base_rate"] == np.bincount(truth).max() / len(truth)


def test_one_class_present_is_nan_with_a_reason() -> None:
    from sklearn.metrics import average_precision_score, log_loss

    truth = np.zeros(6, np.int64)
    proba = np.column_stack([np.linspace(0.2, 0.9, 6), 1 - np.linspace(0.2, 0.9, 6)])
    with pytest.warns(UndefinedMetricWarning, match="roc_auc is undefined: only one class in the held-out"):
        result = probability_metrics(truth, proba)
    assert np.isnan(result["roc_auc"]) and np.isnan(result["average_precision"])
    assert result["log_loss"] == pytest.approx(log_loss(truth, proba, labels=[0, 1]), rel=1e-12)
    with pytest.warns(UndefinedMetricWarning, match="class 2 does not occur in the held-out rows"):
        three = probability_metrics(np.array([0, 1, 0, 1]), np.full((4, 3), 1 / 3))
    assert np.isnan(three["roc_auc"]) and np.isnan(three["average_precision"])
    ones = np.ones(6, np.int64)  # only positives: average precision is defined (1.0), the AUC is not
    with pytest.warns(UndefinedMetricWarning, match="roc_auc is undefined"):
        assert probability_metrics(ones, proba)["average_precision"] == pytest.approx(
            average_precision_score(ones, proba[:, 1]), rel=1e-12)
    with pytest.warns(UndefinedMetricWarning, match="a held-out label is a class the model was not trained"):
        assert np.isnan(metrics("classification", np.array(["x"]), np.array(["a"]), np.ones((1, 1)),
                                np.array(["a"]))["log_loss"])


def test_regression_mean_absolute_error_and_directions() -> None:
    from sklearn.metrics import mean_absolute_error

    rng = np.random.default_rng(2)
    truth, predicted = rng.normal(size=50), rng.normal(size=50)
    expected = mean_absolute_error(truth, predicted)
    assert metrics("regression", truth, predicted)["mae"] == pytest.approx(expected, rel=1e-12)
    assert better("log_loss", 0.3, 0.4) > 0 and better("mae", 0.5, 0.4) < 0
    assert better("roc_auc", 0.7, 0.8) < 0 and better("r2", 0.9, 0.8) > 0


def test_a_version_without_a_number_for_the_metric_is_not_promoted_over_one_with_it() -> None:
    production = {"log_loss": 0.31, "accuracy": 0.9}
    assert promotion_refusal("log_loss", {"log_loss": 0.30}, production, 0.0) is None
    assert promotion_refusal("log_loss", {"log_loss": 0.33}, production, 0.0) == (
        "log_loss 0.3300 vs production 0.3100 (margin 0.0000)")
    assert promotion_refusal("log_loss", {"log_loss": 0.33}, production, 0.05) is None
    assert promotion_refusal("log_loss", {"log_loss": float("nan")}, production, 0.0) == (
        "log_loss is nan for this version, production has 0.3100")
    assert promotion_refusal("log_loss", {}, production, 0.0) == (
        "log_loss is missing for this version, production has 0.3100")
    assert promotion_refusal("accuracy", {"accuracy": 0.89}, production, 0.0) == (
        "accuracy 0.8900 vs production 0.9000 (margin 0.0000)")
    # nothing to compare with: the first version, or a production without a number for the metric
    assert promotion_refusal("log_loss", {"log_loss": float("nan")}, None, 0.0) is None
    assert promotion_refusal("log_loss", {"log_loss": 0.5}, {"log_loss": float("nan")}, 0.0) is None
