"""Early stopping of boosting: how many rounds to keep, from held-out rows' leaf weights and labels.

XGBoost's rule (`early_stopping_rounds`): after each round, score the held-out rows with the loss's metric
(log-loss for logistic and softmax, RMSE for squared error); stop once `patience` rounds in a row have not
strictly improved on the best, and keep the rounds up to the best. Given the leaf weight every tree gave each
held-out row, the score of every prefix of rounds is known, so the kept rounds are found after growth by the
same rule as stopping during it. The label holder runs this (it alone has the labels); the simulation
estimators run the same function. Sums are `math.fsum`, logs libm's: the same on every CPU.
"""

from __future__ import annotations

import math

import numpy as np

from fedcore.trees.combination import TreeCombination
from fedcore.trees.losses import transform

PROBABILITY_FLOOR = 1e-16
"""Probabilities below this count as it in the log-loss (a finite score for a confident wrong answer)."""


def metric_name(combination: TreeCombination) -> str:
    """The metric early stopping watches: RMSE (identity link) or log-loss."""
    return "rmse" if combination.link == "identity" else "log_loss"


def round_scores(combination: TreeCombination, y: np.ndarray, leaf_values: np.ndarray) -> list[float]:
    """The held-out score after each round: log-loss or RMSE of the first r rounds, r = 1, 2, ...

    `leaf_values`: (n_rows, n_trees) leaf weights, trees in round order (K a round); `y`: values or class
    codes (-1: a class the model does not know).
    """
    k = combination.trees_per_round
    n_rows, n_trees = leaf_values.shape
    if n_trees % k:
        raise ValueError(f"{n_trees} trees are not whole rounds of {k}")
    y = np.asarray(y, np.float64)
    margins = np.tile(np.asarray(combination.base_score, np.float64), (n_rows, 1))
    scores = []
    for first in range(0, n_trees, k):
        for tree in range(first, first + k):  # the order `TreeCombination.margins` sums in
            margins[:, tree % k] += leaf_values[:, tree]
        outputs = transform(combination.link, margins)
        if combination.link == "identity":
            residual = outputs[:, 0] - y
            scores.append(math.sqrt(math.fsum((residual * residual).tolist()) / max(n_rows, 1)))
        else:
            codes = y.astype(np.int64)  # -1: a class training never saw, probability 0
            truth = np.where(codes >= 0, outputs[np.arange(n_rows), np.maximum(codes, 0)], 0.0)
            losses = -np.log(np.maximum(truth, PROBABILITY_FLOOR))
            scores.append(math.fsum(losses.tolist()) / max(n_rows, 1))
    return scores


def kept_rounds(scores: list[float], patience: int) -> int:
    """How many rounds to keep: up to the best score, watching until `patience` rounds bring no better one."""
    best = 0
    for index, score in enumerate(scores):
        if score < scores[best]:
            best = index
        elif index - best >= patience:
            break
    return best + 1
