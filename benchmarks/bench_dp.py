"""Issue #31's targets: the DP modes at a total budget against ExtraTrees and IBM's diffprivlib, same run.

For each table (UCI spambase, satellite and letter from --data-dir) and seed: a stratified 80/20 split, the
training rows dealt iid to --parties parties, then on the same split
* scikit-learn's ExtraTreesClassifier on the pooled rows (the non-private reference, --trees trees, fully
  grown) and plain FET (privacy none) with the same parameters;
* FET-GDP at each --epsilons total budget (delta --delta), --dp-depth levels (its plan needs a bounded
  depth; plain FET at that depth is reported too), and FET-LDP at each --ldp-epsilons per-row label epsilon
  (fully grown, as plain FET), both with the tables' declared bounds (each column's range over the whole
  table, as a data owner would declare it); each DP mode's time against plain FET's of the same depth;
* PPD-ERT secagg-dp (distributed discrete Gaussian noise on the masked sums) at each --epsilons total budget,
  --dp-depth levels, domain thresholds (the mode's), against PPD-ERT secagg with domain thresholds at that
  depth (its time reference);
* diffprivlib's RandomForestClassifier (centralized, pure epsilon-DP, the same declared bounds and classes) at
  each --epsilons, in its own virtual environment (diffprivlib needs scikit-learn < 1.7; made once under
  --venv-dir from the PyPI index pip is configured with).
Reports accuracy and macro F1, the gap to ExtraTrees in percentage points, and each DP mode's fit time against
plain FET's of the same trees and depth (FET-GDP's plan auto chooses its own: the plain reference is run at
the shape that ran); the figure plots accuracy against epsilon per table. Fit times are CPU seconds of the
fitting process (`time.process_time`, all its threads: the simulated parties and master run in it), so the
ratios move less with other sessions' load than wall time would; a DP mode's first fit in the process also
pays the accountant's one-time import (dp-accounting, about 0.3 s once scikit-learn has loaded SciPy).

    .venv/bin/python -m benchmarks.bench_dp [--tables spambase,satellite,letter] [--epsilons 1,4]
        [--ldp-epsilons 2,4] [--seeds 1] [--trees 50] [--parties 3] [--dp-depth 8] [--dp-trees N]
        [--modes gdp,ldp,secagg-dp,diffprivlib] [--figure docs/dp_epsilon.png] [--no-diffprivlib]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.figures import epsilon_axis
from benchmarks.markdown import markdown_table
from fedcore.data.split import split_horizontal
from fedcore.simulation import build_estimator, declared_ranges, split_train_test

LABELS = {"spambase": "type", "satellite": "classes", "letter": "lettr"}
MODES = {"gdp", "ldp", "secagg-dp", "diffprivlib"}
"""The private rows `--modes` chooses from."""
DIFFPRIVLIB = ("diffprivlib==0.6.6", "scikit-learn>=1.4,<1.7", "numpy>=2")
"""The reference's environment: diffprivlib (MIT) and the scikit-learn it supports."""


