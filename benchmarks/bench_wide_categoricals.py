"""Wide categorical columns on small tables: vertical Federated Forest against scikit-learn's RandomForest.

Issue #34: a string column with many categories on few rows made the native categorical split (categories
ordered by their statistics, best prefix) overfit. The tables are built here, each with numeric features
and one wide categorical column whose categories have Zipf-like frequencies (a few large, many with a
handful of rows):
- `reg-signal`: 506 rows, 92 categories with a real effect each, regression (R^2);
- `reg-noise`: 506 rows, 92 categories with no effect at all (the column only invites overfitting);
- `clf-signal`: 800 rows, 60 categories shifting a binary label's log-odds (accuracy);
- `clf-noise`: 800 rows, 120 categories with no effect, binary label.
The references see the wide column one-hot encoded and as ordinal codes (scikit-learn's RandomForest, same
trees, max_features sqrt over its own columns); Federated Forest (2 parties) sees it as one categorical
column. Prints a Markdown table of mean test scores over the seeds, and the gap to the better reference.

    .venv/bin/python -m benchmarks.bench_wide_categoricals [--seeds 3] [--trees 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform

import numpy as np
import pandas as pd

from benchmarks.markdown import markdown_table
from fedcore.data.split import split_vertical
from fedcore.metrics import metrics
from fedcore.simulation import split_train_test
from fedcore.vertical.estimators import FederatedForestClassifier, FederatedForestRegressor

TABLES = {  # name: (rows, categories, task, the category column has an effect)
    "reg-signal": (506, 92, "regression", True),
    "reg-noise": (506, 92, "regression", False),
    "clf-signal": (800, 60, "classification", True),
    "clf-noise": (800, 120, "classification", False),
}
LABEL = "y"


def wide_table(rows: int, categories: int, task: str, signal: bool, seed: int) -> pd.DataFrame:
    """Eight numeric features (four with an effect) and one Zipf-distributed categorical column `town`."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 8))
    weights = 1.0 / np.arange(1, categories + 1) ** 1.1
    town = rng.choice(categories, size=rows, p=weights / weights.sum())
    effect = rng.normal(scale=1.0, size=categories) if signal else np.zeros(categories)
    score = x[:, 0] + 0.8 * x[:, 1] - 0.6 * x[:, 2] * x[:, 3] + effect[town]
    frame = pd.DataFrame(x, columns=[f"x{j}" for j in range(8)])
    frame["town"] = pd.Series([f"t{c:03d}" for c in town], dtype="object")
    if task == "regression":
        frame[LABEL] = score + rng.normal(scale=0.7, size=rows)
    else:
        frame[LABEL] = np.where(rng.random(rows) < 1 / (1 + np.exp(-1.5 * score)), "yes", "no")
    return frame


def _reference(task: str, train: pd.DataFrame, test: pd.DataFrame, encoding: str, trees: int,
               seed: int) -> float:
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

    train_x, test_x = train.drop(columns=[LABEL]), test.drop(columns=[LABEL])
    if encoding == "one-hot":
        both = pd.get_dummies(pd.concat([train_x, test_x]), columns=["town"], dtype=float)
    else:
        both = pd.concat([train_x, test_x])
        both["town"] = both["town"].astype("category").cat.codes.astype(float)
    train_x, test_x = both.iloc[:len(train_x)], both.iloc[len(train_x):]
    cls = RandomForestClassifier if task == "classification" else RandomForestRegressor
    model = cls(n_estimators=trees, max_features="sqrt", random_state=seed, n_jobs=-1)
    model.fit(train_x.to_numpy(), train[LABEL].to_numpy())
    return _score(task, test[LABEL].to_numpy(), model.predict(test_x.to_numpy()))


def _score(task: str, truth: np.ndarray, predicted: np.ndarray) -> float:
    return metrics(task, truth, predicted)["r2" if task == "regression" else "accuracy"]


def _federated(task: str, train: pd.DataFrame, test: pd.DataFrame, trees: int, seed: int) -> float:
    cls = FederatedForestClassifier if task == "classification" else FederatedForestRegressor
    parties = split_vertical(train, 2, label=LABEL, seed=seed)
    columns = [[c for c in p.columns if c != LABEL] for p in parties]
    model = cls(n_estimators=trees, max_features="sqrt", random_state=seed).fit(parties, label=LABEL)
    return _score(task, test[LABEL].to_numpy(), model.predict([test[c] for c in columns]))


def run(seeds: int, trees: int) -> list[dict]:
    """One row per table: mean scores over the seeds and the gap to the better reference (points)."""
    rows = []
    for name, (n_rows, n_categories, task, signal) in TABLES.items():
        scores: dict[str, list[float]] = {"one-hot": [], "ordinal": [], "federated": []}
        for seed in range(1, seeds + 1):
            table = wide_table(n_rows, n_categories, task, signal, seed)
            train, test = split_train_test(table, LABEL, task, 0.25, seed)
            for encoding in ("one-hot", "ordinal"):
                scores[encoding].append(_reference(task, train, test, encoding, trees, seed))
            scores["federated"].append(_federated(task, train, test, trees, seed))
        mean = {key: float(np.mean(values)) for key, values in scores.items()}
        best = max(mean["one-hot"], mean["ordinal"])
        rows.append({"table": name, "rows": n_rows, "categories": n_categories,
                     "metric": "R^2" if task == "regression" else "accuracy",
                     "RF one-hot": mean["one-hot"], "RF ordinal": mean["ordinal"],
                     "Federated Forest": mean["federated"],
                     "gap (points)": round(100 * (mean["federated"] - best), 2)})
    return rows


def main() -> None:
    """Print the table (and write JSON when asked)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args()
    rows = run(args.seeds, args.trees)
    print(f"machine: {platform.machine()}, {args.seeds} seeds, {args.trees} trees")
    print(markdown_table(rows))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=2)


if __name__ == "__main__":
    main()
