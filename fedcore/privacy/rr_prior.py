"""RR-with-prior (Ghazi et al., NeurIPS 2021): a label randomized among the classes its prior ranks first.

Each row has a prior over the C classes (from a first-stage model trained on other rows). Its classes are
ranked by prior (ties: the smaller code first) and k is the size of the top-k set that maximises the
probability of reporting the true label, prior(top k) * e^eps / (e^eps + k - 1) (the paper's choice;
ties: the smallest k). The report is k-RR on that set: a label in it is kept with probability
e^eps / (e^eps + k - 1), else another of the set is reported uniformly; a label outside it gives a uniform
member of the set.

Privacy: for any two labels, every report's probability differs by at most e^eps (the set depends on the
prior only), so one report is eps-label-DP as long as the prior does not depend on the row's own label:
the first stage must be trained on other rows (a disjoint subset), and each row reports once.

Draws are by row position under the party's secret key (`fedcore.privacy.ldp_draws.permanent_top_k`, the
words k-RR reads), so a block of rows draws what the whole table draws for it. Not yet wired into the FET
protocol (issue #31): this module is the mechanism, its exact law, and its draws.
"""

from __future__ import annotations

import math

import numpy as np

from fedcore.errors import ParameterError
from fedcore.privacy import ldp_draws


def _check(prior: np.ndarray, epsilon: float) -> np.ndarray:
    """The prior as (n, C) float64, finite, >= 0 (rows need not sum to 1), or ParameterError."""
    prior = np.asarray(prior, dtype=np.float64)
    if prior.ndim != 2 or prior.shape[1] < 1:
        raise ParameterError(f"prior must be (rows, classes), got shape {prior.shape}")
    if not np.isfinite(prior).all() or (prior < 0).any():
        raise ParameterError("prior must be finite and >= 0: a class probability per row and class")
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise ParameterError(f"epsilon must be a finite number > 0, got {epsilon!r}: each row's label "
                             "epsilon")
    return prior


def top_k(prior: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """Each row's classes by descending prior, (n, C) int64, and its k, (n,) int64 (see the module docstring).

    Cumulative sums run left to right over each row (the same on every CPU).
    """
    prior = _check(prior, epsilon)
    order = np.argsort(-prior, axis=1, kind="stable")
    mass = np.cumsum(np.take_along_axis(prior, order, axis=1), axis=1)
    e = math.exp(epsilon)
    sizes = np.arange(1, prior.shape[1] + 1, dtype=np.float64)
    k = np.argmax(mass * (e / (e + (sizes - 1.0))), axis=1) + 1  # the first maximum: the smallest k
    return order.astype(np.int64), k.astype(np.int64)


def report_probabilities(prior: np.ndarray, labels: np.ndarray, epsilon: float) -> np.ndarray:
    """P(report = c | row's prior, its label), (n, C) float64: the mechanism's exact law, row by row."""
    order, k = top_k(prior, epsilon)
    labels = np.asarray(labels, dtype=np.int64)
    n, n_classes = order.shape
    e = math.exp(epsilon)
    out = np.zeros((n, n_classes))
    for i in range(n):
        members = order[i, :k[i]]
        if labels[i] in members:
            out[i, members] = 1.0 / (e + (k[i] - 1.0))
            out[i, labels[i]] = e / (e + (k[i] - 1.0))
        else:
            out[i, members] = 1.0 / k[i]
    return out


def randomize(labels: np.ndarray, prior: np.ndarray, epsilon: float, key: np.ndarray,
              first_row: int = 0) -> np.ndarray:
    """Each row's one report (class codes, (n,) int64); row i is the party's row first_row + i (its words)."""
    order, k = top_k(prior, epsilon)
    labels = np.asarray(labels)
    if labels.shape != (order.shape[0],) or labels.dtype.kind not in "iu" or \
            (labels.size and not (0 <= labels.min() and labels.max() < order.shape[1])):
        raise ParameterError(f"labels must be {order.shape[0]} class codes in [0, {order.shape[1]}) beside "
                             "the prior's rows")
    e = math.exp(epsilon)
    keep = np.array([ldp_draws.CERTAIN] + [ldp_draws.threshold63(e / (e + (size - 1.0)))
                                           for size in range(1, order.shape[1] + 1)], dtype=np.uint64)
    out = np.empty(order.shape[0], dtype=np.int64)
    ldp_draws.permanent_top_k(labels.astype(np.int64), order, k, int(first_row), ldp_draws.check_key(key),
                              keep, out)
    return out
