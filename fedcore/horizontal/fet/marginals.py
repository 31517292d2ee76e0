"""FET-GDP's thresholds from DP marginal histograms: candidates where the rows are, paid once from the budget.

Uniform thresholds in a feature's declared domain waste most splits on skewed columns (spambase's hold most
rows near 0 of ranges in the thousands). Under gdp each party therefore releases, once at hello, one
Gaussian-noised histogram of every feature over `bins` equal cells of its declared domain. One row sits in
one cell of each of the d features, so the release has L2 sensitivity sqrt(d); the plan charges it as
`marginal_releases` of its releases (`fedcore/horizontal/plan.py`), about a tenth of the budget. The master
sums the parties' histograms into one noisy CDF per feature (post-processing) and places each candidate's
seed-shared uniform by it: the threshold is the CDF's inverse at a uniform point between the CDF's values at
the node's box ends, so candidates follow the rows' marginal distribution within the node's box.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

MARGINAL_BINS = 64
"""Cells per feature of the marginal histograms (measured on spambase: 16 and 256 did worse than 64)."""
MAX_MARGINAL_BINS = 4096
"""The most cells a party histograms a feature into (a master asking more is refused: memory, not privacy)."""
MARGINAL_SHARE = 0.1
"""About this share of the plan's releases (so of its budget) pays for the marginal histograms."""
MASS_FLOOR = 0.01
"""Every cell keeps at least this share of a cell's mean mass, so that any point of the domain can still
become a threshold and the CDF is strictly increasing."""


def marginal_releases(tree_releases: int, share: float = MARGINAL_SHARE) -> int:
    """The releases the marginal histograms are charged as, so that they take about `share` of the plan."""
    return max(1, math.ceil(share * tree_releases / (1 - share)))


def histogram_counts(X: np.ndarray, low: np.ndarray, high: np.ndarray, bins: int,
                     labels: np.ndarray | None = None, n_classes: int = 0) -> np.ndarray:
    """Rows per cell of each feature's `bins` equal cells of [low, high]: (d, bins) int64.

    With `labels` (class codes 0 .. n_classes - 1), rows per cell and class: (d, bins, n_classes) (plan
    marginals' class-conditional histograms, `fet/class_marginals.py`). Values outside the domain count in its
    end cells; a missing value (NaN) counts in none, so one row is in at most one cell per feature.
    """
    d = X.shape[1]
    classes = max(n_classes, 1) if labels is not None else 1
    out = np.zeros((d, bins * classes), dtype=np.int64)
    codes = np.zeros(len(X), np.int64) if labels is None else np.asarray(labels, np.int64)
    for f in range(d):
        column = X[:, f]
        present = ~np.isnan(column)
        column = column[present]
        width = high[f] - low[f]
        if width > 0:
            cell = np.floor((column - low[f]) / width * bins)
            cell = np.clip(cell, 0, bins - 1).astype(np.int64)
        else:
            cell = np.zeros(len(column), dtype=np.int64)
        out[f] = np.bincount(cell * classes + codes[present], minlength=bins * classes)
    return out if labels is None else out.reshape(d, bins, classes)


class MarginalQuantiles:
    """Each feature's noisy CDF over its declared domain, from the parties' summed noisy histograms."""

    def __init__(self, histograms: np.ndarray, low: np.ndarray, high: np.ndarray) -> None:
        """`histograms` (d, bins): the noisy counts summed over the parties; `low`, `high`: the domains."""
        mass = np.maximum(histograms, 0.0)
        floor = MASS_FLOOR * np.maximum(mass.sum(axis=1, keepdims=True), 1.0) / mass.shape[1]
        mass = mass + floor
        cdf = np.concatenate([np.zeros((len(mass), 1)), np.cumsum(mass, axis=1)], axis=1)
        self.cdf = cdf / cdf[:, -1:]
        self.low = np.asarray(low, np.float64)
        self.high = np.asarray(high, np.float64)
        self.bins = mass.shape[1]
        # each feature's cell edges, the values the CDF is inverted to
        self.edges = np.array([np.linspace(lo, hi, self.bins + 1) for lo, hi in zip(self.low, self.high,
                                                                                   strict=True)])

    def warp(self, features: np.ndarray, low: np.ndarray, high: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Uniforms in [0, 1) of the box spans [low, high] placing each threshold by its feature's CDF.

        The threshold is F^-1(F(low) + u (F(high) - F(low))), returned as its share of the span, so that
        `span_thresholds` keeps deciding what is usable. Spans that are a point (or not finite) keep `u`.
        """
        def flat(a: np.ndarray, dtype: type = np.float64) -> np.ndarray:
            return np.ascontiguousarray(np.broadcast_to(a, u.shape), dtype=dtype).ravel()

        return _warp(flat(features, np.int64), flat(low), flat(high), flat(u), self.cdf, self.edges,
                     self.low, self.high).reshape(u.shape)


@nb.njit(cache=True)
def _position(cdf, domain_low, domain_high, x):  # pragma: no cover - compiled
    """The CDF `cdf` of a feature of domain [low, high] at `x`: piecewise linear over the cells."""
    bins = len(cdf) - 1
    width = domain_high - domain_low
    cells = (x - domain_low) / width if width > 0 else 0.0
    cells = cells * bins
    cells = cells if cells > 0.0 or cells != cells else 0.0  # np.clip(cells, 0, bins)
    cells = cells if cells < bins or cells != cells else float(bins)
    i = min(int(cells), bins - 1)
    return cdf[i] + (cells - i) * (cdf[i + 1] - cdf[i])


@nb.njit(cache=True)
def _warp(features, low, high, u, cdf, edges, domain_low, domain_high):  # pragma: no cover - compiled
    """`MarginalQuantiles.warp` per candidate, with numpy's operations in numpy's order (bit for bit)."""
    out = np.empty(len(u))
    for i in range(len(u)):
        f = features[i]
        start = _position(cdf[f], domain_low[f], domain_high[f], low[i])
        q = start + u[i] * (_position(cdf[f], domain_low[f], domain_high[f], high[i]) - start)
        span = high[i] - low[i]
        share = (_inverse(q, cdf[f], edges[f]) - low[i]) / (span if span > 0 else 1.0)
        if span > 0 and np.isfinite(share):
            out[i] = min(share, 1.0) if share > 0.0 else 0.0  # np.clip(share, 0, 1)
        else:
            out[i] = u[i]
    return out


@nb.njit(cache=True)
def _inverse(x, xp, fp):  # pragma: no cover - compiled
    """np.interp(x, xp, fp) of one point, computed as numpy's interp computes it.

    The cell j with xp[j] <= x < xp[j + 1] (the CDF is strictly increasing), then the slope from j and,
    if that gives NaN, from j + 1; below / above xp its first / last value, at a knot its value.
    """
    n = len(xp)
    if x != x:
        return x
    if x < xp[0]:
        return fp[0]
    if x > xp[n - 1]:
        return fp[n - 1]
    lo, hi = 0, n - 1  # xp[lo] <= x, and x < xp[hi] unless x is the last knot
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if xp[mid] <= x:
            lo = mid
        else:
            hi = mid
    j = n - 1 if x >= xp[n - 1] else lo
    if j == n - 1 or xp[j] == x:
        return fp[j]
    slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j])
    value = slope * (x - xp[j]) + fp[j]
    if value != value:
        value = slope * (x - xp[j + 1]) + fp[j + 1]
        if value != value and fp[j] == fp[j + 1]:
            value = fp[j]
    return value