def scores(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """Accuracy and macro F1."""
    from sklearn.metrics import accuracy_score, f1_score

    return {"accuracy": float(accuracy_score(y_true, y_pred)),
            "macro_f1": float(f1_score(y_true, y_pred, average="macro"))}


def diffprivlib_python(venv_dir: Path) -> Path:
    """The interpreter of a virtual environment with diffprivlib, made on first use."""
    python = venv_dir / "bin" / "python"
    if not python.exists():
        print(f"making diffprivlib's environment in {venv_dir} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv_dir)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *DIFFPRIVLIB], check=True)
    return python


def run_diffprivlib(python: Path, train: pd.DataFrame, test: pd.DataFrame, label: str, classes: list,
                    bounds: dict[str, tuple[float, float]], epsilon: float, trees: int, depth: int,
                    seed: int) -> tuple[np.ndarray, float]:
    """Diffprivlib's forest at total `epsilon`, in its own environment: test predictions (codes), fit s."""
    features = [c for c in train.columns if c != label]
    code = {value: i for i, value in enumerate(classes)}
    with tempfile.TemporaryDirectory() as scratch:
        source, target = Path(scratch) / "in.npz", Path(scratch) / "out.json"
        low, high = (np.array([bounds[f][end] for f in features]) for end in (0, 1))
        np.savez(source, x_train=train[features].to_numpy(np.float64),
                 y_train=train[label].map(code).to_numpy(np.int64),
                 x_test=test[features].to_numpy(np.float64), low=low, high=high,
                 classes=np.arange(len(classes)), epsilon=epsilon, trees=trees, max_depth=depth, seed=seed)
        runner = Path(__file__).with_name("diffprivlib_runner.py")
        subprocess.run([str(python), str(runner), str(source), str(target)], check=True)
        result = json.loads(target.read_text())
    return np.asarray(result["predicted"]), float(result["fit_s"])


def fet(privacy: object, train_parties: list[pd.DataFrame], test: pd.DataFrame, label: str, params: dict,
        ranges: dict[str, tuple[float, float]],
        algorithm: str = "extra-trees") -> tuple[np.ndarray, float, dict]:
    """A FET (or PPD-ERT) estimator in `privacy` on the parties: test predictions, fit s, privacy report."""
    model = build_estimator(algorithm, privacy, "classification", params, feature_ranges=ranges)
    started = time.process_time()
    model.fit(train_parties, label=label)
    seconds = time.process_time() - started
    predicted = np.asarray(model.predict(test.drop(columns=[label])))
    return predicted, seconds, getattr(model, "privacy_report_", {})


def gdp_plan(plan: str, epsilon: float, delta: float, dp: dict, full: dict) -> tuple[dict, dict]:
    """FET-GDP's privacy and parameters for `plan`.

    "splits" (--dp-trees x --dp-depth), "auto" (only epsilon given: the default plan's trees and depth),
    "leaves:N" (N split levels, the default trees, the depth from the noisy rows), "marginals[:N]" alike.
    """
    privacy = {"mode": "gdp", "epsilon": epsilon, "delta": delta}
    if plan == "splits":
        return {**privacy, "plan": "splits"}, dp
    if plan == "auto":
        return privacy, {**full, "max_depth": None}
    from fedcore.horizontal.fet.plans import DEFAULT_LEAF_TREES

    levels = int(plan.split(":")[1]) if ":" in plan else 0
    return ({**privacy, "plan": plan.split(":")[0], "split_levels": levels},
            {**full, "n_estimators": DEFAULT_LEAF_TREES, "max_depth": None})


def run_gdp(args: argparse.Namespace, parties: list[pd.DataFrame], test: pd.DataFrame, label: str,
            ranges: dict[str, tuple[float, float]], dp: dict, full: dict, plain_dp_s: float, add) -> None:
    """FET-GDP's rows: each --gdp-plans plan at each --epsilons budget.

    Timed against plain FET of the trees and depth that ran (plan auto chooses its own).
    """
    plain_by_shape = {(dp["n_estimators"], dp["max_depth"]): plain_dp_s}
    for epsilon in args.epsilons:
        for plan in args.gdp_plans:
            privacy, params = gdp_plan(plan, epsilon, args.delta, dp, full)
            predicted, seconds, report = fet(privacy, parties, test, label, params, ranges)
            ran = report.get("plan") or {}
            shape = (ran.get("n_estimators", dp["n_estimators"]), ran.get("max_depth", dp["max_depth"]))
            if shape not in plain_by_shape:
                plain_by_shape[shape] = fet("none", parties, test, label,
                                            {**full, "n_estimators": shape[0], "max_depth": shape[1]},
                                            ranges)[1]
            add(f"FET-GDP ({plan})", epsilon, predicted, seconds, trees=shape[0], depth=shape[1],
                time_vs_plain=seconds / plain_by_shape[shape], epsilon_total=report.get("epsilon_total"),
                plan=ran)


def run_table(name: str, table: pd.DataFrame, args: argparse.Namespace, seed: int,
              python: Path | None) -> list[dict]:
    """Every mode on one table and seed: a row per (mode, epsilon)."""
    from sklearn.ensemble import ExtraTreesClassifier

    label = LABELS[name]
    train, test = split_train_test(table, label, "classification", 0.2, seed)
    y_test = test[label].to_numpy()
    ranges = declared_ranges(table, label)
    features = [c for c in table.columns if c != label]
    rows: list[dict] = []

    def add(mode: str, epsilon: float | None, predicted: np.ndarray, seconds: float, **extra) -> None:
        rows.append({"table": name, "seed": seed, "mode": mode, "epsilon": epsilon,
                     **scores(y_test, predicted), "fit_s": seconds, **extra})

    started = time.process_time()
    reference = ExtraTreesClassifier(n_estimators=args.trees, random_state=seed, n_jobs=1)
    reference.fit(train[features].to_numpy(np.float64), train[label].to_numpy())
    add("ExtraTrees (pooled)", None, reference.predict(test[features].to_numpy(np.float64)),
        time.process_time() - started)
    parties = split_horizontal(train, args.parties, label=label, seed=seed)
    full = {"n_estimators": args.trees, "max_depth": None, "max_features": "sqrt", "random_state": seed}
    dp = {**full, "n_estimators": args.dp_trees or args.trees, "max_depth": args.dp_depth}
    predicted, plain_s, _ = fet("none", parties, test, label, full, ranges)
    add("FET", None, predicted, plain_s)
    predicted, plain_dp_s, _ = fet("none", parties, test, label, dp, ranges)
    shape = f"depth {args.dp_depth}" + (f", {dp['n_estimators']} trees" if args.dp_trees else "")
    add(f"FET, {shape}", None, predicted, plain_dp_s)
    if "gdp" in args.modes:
        run_gdp(args, parties, test, label, ranges, dp, full, plain_dp_s, add)
    for epsilon in args.ldp_epsilons if "ldp" in args.modes else ():
        privacy = {"mode": "ldp", "epsilon": epsilon}  # a row's one report: no depth bound needed
        predicted, seconds, report = fet(privacy, parties, test, label, full, ranges)
        add("FET-LDP labels", epsilon, predicted, seconds, time_vs_plain=seconds / plain_s,
            epsilon_total=report.get("epsilon_total"))
    if "secagg-dp" in args.modes:
        plain = {"mode": "secagg", "thresholds": "domain"}
        predicted, plain_secagg_s, _ = fet(plain, parties, test, label, dp, ranges, "ppd-ert")
        add(f"PPD-ERT (domain), {shape}", None, predicted, plain_secagg_s)
        for epsilon in args.epsilons:
            privacy = {"mode": "secagg-dp", "epsilon": epsilon, "delta": args.delta}
            predicted, seconds, report = fet(privacy, parties, test, label, dp, ranges, "ppd-ert")
            add("PPD-ERT secagg-dp", epsilon, predicted, seconds, time_vs_plain=seconds / plain_secagg_s,
                epsilon_total=report.get("epsilon_total"), epsilon_coalition=report.get("epsilon_coalition"))
    if python is not None:
        classes = sorted(table[label].unique().tolist())
        for epsilon in args.epsilons:
            predicted, seconds = run_diffprivlib(python, train, test, label, classes, ranges, epsilon,
                                                 args.trees, args.diffprivlib_depth, seed)
            add("diffprivlib RF", epsilon, np.asarray(classes, dtype=object)[predicted], seconds)
    et = rows[0]["accuracy"]
    for row in rows:
        row["gap_pp"] = 100 * (et - row["accuracy"])
    return rows


def plot(rows: list[dict], path: Path) -> None:
    """Accuracy against epsilon per table: FET-GDP and diffprivlib (total epsilon), LDP labels, ExtraTrees."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame = pd.DataFrame(rows)
    tables = list(dict.fromkeys(frame["table"]))
    figure, axes = plt.subplots(1, len(tables), figsize=(5 * len(tables), 4), dpi=120, squeeze=False)
    for axis, name in zip(axes[0], tables, strict=True):
        part = frame[frame["table"] == name].groupby(["mode", "epsilon"], dropna=False)["accuracy"].mean()
        for mode, style in (("FET-GDP (auto)", "-o"), ("PPD-ERT secagg-dp", "-.D"), ("diffprivlib RF", "--s"),
                            ("FET-LDP labels", ":^")):
            if mode in part.index.get_level_values(0):
                curve = part[mode].sort_index()
                axis.semilogx(curve.index, curve.to_numpy(), style, label=mode)
        ticks = sorted({e for e in part.index.get_level_values(1) if pd.notna(e)})
        epsilon_axis(axis, ticks, part["ExtraTrees (pooled)"].iloc[0], "ExtraTrees (non-private)",
                     "epsilon (FET-GDP, diffprivlib: whole model; LDP: per row's label)")
        axis.set_title(name)
    axes[0][0].legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path,
                        default=Path(__file__).resolve().parents[2] / "shared" / "datasets")
    parser.add_argument("--tables", default="spambase,satellite,letter")
    parser.add_argument("--epsilons", default="1,4", help="total budgets (FET-GDP, diffprivlib)")
    parser.add_argument("--delta", type=float, default=1e-6)
    parser.add_argument("--ldp-epsilons", default="2,4", help="per-row label epsilons (FET-LDP)")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--trees", type=int, default=50)
    parser.add_argument("--parties", type=int, default=3)
    parser.add_argument("--dp-depth", type=int, default=8)
    parser.add_argument("--dp-trees", type=int, help="FET-GDP's trees (and plain FET's at its depth); "
                                                      "default --trees")
    parser.add_argument("--gdp-plans", default="auto",
                        help="FET-GDP plans, comma-separated: auto, splits (--dp-trees x --dp-depth), "
                             "leaves:N (N upper levels chosen by noisy counts)")
    parser.add_argument("--diffprivlib-depth", type=int, default=5, help="diffprivlib's own default")
    parser.add_argument("--modes", default=",".join(sorted(MODES)),
                        help="which private rows to run: gdp, ldp (FET), secagg-dp (PPD-ERT, with its plain "
                             "domain-threshold row), diffprivlib (the references always run)")
    parser.add_argument("--no-diffprivlib", action="store_true")
    parser.add_argument("--venv-dir", type=Path,
                        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                        / "fedforest" / "diffprivlib-0.6.6")
    parser.add_argument("--figure", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.epsilons = [float(e) for e in args.epsilons.split(",") if e]
    args.ldp_epsilons = [float(e) for e in args.ldp_epsilons.split(",") if e]
    args.modes = set(args.modes.split(","))
    args.gdp_plans = [p for p in args.gdp_plans.split(",") if p]
    if args.modes - MODES:
        parser.error(f"--modes: unknown {sorted(args.modes - MODES)}")
    return args


def main() -> None:
    """Run every table and seed; print the Markdown table (means over seeds)."""
    args = parse_args()
    wanted = "diffprivlib" in args.modes and not args.no_diffprivlib
    python = diffprivlib_python(args.venv_dir) if wanted else None
    rows: list[dict] = []
    for name in args.tables.split(","):
        table = pd.read_parquet(args.data_dir / f"{name}.parquet")
        for seed in range(args.seeds):
            print(f"{name}, seed {seed} ...", file=sys.stderr)
            rows += run_table(name, table, args, seed, python)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    if args.figure:
        plot(rows, args.figure)
    frame = pd.DataFrame(rows)
    summary = frame.groupby(["table", "mode", "epsilon"], dropna=False, sort=False).mean(numeric_only=True)
    print(f"# bench_dp ({platform.machine()}, {os.cpu_count()} cores; {args.seeds} seed(s), {args.trees} "
          f"trees, {args.parties} parties, DP {args.dp_trees or args.trees} trees of depth {args.dp_depth}, "
          f"delta {args.delta:g})\n")
    columns = ["accuracy", "macro_f1", "gap_pp", "trees", "depth", "fit_s", "time_vs_plain", "epsilon_total",
               "epsilon_coalition"]
    present = [c for c in columns if c in summary.columns]
    print(markdown_table(summary[present].reset_index().to_dict("records")))


if __name__ == "__main__":
    main()
