"""CPU seconds of PPD-ERT secagg-dp against plain secagg (domain thresholds), fits alternated in one process.

The issue #31 target is secagg-dp at most 2x plain. Process CPU seconds (`time.process_time`) rather than
wall-clock, since the machine is shared; after one warm-up fit of each mode (imports, compiled kernels),
every secagg-dp cache is cleared before each fit, so each pays its plan's calibration, as an agent process
does once per plan. Prints the medians and their ratio to plain:

    .venv/bin/python -m benchmarks.time_secagg_dp --table letter --epsilons 1,4 --rounds 3
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.bench_dp import LABELS, fet
from fedcore.data.split import split_horizontal
from fedcore.privacy import accounting, discrete_gaussian, distributed
from fedcore.simulation import declared_ranges, split_train_test


def clear_caches() -> None:
    """Forget every cached plan, table and accountant result of secagg-dp."""
    for module in (distributed, accounting, discrete_gaussian):
        for value in vars(module).values():
            if hasattr(value, "cache_clear"):
                value.cache_clear()


def main() -> None:
    """Time plain and secagg-dp fits on one table, alternated; print medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path,
                        default=Path(__file__).resolve().parents[2] / "shared" / "datasets")
    parser.add_argument("--table", default="letter", choices=sorted(LABELS))
    parser.add_argument("--epsilons", default="1,4")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    table = pd.read_parquet(args.data_dir / f"{args.table}.parquet")
    label = LABELS[args.table]
    train, test = split_train_test(table, label, "classification", 0.2, 0)
    ranges = declared_ranges(table, label)
    parties = split_horizontal(train, 3, label=label, seed=0)
    params = {"n_estimators": 50, "max_depth": 8, "max_features": "sqrt", "random_state": 0}
    modes = [("plain", {"mode": "secagg", "thresholds": "domain"})] + [
        (f"secagg-dp {e:g}", {"mode": "secagg-dp", "epsilon": e, "delta": 1e-6})
        for e in (float(text) for text in args.epsilons.split(","))]
    for _, privacy in modes:
        fet(privacy, parties, test, label, params, ranges, "ppd-ert")
    seconds: dict[str, list[float]] = {name: [] for name, _ in modes}
    for _ in range(args.rounds):
        for name, privacy in modes:
            clear_caches()
            started = time.process_time()
            fet(privacy, parties, test, label, params, ranges, "ppd-ert")
            seconds[name].append(time.process_time() - started)
    plain = float(np.median(seconds["plain"]))
    for name, values in seconds.items():
        median = float(np.median(values))
        print(f"{args.table} {name}: CPU s {[round(v, 3) for v in values]}, median {median:.3f}, "
              f"{median / plain:.2f}x plain")


if __name__ == "__main__":
    main()
