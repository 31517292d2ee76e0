"""Where FET-LDP's accuracy goes (issue #31): the trees' structure, or the noise in their leaves.

Centralized and in scikit-learn, with each training row's label randomized once as FET-LDP's `auto` does
(k-RR or OUE at --epsilon, by variance): the report bits of every row are the targets.
* "true-label structure": ExtraTrees grown on the true labels (what no LDP run can have), every leaf then
  filled with the mean report bits of its rows: the accuracy left when only the leaves are noisy;
* "grown on the reports": ExtraTreesRegressor on the report bits at each --leaf-sizes min_samples_leaf, the
  leaves read three ways: mean bits (linear, the argmax of the debiased counts), their projection onto the
  simplex (FET-LDP's estimate), a majority vote of the trees' projected leaves.
Compare with bench_dp's FET-LDP row on the same table and split (seed 0).

    .venv/bin/python -m benchmarks.ldp_leaves --table letter --epsilon 2 [--leaf-sizes 1,5,10,20]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.bench_dp import LABELS
from fedcore.privacy.nnls import simplex_projection
from fedcore.simulation import split_train_test


def reports(y: np.ndarray, n_classes: int, epsilon: float,
            rng: np.random.Generator) -> tuple[np.ndarray, float, float]:
    """Each row's report bits (n, C) under `auto` at epsilon, and the bit probabilities (p own, q other)."""
    e = math.exp(epsilon)
    if n_classes - 2 < 3 * e:  # k-RR
        keep = e / (e + n_classes - 1)
        flipped = (y + rng.integers(1, n_classes, len(y))) % n_classes  # another class, uniformly
        reported = np.where(rng.random(len(y)) < keep, y, flipped)
        return np.eye(n_classes)[reported], keep, (1 - keep) / (n_classes - 1)
    other = 1 / (e + 1)  # OUE
    bits = rng.random((len(y), n_classes)) < np.where(np.eye(n_classes)[y] == 1, 0.5, other)
    return bits.astype(np.float64), 0.5, other


def leaf_scores(train_leaves: np.ndarray, test_leaves: np.ndarray, bits: np.ndarray, own: float,
                other: float) -> dict[str, np.ndarray]:
    """Test scores (m, C) summed over trees: mean bits, projected leaves, and votes of projected leaves."""
    m, n_classes = len(test_leaves), bits.shape[1]
    out = {name: np.zeros((m, n_classes)) for name in ("linear", "projected", "vote")}
    for t in range(train_leaves.shape[1]):
        ids, where = np.unique(train_leaves[:, t], return_inverse=True)
        sums = np.zeros((len(ids), n_classes))
        np.add.at(sums, where, bits)
        mean = (sums / np.bincount(where)[:, None])[np.searchsorted(ids, test_leaves[:, t])]
        projected = simplex_projection((mean - other) / (own - other), np.ones((m, 1)))
        out["linear"] += mean
        out["projected"] += projected
        out["vote"][np.arange(m), projected.argmax(axis=1)] += 1
    return out


def main() -> None:
    """Print the accuracy of each structure and leaf estimate."""
    from sklearn.ensemble import ExtraTreesClassifier, ExtraTreesRegressor

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path,
                        default=Path(__file__).resolve().parents[2] / "shared" / "datasets")
    parser.add_argument("--table", default="letter")
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--trees", type=int, default=50)
    parser.add_argument("--leaf-sizes", default="1,5,10,20")
    args = parser.parse_args()
    table = pd.read_parquet(args.data_dir / f"{args.table}.parquet")
    label = LABELS[args.table]
    train, test = split_train_test(table, label, "classification", 0.2, 0)
    features = [c for c in table.columns if c != label]
    x, x_test = train[features].to_numpy(np.float64), test[features].to_numpy(np.float64)
    code = {c: i for i, c in enumerate(sorted(table[label].unique()))}
    y, y_test = train[label].map(code).to_numpy(), test[label].map(code).to_numpy()
    bits, own, other = reports(y, len(code), args.epsilon, np.random.default_rng(1))
    true = ExtraTreesClassifier(args.trees, random_state=0, n_jobs=1).fit(x, y)
    print(f"{args.table}, epsilon {args.epsilon:g}: ExtraTrees on true labels "
          f"{(true.predict(x_test) == y_test).mean():.4f}")
    scores = leaf_scores(true.apply(x), true.apply(x_test), bits, own, other)
    print("true-label structure, noisy leaves: "
          + ", ".join(f"{k} {(v.argmax(axis=1) == y_test).mean():.4f}" for k, v in scores.items()))
    for size in (int(s) for s in args.leaf_sizes.split(",")):
        grown = ExtraTreesRegressor(args.trees, random_state=0, n_jobs=1, max_features="sqrt",
                                    min_samples_leaf=size).fit(x, bits)
        scores = leaf_scores(grown.apply(x), grown.apply(x_test), bits, own, other)
        print(f"grown on the reports, min_samples_leaf {size}: "
              + ", ".join(f"{k} {(v.argmax(axis=1) == y_test).mean():.4f}" for k, v in scores.items()))


if __name__ == "__main__":
    main()
