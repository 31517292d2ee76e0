"""Accuracy of vertical and horizontal boosting against XGBoost `hist` on the pooled rows (issues #32, #34).

Per table and seed: stratified 80/20 split; vertical boosting (3 parties, in-process), horizontal histogram
boosting (3 parties, iid rows, secure aggregation) and XGBoost `hist` pooled, all with the same rounds,
depth, learning rate, lambda, gamma, min_child_weight and bins. Classification tables report test accuracy,
the regression tables test RMSE. Target: within 0.5 pp of XGBoost (1% of RMSE).

    .venv/bin/python -m benchmarks.bench_boosting_accuracy [--seeds 3] [--rounds 100] [--depth 6]

Needs xgboost (`pip install -e '.[bench]'`). The UCI tables are read from --data-dir (default
../shared/datasets); friedman1 (scikit-learn's generator, 20,000 x 10, noise 1) and diabetes need nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.markdown import markdown_table
from benchmarks.xgboost_check import require_xgboost
from fedcore.data.split import split_horizontal, split_vertical
from fedcore.metrics import class_codes
from fedcore.simulation import split_train_test

CLASSIFICATION = (("spambase", "type"), ("satellite", "classes"), ("letter", "lettr"))


def tables(data_dir: Path) -> dict[str, tuple[pd.DataFrame, str, str]]:
    """Name -> (table, label, task): the UCI tables present in data_dir, then two regression tables."""
    from sklearn.datasets import load_diabetes, make_friedman1

    out: dict[str, tuple[pd.DataFrame, str, str]] = {}
    for name, label in CLASSIFICATION:
        path = data_dir / f"{name}.parquet"
        if path.exists():
            out[name] = (pd.read_parquet(path), label, "classification")
    X, y = make_friedman1(20_000, n_features=10, noise=1.0, random_state=0)
    friedman = pd.DataFrame(X, columns=[f"x{i}" for i in range(X.shape[1])]).assign(y=y)
    out["friedman1"] = (friedman, "y", "regression")
    out["diabetes"] = (load_diabetes(as_frame=True).frame, "target", "regression")
    return out


def xgboost_params(args: argparse.Namespace) -> dict:
    """XGBoost's names for the shared hyper-parameters."""
    return {"tree_method": "hist", "n_estimators": args.rounds, "max_depth": args.depth,
            "learning_rate": args.learning_rate, "reg_lambda": args.reg_lambda, "gamma": args.gamma,
            "min_child_weight": args.min_child_weight, "max_bin": args.max_bins, "n_jobs": 2,
            "random_state": 0}


def score(task: str, y: np.ndarray, predicted: np.ndarray) -> float:
    """Accuracy (classification) or RMSE (regression)."""
    if task == "classification":
        return float(np.mean(y == predicted))
    return float(np.sqrt(np.mean((np.asarray(y, float) - predicted) ** 2)))


def run_xgboost(task: str, train: pd.DataFrame, test: pd.DataFrame, label: str, args) -> float:
    """XGBoost hist on the pooled train rows: its test score."""
    import xgboost as xgb

    X, x_test = train.drop(columns=label).to_numpy(float), test.drop(columns=label).to_numpy(float)
    if task == "regression":
        model = xgb.XGBRegressor(**xgboost_params(args)).fit(X, train[label].to_numpy(float))
        return score(task, test[label].to_numpy(), model.predict(x_test).astype(float))
    classes = np.unique(train[label].to_numpy())
    model = xgb.XGBClassifier(**xgboost_params(args)).fit(X, class_codes(train[label].to_numpy(), classes))
    return score(task, test[label].to_numpy(), classes[model.predict(x_test)])


def engine_params(args: argparse.Namespace) -> dict:
    """The engine's (XGBoost's) names for the shared hyper-parameters."""
    return {"n_estimators": args.rounds, "max_depth": args.depth, "learning_rate": args.learning_rate,
            "reg_lambda": args.reg_lambda, "gamma": args.gamma, "min_child_weight": args.min_child_weight,
            "max_bins": args.max_bins, "random_state": 0}


