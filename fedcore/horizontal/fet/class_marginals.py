"""FET-GDP plan marginals: each drawn node's split chosen among k candidates by class-conditional marginals.

Plan leaves draws every node's feature and threshold without looking at the labels, so on many classes its
trees cannot separate them whatever the budget (docs/benchmarks.md). Plan marginals asks each party, once at
hello, for its Gaussian-noised histogram of every feature over the declared domain's cells **per class**
(`histogram_counts` with labels): one row is in one (cell, class) of each of the d features, so the release
has L2 sensitivity sqrt(d), as the unconditioned histograms it replaces, and is charged the same way
(`marginal_releases`, a larger share: `CLASS_MARGINAL_SHARE`). The master sums the parties' histograms; the
rest is post-processing, no further budget:

* the features' CDFs for placing thresholds (`MarginalQuantiles`) are the class sums;
* each node's class weights are a naive-Bayes estimate of its rows' classes, w_c = N_c prod_f G_fc(box_f)
  (N_c the class's noisy row count, G_fc its noisy CDF's mass in the node's interval of feature f); a child's
  are its parent's times G_fc(child's interval) / G_fc(parent's) on the split feature;
* of a node's k candidates (drawn features, thresholds by the CDFs), the one whose children's weights have the
  least weighted Gini impurity is the split (`choose_splits`), as Extra-Trees chooses among random candidates
  by the real counts. Between the greedy DP trees of Fletcher and Islam's survey (ACM Computing Surveys
  52(4), 2019: splits scored on noisy counts paid per node) and the random ones (Jagannathan et al., 2012:
  plan leaves), the splits are scored on statistics paid once.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from fedcore.horizontal.fet.marginals import MASS_FLOOR, MarginalQuantiles, _position

CLASS_MARGINAL_SHARE = 0.3
"""Plan marginals: about this share of the plan's releases pays for the class-conditional histograms
(measured, one seed: 0.1 and 0.5 no better on letter, 0.1 worse on satellite; docs/benchmarks.md)."""


class ClassMarginals:
    """Each feature's and class's noisy CDF over the declared domain, and the classes' noisy row counts."""

    def __init__(self, histograms: np.ndarray, low: np.ndarray, high: np.ndarray) -> None:
        """`histograms` (d, bins, C): the parties' noisy counts per cell and class, summed; `low`, `high`."""
        d, bins, classes = histograms.shape
        mass = np.maximum(np.moveaxis(histograms, 2, 1), 0.0)  # (d, C, bins)
        floor = MASS_FLOOR * np.maximum(mass.sum(axis=2, keepdims=True), 1.0) / bins
        mass = mass + floor
        cdf = np.concatenate([np.zeros((d, classes, 1)), np.cumsum(mass, axis=2)], axis=2)
        self.cdf = np.ascontiguousarray(cdf / cdf[:, :, -1:])
        # the class's rows: every feature's noisy counts sum to them (NaN aside); their mean is least noisy
        self.class_rows = np.maximum(histograms.sum(axis=1).mean(axis=0), 1.0)
        self.low = np.asarray(low, np.float64)
        self.high = np.asarray(high, np.float64)
        self.quantiles = MarginalQuantiles(histograms.sum(axis=2), low, high)

    def box_weights(self, low: np.ndarray, high: np.ndarray) -> np.ndarray:
        """Nodes' class weights (A, C) from their whole boxes `low`, `high` (A, d), summing to 1 per node."""
        features = np.broadcast_to(np.arange(low.shape[1]), low.shape)
        mass = _interval_mass(np.ascontiguousarray(features, np.int64),
                              np.ascontiguousarray(low, np.float64), np.ascontiguousarray(high, np.float64),
                              self.cdf, self.low, self.high)
        log_w = np.log(self.class_rows) + np.log(np.maximum(mass, 1e-300)).sum(axis=1)
        w = np.exp(log_w - log_w.max(axis=1, keepdims=True))
        return w / w.sum(axis=1, keepdims=True)

    def choose_splits(self, weights: np.ndarray, features: np.ndarray, low: np.ndarray, high: np.ndarray,
                      thresholds: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each node's best candidate and its children's class weights: best (A,), children (A, 2, C).

        `weights` (A, C) the nodes' class weights; the candidates' `features`, box intervals `low`, `high`,
        `thresholds` and `valid` (A, k). Best: the least weighted Gini impurity of the children's weights
        among the valid candidates (the first on a tie, candidate 0 where none is valid). Children's weights
        are normalized to sum 1 per child.
        """
        return _choose(np.ascontiguousarray(weights, np.float64), np.ascontiguousarray(features, np.int64),
                       np.ascontiguousarray(low, np.float64), np.ascontiguousarray(high, np.float64),
                       np.ascontiguousarray(thresholds, np.float64), np.ascontiguousarray(valid, np.bool_),
                       self.cdf, self.low, self.high)


@nb.njit(cache=True)
def _interval_mass(features, low, high, cdf, domain_low, domain_high):  # pragma: no cover - compiled
    """Each class's CDF mass in each (node, feature) interval: (A, d, C)."""
    n, d = features.shape
    classes = cdf.shape[1]
    out = np.empty((n, d, classes))
    for i in range(n):
        for j in range(d):
            f = features[i, j]
            for c in range(classes):
                a = _position(cdf[f, c], domain_low[f], domain_high[f], low[i, j])
                b = _position(cdf[f, c], domain_low[f], domain_high[f], high[i, j])
                out[i, j, c] = b - a
    return out


@nb.njit(cache=True)
def _choose(weights, features, low, high, thresholds, valid, cdf, domain_low,
            domain_high):  # pragma: no cover - compiled
    """`ClassMarginals.choose_splits` per node: sum_c w_c^2 / sum_c w_c over children, the largest wins."""
    n, k = features.shape
    classes = weights.shape[1]
    best = np.zeros(n, np.int64)
    children = np.empty((n, 2, classes))
    left = np.empty(classes)
    right = np.empty(classes)
    for i in range(n):
        top = -1.0
        for j in range(k):
            if not valid[i, j]:
                continue
            f = features[i, j]
            score = 0.0
            sl = 0.0
            sr = 0.0
            ql = 0.0
            qr = 0.0
            for c in range(classes):
                wl = weights[i, c] * _left_share(cdf[f, c], domain_low[f], domain_high[f], low[i, j],
                                                 thresholds[i, j], high[i, j])
                wr = weights[i, c] - wl
                sl += wl
                sr += wr
                ql += wl * wl
                qr += wr * wr
            if sl > 0:
                score += ql / sl
            if sr > 0:
                score += qr / sr
            if score > top:
                top = score
                best[i] = j
        j = best[i]
        f = features[i, j]
        sl = 0.0
        sr = 0.0
        for c in range(classes):
            share = _left_share(cdf[f, c], domain_low[f], domain_high[f], low[i, j], thresholds[i, j],
                                high[i, j]) if valid[i, j] else 0.5
            left[c] = weights[i, c] * share
            right[c] = weights[i, c] - left[c]
            sl += left[c]
            sr += right[c]
        for c in range(classes):
            children[i, 0, c] = left[c] / sl if sl > 0 else 1.0 / classes
            children[i, 1, c] = right[c] / sr if sr > 0 else 1.0 / classes
    return best, children


@nb.njit(cache=True)
def _left_share(cdf, domain_low, domain_high, low, threshold, high):  # pragma: no cover - compiled
    """The share of a class's CDF mass in [low, high] that lies below `threshold` (0.5 when there is none)."""
    a = _position(cdf, domain_low, domain_high, low)
    t = _position(cdf, domain_low, domain_high, threshold)
    b = _position(cdf, domain_low, domain_high, high)
    return (t - a) / (b - a) if b > a else 0.5
