"""Training time and communication of the horizontal engines on 200k rows x 40 features.

For 2, 3, 5 and 9 parties: Federated Extra-Trees (plain), PPD-ERT without and with secure aggregation (the
masks' overhead), and scikit-learn's ExtraTrees on the pooled rows in the same run as the reference.

Rows are dealt iid; every run uses the in-process transport, so bytes are the real Arrow message sizes
and the time is compute plus serialisation (no network).

    .venv/bin/python -m benchmarks.bench_horizontal_speed [--rows 200000] [--features 40] [--trees 100]
        [--depth 10] [--parties 2 3 5 9] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import pandas as pd

from benchmarks.markdown import markdown_table
from fedcore.data.split import split_horizontal
from fedcore.horizontal import FederatedExtraTreesClassifier, PPDERTClassifier


def make_table(rows: int, features: int, seed: int = 0) -> pd.DataFrame:
    """A classification table (sklearn's make_classification: informative, redundant and noise columns)."""
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=rows, n_features=features, n_informative=features // 2,
                               n_redundant=features // 4, n_classes=3, random_state=seed)
    frame = pd.DataFrame(x, columns=[f"f{i:02d}" for i in range(features)])
    frame["y"] = y
    return frame


def timed_fit(model, parties: list[pd.DataFrame]) -> dict:
    """Fit once; seconds, rounds, bytes and bytes per round."""
    started = time.perf_counter()
    model.fit(parties, label="y")
    seconds = time.perf_counter() - started
    stats = model.communication_
    return {"seconds": seconds, "rounds": stats["rounds"], "bytes": stats["bytes"],
            "mb_per_round": stats["bytes"] / max(stats["rounds"], 1) / 1e6}


def reference_seconds(table: pd.DataFrame, trees: int, depth: int) -> float:
    """Seconds scikit-learn's ExtraTrees takes to fit the pooled table on all cores."""
    from sklearn.ensemble import ExtraTreesClassifier

    model = ExtraTreesClassifier(n_estimators=trees, max_depth=depth, max_features="sqrt",
                                 random_state=0, n_jobs=-1)
    started = time.perf_counter()
    model.fit(table.drop(columns=["y"]).to_numpy(), table["y"].to_numpy())
    return time.perf_counter() - started


def main() -> None:
    """Time every engine for each party count and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--features", type=int, default=40)
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--depth", type=int, default=10)
    parser.add_argument("--parties", type=int, nargs="+", default=[2, 3, 5, 9])
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args()

    table = make_table(args.rows, args.features)
    ranges = {c: (float(table[c].min()) - 1.0, float(table[c].max()) + 1.0)
              for c in table.columns if c != "y"}
    options = {"n_estimators": args.trees, "max_depth": args.depth, "random_state": 0}
    sklearn_s = reference_seconds(table, args.trees, args.depth)
    print(f"sklearn ExtraTrees (pooled, n_jobs=-1): {sklearn_s:.2f} s", flush=True)
    rows, raw = [], {"sklearn_s": sklearn_s, "runs": {}}
    for m in args.parties:
        parties = split_horizontal(table, m, seed=0)
        fet = timed_fit(FederatedExtraTreesClassifier(**options), parties)
        plain = timed_fit(PPDERTClassifier(**options, feature_ranges=ranges, secure_aggregation=False),
                          parties)
        secure = timed_fit(PPDERTClassifier(**options, feature_ranges=ranges), parties)
        raw["runs"][m] = {"fet": fet, "ppdert_plain": plain, "ppdert_secagg": secure}
        rows.append({
            "parties": m,
            "FET s": fet["seconds"], "FET rounds": fet["rounds"], "FET MB/round": fet["mb_per_round"],
            "PPD-ERT plain s": plain["seconds"], "PPD-ERT secagg s": secure["seconds"],
            "secagg overhead": f"{100 * (secure['seconds'] / plain['seconds'] - 1):+.0f}%",
            "PPD-ERT rounds": secure["rounds"], "secagg MB/round": secure["mb_per_round"],
            "FET / sklearn": fet["seconds"] / sklearn_s,
            "PPD-ERT secagg / sklearn": secure["seconds"] / sklearn_s,
        })
        print(rows[-1], flush=True)
    print(f"\nMachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; {args.rows} rows x {args.features} features, 3 classes, "
          f"{args.trees} trees, depth {args.depth}, max_features sqrt; sklearn ExtraTrees (pooled, "
          f"n_jobs=-1) {sklearn_s:.2f} s\n")
    print(markdown_table(rows, digits=2))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(raw, handle, indent=1)


if __name__ == "__main__":
    main()
