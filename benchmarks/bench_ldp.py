"""FET with local DP against plain FET and scikit-learn's ExtraTrees, in one run.

Training time (and the share spent estimating class counts) and accuracy, on a many-class table such as UCI
letter.

The issue #11 target: FET-LDP training within 2x plain FET, accuracy within 1.5 pp of ExtraTrees; issue #31's:
at per-row epsilon 4 within 1.5 pp on every table, at 2 within 1.5 pp (4 pp on letter). The Bloom mechanism
runs at its defaults (the paper's), the default mechanism "auto" (GRR or OUE by variance) at each --epsilon.

    .venv/bin/python -m benchmarks.bench_ldp --data letter.parquet --label lettr \
        [--parties 3] [--trees 50] [--seeds 1] [--repeat 3] [--epsilon 2 4] [--json out.json]

Any table works (Parquet or CSV; the label column is classification); rows are split 80/20 stratified per
seed and the training rows dealt iid to the parties.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.markdown import markdown_table
from fedcore.data.io import read_table
from fedcore.data.split import split_horizontal
from fedcore.horizontal.estimators import FederatedExtraTreesClassifier
from fedcore.metrics import metrics
from fedcore.privacy import ldp as ldp_module
from fedcore.privacy.ldp import LabelLDP
from fedcore.simulation import build_estimator, reference_extra_trees, split_train_test


class EstimationClock:
    """Time spent in LabelLDP.estimate_counts and how many groups it estimated (wraps the method)."""

    def __init__(self) -> None:
        """Nothing timed yet; the unpatched `LabelLDP.estimate_counts` is kept to restore."""
        self.seconds = 0.0
        self.groups = 0
        self._original = ldp_module.LabelLDP.estimate_counts

    def __enter__(self) -> EstimationClock:
        """Patch `LabelLDP.estimate_counts` to add its time and group count to this clock."""
        clock, original = self, self._original

        def timed(ldp, bit_sums, totals, n_classes):
            started = time.perf_counter()
            try:
                return original(ldp, bit_sums, totals, n_classes)
            finally:
                clock.seconds += time.perf_counter() - started
                clock.groups += int(np.size(totals))

        ldp_module.LabelLDP.estimate_counts = timed
        return self

    def __exit__(self, *exc) -> None:
        """Restore the original `LabelLDP.estimate_counts`."""
        ldp_module.LabelLDP.estimate_counts = self._original


def run_seed(table: pd.DataFrame, label: str, seed: int, trees: int, parties: int, repeat: int,
             epsilons: list[float]) -> dict:
    """Fit seconds and accuracy of ExtraTrees, FET and FET-LDP on one seeded split.

    The two federated fits alternate `repeat` times (FET, LDP, FET, LDP, ...) and each reports its median: the
    pairing keeps the ratio meaningful while the machine's speed drifts.
    """
    train, test = split_train_test(table, label, "classification", 0.2, seed)
    params = {"n_estimators": trees, "max_depth": None, "max_features": "sqrt", "random_state": seed}
    reference = reference_extra_trees("classification", train, test, label, params)
    out = {"ET": reference["metrics"]["accuracy"], "ET_fit_s": reference["train_s"]}
    frames = split_horizontal(train, parties, label=label, seed=seed)
    models = [("FET", None), ("FET-LDP Bloom", LabelLDP(mechanism="bloom"))]
    n_classes = table[label].nunique()
    models += [(f"FET-LDP {ldp.resolved(n_classes).mechanism} eps {eps:g}", ldp)
               for eps in epsilons for ldp in [LabelLDP(report_epsilon=eps)]]
    seconds: dict[str, list[float]] = {name: [] for name, _ in models}
    ratios: dict[str, list[float]] = {name: [] for name, _ in models}
    for _ in range(repeat):
        for name, ldp in models:
            model = (FederatedExtraTreesClassifier(**params) if ldp is None
                     else FederatedExtraTreesClassifier(**params, privacy="ldp", ldp=ldp,
                                                        allow_data_ranges=True))
            with EstimationClock() as clock:
                started = time.perf_counter()
                model.fit(frames, label=label)
                seconds[name].append(time.perf_counter() - started)
            out[f"{name}_estimate_s"] = clock.seconds
            out[f"{name}_groups"] = clock.groups
            predicted = model.predict(test.drop(columns=[label]))
            out[name] = metrics("classification", test[label].to_numpy(), predicted)["accuracy"]
            ratios[name].append(seconds[name][-1] / seconds["FET"][-1])
    for name in seconds:
        out[f"{name}_fit_s"] = float(np.median(seconds[name]))
        out[f"{name}_over_FET"] = float(np.median(ratios[name]))
    return out


def main() -> None:
    """Run every seed, print the medians and write the per-seed results if asked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a Parquet or CSV table")
    parser.add_argument("--label", required=True)
    parser.add_argument("--parties", type=int, default=3)
    parser.add_argument("--trees", type=int, default=50)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3,
                        help="alternating FET / FET-LDP fits per seed (medians)")
    parser.add_argument("--epsilon", type=float, nargs="*", default=[2.0, 4.0],
                        help="also the default mechanism ('auto': k-RR or OUE) at these per-row epsilons")
    parser.add_argument("--json", type=Path, help="also write the per-seed results here")
    args = parser.parse_args()

    table = read_table(args.data)
    # compile the kernels
    model = build_estimator("extra-trees", "none", "classification", {"n_estimators": 1})
    model.fit(split_horizontal(table.head(400), 2, label=args.label, seed=0), label=args.label)
    build_estimator("extra-trees", "ldp", "classification", {"n_estimators": 1}).fit(
        split_horizontal(table.head(400), 2, label=args.label, seed=0), label=args.label)

    runs = [run_seed(table, args.label, seed, args.trees, args.parties, args.repeat, args.epsilon)
            for seed in range(args.seeds)]
    mean = {key: float(np.mean([r[key] for r in runs])) for key in runs[0]}
    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; {args.data.name} {table.shape[0]} x {table.shape[1] - 1}, "
          f"{table[args.label].nunique()} classes, {args.parties} parties, {args.trees} trees, {args.seeds} "
          f"seed(s); fit seconds: medians of {args.repeat} alternating fits, 'x FET time' the median of the "
          "paired ratios\n")
    rows = [{"model": "ExtraTrees (sklearn, pooled)", "accuracy": mean["ET"], "- ET (pp)": 0.0,
             "fit s": mean["ET_fit_s"], "x FET time": mean["ET_fit_s"] / mean["FET_fit_s"],
             "estimation s": "", "groups estimated": ""}]
    for name in [key[:-len("_over_FET")] for key in mean if key.endswith("_over_FET")]:
        private = name != "FET"
        rows.append({"model": name, "accuracy": mean[name], "- ET (pp)": 100 * (mean[name] - mean["ET"]),
                     "fit s": mean[f"{name}_fit_s"], "x FET time": mean[f"{name}_over_FET"],
                     "estimation s": mean[f"{name}_estimate_s"] if private else "",
                     "groups estimated": int(mean[f"{name}_groups"]) if private else ""})
    print(markdown_table(rows))
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
