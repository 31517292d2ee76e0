"""The held-out scores agents report equal scikit-learn's, without scikit-learn in production."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.metrics import confusion_metrics, metrics


def test_classification_scores_match_scikit_learn() -> None:
    from sklearn.metrics import accuracy_score, confusion_matrix, f1_score

    rng = np.random.default_rng(0)
    truth, predicted = rng.integers(0, 4, 300), rng.integers(0, 4, 300)
    predicted[predicted == 3] = 2  # a class never predicted
    expected = {"accuracy": accuracy_score(truth, predicted),
                "f1_macro": f1_score(truth, predicted, average="macro")}
    matrix = confusion_matrix(truth, predicted, labels=[0, 1, 2, 3])
    assert confusion_metrics(matrix) == pytest.approx(expected)
    assert metrics("classification", truth, predicted) == pytest.approx(expected)
    names = np.array(["no", "yes", "maybe"])
    assert metrics("classification", names[truth % 3], names[predicted % 3]) == pytest.approx(
        {"accuracy": accuracy_score(names[truth % 3], names[predicted % 3]),
         "f1_macro": f1_score(names[truth % 3], names[predicted % 3], average="macro")})


def test_regression_scores_match_scikit_learn() -> None:
    from sklearn.metrics import mean_squared_error, r2_score

    rng = np.random.default_rng(1)
    truth = rng.normal(size=200)
    predicted = truth + rng.normal(scale=0.3, size=200)
    assert metrics("regression", truth, predicted) == pytest.approx(
        {"rmse": np.sqrt(mean_squared_error(truth, predicted)), "r2": r2_score(truth, predicted)})
    constant = np.full(5, 2.0)
    assert metrics("regression", constant, constant)["r2"] == r2_score(constant, constant) == 1.0
    assert metrics("regression", constant, constant + 1)["r2"] == r2_score(constant, constant + 1) == 0.0
