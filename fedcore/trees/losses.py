"""Boosting's losses, at the label holder: (y, margin) -> per-row gradient and hessian, base score and link.

The grower, the splitter and the parties' histograms know none of this: they sum the (g, h) the label holder
computes here (`fedcore.trees.criteria`, gradient statistics). XGBoost's objectives:

    reg:squarederror   g = m - y, h = 1; base score mean(y); identity link
    binary:logistic    g = p - y, h = max(p (1 - p), 1e-16), p = sigmoid(m); base score logit(mean(y))
    multi:softprob     K margins (one tree per class and round), g_k = p_k - [y = k],
                       h_k = max(2 p_k (1 - p_k), 1e-16) (XGBoost's hessian), p = softmax(m); base score
                       log(class share)

Exponentials and logarithms are libm's (`math` in numba), the same on every CPU; sums are `math.fsum`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba as nb
import numpy as np

HESSIAN_FLOOR = 1e-16
"""XGBoost's lower bound on a logistic or softmax hessian."""


@dataclass(frozen=True)
class Loss:
    """One objective: its XGBoost name and link ("identity", "sigmoid", "softmax")."""

    name: str
    link: str

    def n_outputs(self, n_classes: int) -> int:
        """Margins per row, hence trees per round: K classes under softmax, else 1."""
        return n_classes if self.link == "softmax" else 1


SQUARED_ERROR_LOSS = Loss("reg:squarederror", "identity")
LOGISTIC = Loss("binary:logistic", "sigmoid")
SOFTMAX = Loss("multi:softprob", "softmax")
LOSSES = {loss.link: loss for loss in (SQUARED_ERROR_LOSS, LOGISTIC, SOFTMAX)}


def loss_for(task: str, n_classes: int) -> Loss:
    """The objective of a task: squared error (regression), logistic (two classes), softmax (more)."""
    if task == "regression":
        return SQUARED_ERROR_LOSS
    return LOGISTIC if n_classes <= 2 else SOFTMAX


def base_score(loss: Loss, y: np.ndarray, n_classes: int) -> np.ndarray:
    """The margins every row starts from, (n_outputs,): the label mean, its log-odds, or log class shares.

    `y`: values (regression) or class codes 0..n_classes-1.
    """
    y = np.asarray(y, dtype=np.float64)
    n = max(len(y), 1)
    if loss is SQUARED_ERROR_LOSS:
        return np.array([math.fsum(y.tolist()) / n])
    return class_base_score(loss, np.bincount(y.astype(np.int64), minlength=max(n_classes, 2)), n_classes)


def class_base_score(loss: Loss, counts: np.ndarray, n_classes: int) -> np.ndarray:
    """A classifier's base score from its rows' class counts: the log-odds (logistic) or log class shares.

    What horizontal boosting's master computes from the securely summed counts of every party's rows.
    """
    counts = np.asarray(counts, dtype=np.float64)
    n = max(float(counts.sum()), 1.0)
    share = np.clip(counts / n, 1e-12, 1 - 1e-12)  # a class absent from the rows: a finite margin
    if loss is LOGISTIC:
        return np.array([math.log(share[1] / (1.0 - share[1]))])
    return np.array([math.log(s) for s in share[:n_classes]])


def gradients(loss: Loss, y: np.ndarray, margins: np.ndarray) -> np.ndarray:
    """Each output's (g, h) per row: (n_outputs, n_rows, 2) float64, from margins (n_rows, n_outputs)."""
    y = np.ascontiguousarray(y, dtype=np.float64)
    margins = np.ascontiguousarray(margins, dtype=np.float64)
    out = np.empty((margins.shape[1], len(y), 2))
    if loss is SQUARED_ERROR_LOSS:
        out[0, :, 0] = margins[:, 0] - y
        out[0, :, 1] = 1.0
    elif loss is LOGISTIC:
        _logistic_gradients(y, margins[:, 0], out)
    else:
        _softmax_gradients(y.astype(np.int64), margins, out)
    return out


def transform(link: str, margins: np.ndarray) -> np.ndarray:
    """Margins (n_rows, K) to outputs: themselves, two class probabilities (1 - p, p), or K probabilities."""
    margins = np.ascontiguousarray(margins, dtype=np.float64)
    if link == "identity":
        return margins
    if link == "sigmoid":
        p = _sigmoid(margins[:, 0])
        return np.stack([1.0 - p, p], axis=1)
    if link == "softmax":
        return _softmax(margins)
    raise ValueError(f"unknown link {link!r}: one of {sorted(LOSSES)}")


@nb.njit(cache=True, nogil=True)
def _sigmoid(m):
    out = np.empty(m.shape[0])
    for i in range(m.shape[0]):
        out[i] = 1.0 / (1.0 + math.exp(-m[i]))
    return out


@nb.njit(cache=True, nogil=True)
def _softmax(m):
    out = np.empty_like(m)
    for i in range(m.shape[0]):
        top = m[i, 0]
        for k in range(1, m.shape[1]):
            top = max(top, m[i, k])
        total = 0.0
        for k in range(m.shape[1]):
            out[i, k] = math.exp(m[i, k] - top)
            total += out[i, k]
        for k in range(m.shape[1]):
            out[i, k] /= total
    return out


@nb.njit(cache=True, nogil=True)
def _logistic_gradients(y, m, out):
    p = _sigmoid(m)
    for i in range(y.shape[0]):
        out[0, i, 0] = p[i] - y[i]
        out[0, i, 1] = max(p[i] * (1.0 - p[i]), HESSIAN_FLOOR)


@nb.njit(cache=True, nogil=True)
def _softmax_gradients(y, m, out):
    p = _softmax(m)
    for i in range(y.shape[0]):
        for k in range(m.shape[1]):
            out[k, i, 0] = p[i, k] - (1.0 if y[i] == k else 0.0)
            out[k, i, 1] = max(2.0 * p[i, k] * (1.0 - p[i, k]), HESSIAN_FLOOR)
