"""The tasks and forest hyper-parameters both simulators give their engines and scikit-learn references."""

from __future__ import annotations

TASKS = ("auto", "classification", "regression")
TASK_DEFAULT = "default"
"""`max_features` default: the engine's and scikit-learn's own per task (sqrt for classes, all for
regression)."""


BOOSTING_DEFAULTS = {"max_depth": 6, "learning_rate": 0.3, "reg_lambda": 1.0}
"""What simulate's boosting runs (and its reference) take beyond the rounds and seed: XGBoost's defaults."""


def boosting_params(trees: int, max_depth: int | None, seed: int) -> dict:
    """The hyper-parameters the federated, single-party and reference boosting share (rounds = trees)."""
    depth = BOOSTING_DEFAULTS["max_depth"] if max_depth is None else max_depth
    return {**BOOSTING_DEFAULTS, "n_estimators": trees, "max_depth": depth, "random_state": seed}


def forest_params(task: str, trees: int, max_depth: int | None, max_features: str | int | float | None,
                  seed: int) -> dict:
    """The hyper-parameters the federated, single-party and reference forests share.

    `TASK_DEFAULT` as `max_features` becomes the task's own default.
    """
    if max_features == TASK_DEFAULT:
        max_features = "sqrt" if task == "classification" else 1.0
    return {"n_estimators": trees, "max_depth": max_depth, "max_features": max_features, "random_state": seed}
