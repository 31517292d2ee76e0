"""How both simulators run an engine and compare it: timed fit and predict, and the shared result entries.

The federated run is set beside the single-party run of the same engine (M = 1) and scikit-learn's
reference on the pooled rows, in the same entries for every setting.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from fedcore.metrics import metrics

Predicted = TypeVar("Predicted")


def timed(fit: Callable[[], object], predict: Callable[[], Predicted]) -> tuple[Predicted, float, float]:
    """Call `fit`, then `predict`; return what `predict` returned and the seconds each call took."""
    started = time.perf_counter()
    fit()
    train_s = time.perf_counter() - started
    started = time.perf_counter()
    predicted = predict()
    return predicted, train_s, time.perf_counter() - started


@dataclass(frozen=True)
class EngineRun:
    """One engine fitted by a simulator: the model, its output on the test rows and how long it took."""

    model: Any
    output: np.ndarray
    """What the model returned: class probabilities (classification) or the predicted values."""
    predictions: np.ndarray
    train_s: float
    predict_s: float

    def metrics(self, task: str, y_test: np.ndarray) -> dict[str, float]:
        """The test metrics, from the class probabilities too when the model gave them."""
        if task == "classification" and self.output.ndim == 2:
            return metrics(task, y_test, self.predictions, self.output, self.model.classes_)
        return metrics(task, y_test, self.predictions)

    def summary(self, task: str, y_test: np.ndarray) -> dict:
        """Test metrics, timings, rounds and bytes: the `single_party` entry of a result."""
        communication = self.model.communication_
        return {"metrics": self.metrics(task, y_test), "train_s": self.train_s,
                "predict_s": self.predict_s, "rounds": communication["rounds"],
                "bytes": communication["bytes"]}


def announce(progress: bool, caption: str) -> None:
    """Say on stderr which run starts, when the simulation shows progress."""
    if progress:
        sys.stderr.write(f"fedforest: {caption}\n")


def run_engine(model: Any, parties: list, label: str, test: Any, *, caption: str, progress: bool,
               probabilities: bool = False) -> EngineRun:
    """Say `caption` (with `progress`), fit `model` on the party frames and predict `test`, timing both.

    With `probabilities` the output is `predict_proba`'s and each row's prediction its most probable class.
    """
    announce(progress, caption)
    predict = model.predict_proba if probabilities else model.predict
    output, train_s, predict_s = timed(lambda: model.fit(parties, label=label), lambda: predict(test))
    predictions = model.classes_[np.argmax(output, axis=1)] if probabilities else output
    return EngineRun(model, output, predictions, train_s, predict_s)


def compare(task: str, y_test: np.ndarray, federated: EngineRun, single: EngineRun, identical: bool | None,
            reference: dict) -> dict:
    """The result entries both settings share, from `metrics` to `communication`.

    `identical` says whether the federated run equalled the single-party run (None where noise is added).
    """
    communication = federated.model.communication_
    return {
        "metrics": federated.metrics(task, y_test),
        "reference": reference,
        "single_party_identical": identical,
        "single_party": single.summary(task, y_test),
        "timing": {"train_s": federated.train_s, "predict_s": federated.predict_s},
        "communication": {"rounds": communication["rounds"], "bytes": communication["bytes"]},
    }
