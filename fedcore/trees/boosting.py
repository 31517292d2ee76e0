"""Gradient boosting's hyper-parameters (XGBoost's names) on the forest engine's parameters.

A boosting model is grown by the same grower and strategy as a forest: each round is one tree batch of K
trees (K = 1, or the classes under softmax), every row in every tree (subsample zeroes the gradients of the
rows a round leaves out, as XGBoost does, instead of dropping them), features sampled per tree
(colsample_bytree), gradient statistics as the criterion (`fedcore.trees.criteria`), gamma as the least gain
that splits (on XGBoost's scale, twice the engine's gain), min_child_weight as the least hessian sum a child
keeps, leaf weights -G / (H + lambda) times the learning rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fedcore.errors import ParameterError
from fedcore.trees.combination import TreeCombination
from fedcore.trees.criteria import GRADIENT, leaf_value
from fedcore.trees.early_stopping import metric_name
from fedcore.trees.params import MAX_TREES_PER_BATCH, ForestParams, check_int, with_label_protection


@dataclass(frozen=True)
class BoostingParams(ForestParams):
    """Boosting: `n_estimators` rounds of trees on gradient statistics (privacy: the forest's vertical modes).

    With `paillier` or `ou` the label holder encrypts each round's (g, h) (SecureBoost).
    """

    criterion: str = "gradient"
    n_estimators: int = 100
    max_depth: int | None = 6
    max_features: str | int | float | None = 1.0
    feature_sampling: str = "tree"
    bootstrap: bool = False
    learning_rate: float = 0.3
    reg_lambda: float = 1.0
    gamma: float = 0.0
    min_child_weight: float = 1.0
    subsample: float = 1.0
    early_stopping_rounds: int | None = None
    """Keep the rounds up to the best on the label holder's held-out rows (log-loss or RMSE), stopping once
    this many rounds in a row did not improve on it (XGBoost's rule; `fedcore.trees.early_stopping`)."""

    XGBOOST_NAMES = {"colsample_bytree": "max_features"}
    """XGBoost's names a config uses for fields the engine calls otherwise."""

    @classmethod
    def from_vertical_config(cls, values: dict, privacy: Any) -> BoostingParams:
        """A vertical config's `params:`, with the label protection its `privacy:` section sets."""
        return cls.from_config(with_label_protection(values, privacy))

    @classmethod
    def from_config(cls, values: dict) -> BoostingParams:
        """Parameters by XGBoost's names (a config's `params:`); the engine's names for them are refused."""
        values = dict(values)
        for xgboost, engine in cls.XGBOOST_NAMES.items():
            if engine in values:
                raise ParameterError(f"boosting takes XGBoost's {xgboost!r}, not {engine!r}")
            if xgboost in values:
                values[engine] = values.pop(xgboost)
        return cls(**values)

    def _check_criterion(self) -> None:
        if self.criterion != "gradient":
            raise ParameterError(f"boosting grows on gradient statistics, not criterion {self.criterion!r}")

    def __post_init__(self) -> None:
        """Check the boosting parameters on top of the forest's."""
        super().__post_init__()
        for name, low, high in (("learning_rate", 0.0, math.inf), ("reg_lambda", 0.0, math.inf),
                                ("gamma", 0.0, math.inf), ("min_child_weight", 0.0, math.inf),
                                ("subsample", 0.0, 1.0)):
            value = getattr(self, name)
            strict = name in ("learning_rate", "subsample")
            if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                    or value > high or value < low or (strict and value == low)):
                bound = f"in {'(' if strict else '['}{low}, {high}]" if high < math.inf else (
                    f"{'>' if strict else '>='} {low}")
                raise ParameterError(f"{name} must be a number {bound}, got {value!r}")
        if self.bootstrap or self.feature_sampling != "tree":
            raise ParameterError("boosting takes every row in every round (subsample zeroes gradients) and "
                                 "samples features per tree (colsample_bytree)")
        if self.early_stopping_rounds is not None:
            check_int("early_stopping_rounds", self.early_stopping_rounds, 1)
        if self.min_impurity_decrease:
            raise ParameterError("boosting splits on gamma, not min_impurity_decrease")

    @property
    def criterion_code(self) -> int:
        """Gradient statistics."""
        return GRADIENT

    @property
    def min_leaf_weight(self) -> float:
        """The least hessian sum a child keeps (XGBoost's min_child_weight)."""
        return float(self.min_child_weight)

    def node_values(self, stats: np.ndarray) -> np.ndarray:
        """Each node's leaf weight times the learning rate, (n, 1): what its rows' margins gain."""
        return leaf_value(stats, GRADIENT, float(self.reg_lambda), float(self.learning_rate))

    def least_gain(self, root_weight: np.ndarray) -> np.ndarray | float:
        """Half of gamma: XGBoost splits when G_L^2/(H_L+l) + G_R^2/(H_R+l) - G^2/(H+l) >= gamma.

        That sum is twice the gain the engine scans (its structure scores carry the textbook 1/2), so the
        engine's gain must reach gamma / 2 (a power of two: exact).
        """
        return 0.5 * float(self.gamma)

    def growth(self, trees_per_round: int) -> BoostingParams:
        """The parameters the grower runs: n_estimators rounds of `trees_per_round` trees, a round a batch."""
        check_int("trees per round", trees_per_round, 1, MAX_TREES_PER_BATCH, "a round is one tree batch")
        return replace(self, n_estimators=self.n_estimators * trees_per_round,
                       tree_batch_size=trees_per_round)

    def manifest_entry(self, combination: TreeCombination, n_trees: int, grown_trees: int,
                       loss: str) -> dict[str, Any]:
        """Boosting's facts for the manifest and card (both settings): rounds kept and grown, rate, loss."""
        k = combination.trees_per_round
        return {"rounds": n_trees // k, "rounds_grown": grown_trees // k, "trees_per_round": k,
                "learning_rate": float(self.learning_rate), "loss": loss, "link": combination.link,
                "base_score": list(combination.base_score),
                "early_stopping_rounds": self.early_stopping_rounds,
                "early_stopping_metric": metric_name(combination) if self.early_stopping_rounds is not None
                else None}

    def setup_fields(self) -> dict[str, object]:
        """What the parties are told at setup: the label holder its loss's inputs, all of them lambda."""
        return {"task": self.task, "reg_lambda": float(self.reg_lambda),
                "learning_rate": float(self.learning_rate), "subsample": float(self.subsample)}
