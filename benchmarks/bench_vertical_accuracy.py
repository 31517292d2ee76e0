"""Accuracy of vertical Federated Forest against scikit-learn's RandomForest, same hyper-parameters.

For each dataset and seed: stratified 80/20 split, Federated Forest with 2 and 3 parties (100 trees,
max_features sqrt, bootstrap) and RandomForestClassifier with the same settings on the pooled table.
Prints a Markdown table of mean test accuracy over the seeds, with the Federated Forest paper's
Table 3 figures beside. The UCI tables are read from --data-dir (default ../shared/datasets) when
present; waveform-21, breast_cancer and digits need nothing.

    .venv/bin/python -m benchmarks.bench_vertical_accuracy [--seeds 5] [--trees 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.datasets import load_breast_cancer, load_digits

from benchmarks.markdown import markdown_table
from fedcore.data.datasets import make_waveform
from fedcore.data.split import split_vertical
from fedcore.metrics import metrics
from fedcore.simulation import reference_forest, split_train_test
from fedcore.vertical.estimators import FederatedForestClassifier

PAPER = {  # Liu et al., Federated Forest, Table 3 (2 parties): (NonFF, FF)
    "spambase": (0.943, 0.928),
    "ionosphere": (0.908, 0.896),
    "waveform-21": (0.826, 0.822),
}


def datasets(data_dir: Path) -> dict[str, tuple[pd.DataFrame, str]]:
    """Name -> (table, label column); UCI tables only where their file exists."""
    out: dict[str, tuple[pd.DataFrame, str]] = {}
    for name, label in (("spambase", "type"), ("ionosphere", "Class"), ("satellite", "classes")):
        path = data_dir / f"{name}.parquet"
        if path.exists():
            out[name] = (pd.read_parquet(path), label)
    out["waveform-21"] = (make_waveform(5000, random_state=0), "class")
    out["breast_cancer"] = (load_breast_cancer(as_frame=True).frame, "target")
    digits = load_digits(as_frame=True).frame
    out["digits"] = (digits, "target")
    return out


def run_one(table: pd.DataFrame, label: str, seed: int, trees: int, party_counts: list[int]) -> dict:
    """Accuracy of the reference and of each party count on one seeded split."""
    train, test = split_train_test(table, label, "classification", 0.2, seed)
    params = {"n_estimators": trees, "max_depth": None, "max_features": "sqrt", "random_state": seed}
    result = {"rf": reference_forest("classification", train, test, label, params)["metrics"]["accuracy"]}
    features = [c for c in table.columns if c != label]
    for m in party_counts:
        parties = split_vertical(train, m, label=label, seed=seed)
        columns = [[c for c in p.columns if c != label] for p in parties]
        model = FederatedForestClassifier(n_estimators=trees, max_features="sqrt", random_state=seed)
        started = time.perf_counter()
        model.fit(parties, label=label)
        fit_s = time.perf_counter() - started
        predicted = model.predict([test[c] for c in columns])
        result[f"ff{m}"] = metrics("classification", test[label].to_numpy(), predicted)["accuracy"]
        result[f"ff{m}_fit_s"] = fit_s
    assert len(features) >= max(party_counts)
    return result


def main() -> None:
    """Run every dataset over the seeds and print the accuracy table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path,
                        default=Path(__file__).resolve().parents[2] / "shared" / "datasets")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--parties", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--json", type=Path, help="also write the per-seed results here")
    args = parser.parse_args()

    rows, raw = [], {}
    for name, (table, label) in datasets(args.data_dir).items():
        runs = [run_one(table, label, seed, args.trees, args.parties) for seed in range(args.seeds)]
        raw[name] = runs
        mean = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
        row = {"dataset": name, "rows x cols": f"{table.shape[0]} x {table.shape[1] - 1}", "RF": mean["rf"]}
        for m in args.parties:
            row[f"FF M={m}"] = mean[f"ff{m}"]
            row[f"FF M={m} - RF (pp)"] = 100 * (mean[f"ff{m}"] - mean["rf"])
        paper = PAPER.get(name)
        row["paper NonFF / FF"] = f"{paper[0]:.3f} / {paper[1]:.3f}" if paper else ""
        rows.append(row)
        print(f"{name}: " + ", ".join(f"{k}={v:.4f}" for k, v in mean.items()), flush=True)

    print(f"\nMachine: {platform.processor() or platform.machine()}, Python {platform.python_version()}; "
          f"{args.seeds} seeds, {args.trees} trees, max_features sqrt, bootstrap, unlimited depth\n")
    print(markdown_table(rows))
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
