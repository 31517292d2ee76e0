"""Noise-aware estimates for FET with global differential privacy.

What the master makes of the parties' Gaussian-noised branch statistics. All of it is post-processing of the
same answers: no query is added and none spends more budget.

Each party adds Gaussian noise of standard deviation sigma to every count it sends, sigma calibrated to the
model's budget (`horizontal/plan.py`), so one class count summed over M parties has noise variance M sigma^2
(`count_variance`). Each party states its sigma in its hello reply: the mechanism's parameters are public,
only the noise is secret. The master refuses a sigma other than the agreed plan's, and uses only that one.

Read as exact counts, the noise ruins deep nodes. Noisy counts are never zero, so no node is ever pure.
Clamping the many empty classes at 0 inflates every node by about C x 0.4 noise scales. The trees then
split down to single rows whose leaves are mostly noise: on a 26-class table of 16,000 rows, 1.6 million
nodes and 35 pp below Extra-Trees. The estimates here:

1. **Node statistics from every measurement** (`combined_node_stats`). The parent's chosen branch
   measures a node's class counts once, and each of its own k candidates measures them again (left +
   right: twice the variance). Their inverse-variance weighted mean has (k + 2) / 2 times less variance.
2. **Sizes without clamping bias** (`unbiased_sizes`). Branch and node sizes are the sum of the noisy
   class counts, not of the counts clamped at 0: unbiased (only the total is clamped at 0, which matters
   for nodes within the noise), with variance C M sigma^2.
3. **Proportions on the simplex** (`simplex_proportions`). The noisy class counts are projected onto
   {c >= 0, sum c = n} (Euclidean). This zeroes the classes whose counts are within the noise, where
   clamping kept their positive noise.
4. **Hierarchical shrinkage** (`shrunk_proportions`). A node's proportions are pulled towards its
   parent's by a few pseudo-rows, proportional to the noise on its size. Nodes of many rows keep their
   own proportions; leaves of a handful of rows, which the noise swamps, borrow their parent's.

A size floor below which nodes stop splitting was tried and measured: it loses more accuracy (coarser
leaves) than it saves in noise. See docs/benchmarks.md.
"""

from __future__ import annotations

import math

import numpy as np

from fedcore.privacy.nnls import simplex_projection


def count_variance(sigmas: list[float]) -> float:
    """Noise variance of one count summed over the parties: the sum of their sigma^2."""
    return math.fsum(sigma * sigma for sigma in sigmas)


def unbiased_sizes(branch: np.ndarray, task: str) -> np.ndarray:
    """Sizes from noisy statistics (..., S), e.g. of branches (A, k, 2, S) or nodes (A, S).

    The sum of the class counts, not of the counts clamped at 0 (classification), or the count statistic
    (regression); at least 0.
    """
    if task == "regression":
        return np.maximum(branch[..., 0], 0.0)
    return np.maximum(branch.sum(axis=-1), 0.0)


def combined_node_stats(branch: np.ndarray, parent_stats: np.ndarray | None) -> np.ndarray:
    """Each open node's statistics (A, S).

    The inverse-variance weighted mean of its parent's measurement (weight 2: one noisy vector) and its k
    candidates' left + right sums (weight 1 each: two noisy vectors). Roots have no parent measurement.
    """
    candidates = branch.sum(axis=2)  # (A, k, S): every candidate's two branches add up to the node
    total = candidates.sum(axis=1)
    weight = candidates.shape[1]
    if parent_stats is not None:
        total = total + 2.0 * parent_stats
        weight += 2
    return total / weight


def simplex_proportions(stats: np.ndarray) -> np.ndarray:
    """Class proportions (..., C) from noisy counts.

    The Euclidean projection of the counts onto {c >= 0, sum c = n}, n the (unclamped) sum, divided by n;
    uniform where n <= 0.
    """
    n = stats.sum(axis=-1, keepdims=True)
    projected = simplex_projection(stats, np.maximum(n, 0.0))
    positive = n > 0
    return np.where(positive, projected / np.where(positive, n, 1.0), 1.0 / stats.shape[-1])


SHRINKAGE = 0.25
"""Pseudo-rows of the parent's proportions a node's own carry, per standard deviation of the noise on its
size."""


def shrunk_proportions(stats: np.ndarray, parent_values: np.ndarray | None, variance: float) -> np.ndarray:
    """A node's class proportions from noisy counts.

    Projected onto the simplex (`simplex_proportions`), then shrunk towards its parent's proportions with
    alpha = SHRINKAGE x sqrt(C x variance) pseudo-rows: (n p + alpha p_parent) / (n + alpha), n the node's
    estimated size. Hierarchical shrinkage: nodes of many rows keep their own proportions, nodes within the
    noise borrow their parent's.
    """
    own = simplex_proportions(stats)
    if parent_values is None:
        return own
    n = np.maximum(stats.sum(axis=-1, keepdims=True), 0.0)
    alpha = SHRINKAGE * math.sqrt(stats.shape[-1] * variance)
    weight = n + alpha
    return np.where(weight > 0, (n * own + alpha * parent_values) / np.where(weight > 0, weight, 1.0),
                    parent_values)