def run_vertical(task: str, train: pd.DataFrame, test: pd.DataFrame, label: str, args) -> float:
    """Vertical boosting, 3 parties in-process: its test score."""
    from fedcore.vertical.boosting_estimators import FederatedBoostingClassifier, FederatedBoostingRegressor

    parties = split_vertical(train, 3, label=label, seed=0)
    columns = [[c for c in p.columns if c != label] for p in parties]
    estimator = FederatedBoostingClassifier if task == "classification" else FederatedBoostingRegressor
    model = estimator(**engine_params(args)).fit(parties, label=label)
    return score(task, test[label].to_numpy(), model.predict([test[c] for c in columns]))


def run_horizontal(task: str, train: pd.DataFrame, test: pd.DataFrame, label: str, args) -> float:
    """Horizontal histogram boosting under secure aggregation, 3 parties (iid rows): its test score."""
    from fedcore.horizontal.boosting import HorizontalBoostingClassifier, HorizontalBoostingRegressor

    parties = split_horizontal(train, 3, partition="iid", label=label, seed=0)
    estimator = HorizontalBoostingClassifier if task == "classification" else HorizontalBoostingRegressor
    params = {**engine_params(args), "max_bins": args.horizontal_bins or args.max_bins}
    model = estimator(**params, allow_data_ranges=True).fit(parties, label=label)
    return score(task, test[label].to_numpy(), model.predict(test.drop(columns=label)))


def main() -> None:
    """Every table over the seeds; print the Markdown table of docs/benchmarks.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path,
                        default=Path(__file__).resolve().parents[2] / "shared" / "datasets")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--learning-rate", type=float, default=0.3)
    parser.add_argument("--reg-lambda", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.0)
    parser.add_argument("--min-child-weight", type=float, default=1.0)
    parser.add_argument("--max-bins", type=int, default=255)
    parser.add_argument("--horizontal-bins", type=int, help="horizontal boosting's bins (default --max-bins)")
    parser.add_argument("--tables", nargs="*", help="only these tables")
    parser.add_argument("--skip-horizontal", action="store_true")
    args = parser.parse_args()

    require_xgboost()
    runs = {"XGBoost": run_xgboost, "vertical": run_vertical}
    if not args.skip_horizontal:
        runs["horizontal"] = run_horizontal
    rows = []
    for name, (table, label, task) in tables(args.data_dir).items():
        if args.tables and name not in args.tables:
            continue
        scores: dict[str, list[float]] = {run: [] for run in runs}
        started = time.perf_counter()
        for seed in range(args.seeds):
            train, test = split_train_test(table, label, task, 0.2, seed)
            for run, fit in runs.items():
                scores[run].append(fit(task, train, test, label, args))
        mean = {run: float(np.mean(values)) for run, values in scores.items()}
        row: dict = {"table": name, "rows x cols": f"{table.shape[0]} x {table.shape[1] - 1}",
                     "metric": "accuracy" if task == "classification" else "RMSE",
                     "XGBoost hist": mean["XGBoost"]}
        for run in runs:
            if run == "XGBoost":
                continue
            row[run] = mean[run]
            gap = mean[run] - mean["XGBoost"]
            row[f"{run} gap"] = (f"{100 * gap:+.2f} pp" if task == "classification"
                                 else f"{100 * gap / mean['XGBoost']:+.2f} %")
        rows.append(row)
        print(f"{name} ({time.perf_counter() - started:.0f} s): {scores}", flush=True)
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores; {args.seeds} seeds, "
          f"{args.rounds} rounds of depth {args.depth}, learning rate {args.learning_rate}, lambda "
          f"{args.reg_lambda}, gamma {args.gamma}, min_child_weight {args.min_child_weight}, {args.max_bins} "
          f"bins (horizontal {args.horizontal_bins or args.max_bins}, equal width over the data's ranges)\n")
    print(markdown_table(rows, digits=4))


if __name__ == "__main__":
    main()
