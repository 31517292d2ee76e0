"""FET-GDP's budget on the leaves (issue #31): random structure and one noisy leaf release per tree.

A centralized prototype of a plan FET-GDP does not run: each tree's splits are data-independent (a random
feature per node, its threshold the seed's uniform placed by the DP marginal CDFs in the node's box, as
FET-GDP places its candidates), so the structure costs no budget; the only releases are the marginal
histograms (a tenth of the plan, as FET-GDP's) and, per tree, its leaves' class counts (one row is in one leaf
of one class: L2 sensitivity 1, parallel over the disjoint leaves), with the Gaussian noise of --parties
parties summed. The noise is calibrated by dp-accounting (`GaussianPlan`), or with --subsample q by its
`PoissonSampledDpEvent` over the trees (each tree counts each row with probability q). The forest's
prediction is read two ways: the sum of the trees' noisy leaf counts (a soft vote), and the mean of their
clamped leaf proportions. Compare with bench_dp's FET-GDP rows on the same table and split (seed 0).

    .venv/bin/python -m benchmarks.gdp_leaves --table letter --plans 50x8,100x12 [--epsilons 1,4]
        [--subsample 0.5]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.bench_dp import LABELS
from fedcore.horizontal.fet.marginals import (
    MARGINAL_BINS,
    MarginalQuantiles,
    histogram_counts,
    marginal_releases,
)
from fedcore.privacy.accounting import GaussianPlan
from fedcore.simulation import declared_ranges, split_train_test


def subsampled_multiplier(epsilon: float, delta: float, trees: int, marginals: int, q: float) -> float:
    """The noise multiplier z spending (epsilon, delta) over the marginals and the subsampled trees.

    `marginals` Gaussian releases of multiplier z, then `trees` ones, each of a Poisson sample at rate `q`.
    """
    from dp_accounting import dp_event, mechanism_calibration, pld

    def event(z: float) -> dp_event.DpEvent:
        subsampled = dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z))
        return dp_event.ComposedDpEvent([dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(z), marginals),
                                         dp_event.SelfComposedDpEvent(subsampled, trees)])

    return float(mechanism_calibration.calibrate_dp_mechanism(
        lambda: pld.PLDAccountant(value_discretization_interval=1e-2), event, epsilon, delta,
        mechanism_calibration.LowerEndpointAndGuess(0.1, 5.0), tol=1e-3))


def forest(X: np.ndarray, y: np.ndarray, X_test: np.ndarray, n_classes: int, low: np.ndarray,
           high: np.ndarray, trees: int, depth: int, epsilon: float,
           args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    """Test rows' (summed noisy counts, mean clamped proportions), each (rows, classes)."""
    rng = np.random.default_rng(args.seed + 100)
    d = X.shape[1]
    marginals = marginal_releases(trees)
    plan = GaussianPlan(epsilon, args.delta, releases=trees + marginals, sensitivity=1.0)
    if args.subsample < 1:
        z = subsampled_multiplier(epsilon, args.delta, trees, marginals, args.subsample)
        sigma, marginal_sigma = z, z * math.sqrt(d / marginals)
    else:
        sigma, marginal_sigma = plan.sigma, plan.sigma_for(math.sqrt(d), marginals)
    spread = math.sqrt(args.parties)  # every party adds its own noise to its share of the counts
    histograms = histogram_counts(X, low, high, MARGINAL_BINS).astype(np.float64)
    noise = rng.standard_normal(histograms.shape) * marginal_sigma * spread
    quantiles = MarginalQuantiles(histograms + noise, low, high)
    votes = np.zeros((len(X_test), n_classes))
    proportions = np.zeros((len(X_test), n_classes))
    for _ in range(trees):
        box_low, box_high = low[None, :].copy(), high[None, :].copy()
        node, node_test = np.zeros(len(X), np.int64), np.zeros(len(X_test), np.int64)
        for level in range(depth):
            nodes = np.arange(2 ** level)
            feature = rng.integers(0, d, len(nodes))
            lo, hi = box_low[nodes, feature], box_high[nodes, feature]
            threshold = lo + quantiles.warp(feature, lo, hi, rng.random(len(nodes))) * (hi - lo)
            node = 2 * node + (X[np.arange(len(X)), feature[node]] > threshold[node])
            node_test = 2 * node_test + (X_test[np.arange(len(X_test)), feature[node_test]]
                                         > threshold[node_test])
            box_low, box_high = np.repeat(box_low, 2, axis=0), np.repeat(box_high, 2, axis=0)
            box_high[2 * nodes, feature] = threshold
            box_low[2 * nodes + 1, feature] = threshold
        kept = rng.random(len(X)) < args.subsample
        leaves = 2 ** depth
        counts = np.bincount(node[kept] * n_classes + y[kept], minlength=leaves * n_classes)
        noisy = counts.reshape(leaves, n_classes) + rng.standard_normal((leaves, n_classes)) * sigma * spread
        votes += noisy[node_test]
        clamped = np.maximum(noisy, 0.0)
        total = clamped.sum(axis=1, keepdims=True)
        shares = np.where(total > 0, clamped / np.where(total > 0, total, 1.0), 1.0 / n_classes)
        proportions += shares[node_test]
    return votes, proportions / trees


def main() -> None:
    """Print the accuracy of each plan and budget, read both ways."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path,
                        default=Path(__file__).resolve().parents[2] / "shared" / "datasets")
    parser.add_argument("--table", default="letter")
    parser.add_argument("--plans", default="50x8", help="trees x depth, comma-separated")
    parser.add_argument("--epsilons", default="1,4")
    parser.add_argument("--delta", type=float, default=1e-6)
    parser.add_argument("--parties", type=int, default=3)
    parser.add_argument("--subsample", type=float, default=1.0, help="Poisson rate per tree (1: none)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    table = pd.read_parquet(args.data_dir / f"{args.table}.parquet")
    label = LABELS[args.table]
    train, test = split_train_test(table, label, "classification", 0.2, args.seed)
    ranges = declared_ranges(table, label)
    features = [c for c in table.columns if c != label]
    classes = np.sort(table[label].unique())
    X, X_test = (part[features].to_numpy(np.float64) for part in (train, test))
    y, y_test = (np.searchsorted(classes, part[label].to_numpy()) for part in (train, test))
    low, high = (np.array([ranges[f][i] for f in features], np.float64) for i in (0, 1))
    for plan in args.plans.split(","):
        trees, depth = (int(v) for v in plan.split("x"))
        for epsilon in (float(e) for e in args.epsilons.split(",")):
            votes, proportions = forest(X, y, X_test, len(classes), low, high, trees, depth, epsilon, args)
            print(f"{args.table} {trees} x {depth}, epsilon {epsilon:g}, subsample {args.subsample:g}: "
                  f"summed counts {np.mean(votes.argmax(1) == y_test):.4f}, "
                  f"mean proportions {np.mean(proportions.argmax(1) == y_test):.4f}", flush=True)


if __name__ == "__main__":
    main()
