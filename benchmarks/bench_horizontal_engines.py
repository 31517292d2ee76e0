"""Every horizontal engine on one table, in one run, beside scikit-learn's ExtraTrees.

Training time and test accuracy of FET (plain, GDP, LDP) and PPD-ERT (secure aggregation; histogram and domain
thresholds), fully grown trees. Wall and process CPU seconds (all threads; a shared machine's load inflates
CPU time less than wall time).

Issue #12's targets: FET plain and PPD-ERT within 1.5x ExtraTrees(n_jobs=-1); FET-LDP and FET-GDP within
2x plain FET. Each engine is fitted `--repeat` times, the engines taking turns, and the median is kept;
ratios are medians of the per-round ratios (each round's fits ran back to back).

    .venv/bin/python -m benchmarks.bench_horizontal_engines --data letter.parquet --label lettr \
        [--parties 3] [--trees 50] [--repeat 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.markdown import markdown_table
from fedcore.data.io import read_table
from fedcore.data.split import split_horizontal
from fedcore.horizontal import FederatedExtraTreesClassifier, PPDERTClassifier
from fedcore.simulation import split_train_test


def engines(trees: int) -> dict:
    """Name -> a function making a fresh estimator (None: scikit-learn's ExtraTrees on the pooled rows)."""
    return {
        "ExtraTrees (sklearn, n_jobs=-1)": None,
        "FET": lambda: FederatedExtraTreesClassifier(n_estimators=trees, random_state=0),
        "PPD-ERT (secure aggregation, histogram thresholds)": lambda: PPDERTClassifier(
            n_estimators=trees, random_state=0, allow_data_ranges=True),
        "PPD-ERT (secure aggregation, domain thresholds)": lambda: PPDERTClassifier(
            n_estimators=trees, random_state=0, allow_data_ranges=True, thresholds="domain"),
        "FET-GDP (total epsilon 1, depth 8)": lambda: FederatedExtraTreesClassifier(
            n_estimators=trees, random_state=0, privacy="gdp", epsilon=1.0, max_depth=8,
            allow_data_ranges=True),
        "FET-LDP (Bloom, defaults)": lambda: FederatedExtraTreesClassifier(
            n_estimators=trees, random_state=0, privacy="ldp", allow_data_ranges=True),
    }


def main() -> None:
    """Fit every engine on `--data`, print time and accuracy beside ExtraTrees."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--label", required=True)
    parser.add_argument("--parties", type=int, default=3)
    parser.add_argument("--trees", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from sklearn.ensemble import ExtraTreesClassifier

    table = read_table(args.data)
    train, test = split_train_test(table, args.label, "classification", 0.2, seed=0)
    parties = split_horizontal(train, args.parties, seed=0)
    X, y = train.drop(columns=args.label).to_numpy(), train[args.label].to_numpy()
    X_test, y_test = test.drop(columns=args.label), test[args.label].to_numpy()
    makers = engines(args.trees)
    seconds: dict[str, list[float]] = {name: [] for name in makers}
    cpu: dict[str, list[float]] = {name: [] for name in makers}
    accuracy = {}
    for _ in range(args.repeat):
        for name, make in makers.items():
            if make is None:
                model = ExtraTreesClassifier(n_estimators=args.trees, n_jobs=-1, random_state=0)
                wall, busy = _timed(model.fit, X, y)
                accuracy[name] = float((model.predict(X_test.to_numpy()) == y_test).mean())
            else:
                model = make()
                wall, busy = _timed(model.fit, parties, label=args.label)
                accuracy[name] = float((model.predict(X_test) == y_test).mean())
            seconds[name].append(wall)
            cpu[name].append(busy)
            print(f"{name}: {wall:.2f} s, CPU {busy:.2f} s", flush=True)
    base = "ExtraTrees (sklearn, n_jobs=-1)"
    rows = []
    for name, times in seconds.items():
        rows.append({"engine": name, "accuracy": accuracy[name], "fit s (median)": float(np.median(times)),
                     "x ExtraTrees": _ratio(times, seconds[base]), "x FET": _ratio(times, seconds["FET"]),
                     "CPU s (median)": float(np.median(cpu[name])),
                     "CPU x ExtraTrees": _ratio(cpu[name], cpu[base]),
                     "CPU x FET": _ratio(cpu[name], cpu["FET"])})
    print(f"\n{platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; "
          f"{args.data.name}: {len(train)} training rows x {X.shape[1]} columns, {len(np.unique(y))} "
          f"classes, {args.parties} parties, {args.trees} trees, fully grown, {args.repeat} rounds\n")
    print(markdown_table(rows, digits=3))
    if args.json:
        args.json.write_text(json.dumps({"seconds": seconds, "cpu": cpu, "accuracy": accuracy}, indent=1))


def _timed(fit: Callable[..., object], *args: object, **kwargs: object) -> tuple[float, float]:
    """Wall and process CPU seconds of one fit."""
    wall, busy = time.perf_counter(), time.process_time()
    fit(*args, **kwargs)
    return time.perf_counter() - wall, time.process_time() - busy


def _ratio(times: list[float], base: list[float]) -> float:
    """Median of the per-round ratios (each round's fits ran back to back)."""
    return float(np.median(np.array(times) / np.array(base)))


if __name__ == "__main__":
    main()
