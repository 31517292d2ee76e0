"""Accuracy of horizontal Federated Extra-Trees and PPD-ERT against scikit-learn's ExtraTrees.

FET plain, with local DP and with global DP, and PPD-ERT with histogram and domain thresholds, each with the
same hyper-parameters as ExtraTrees: the Federated Extra-Trees paper's Table 2, its Figure 4 (accuracy against
the number of clients, federated against local-only), and FET-GDP's accuracy against epsilon.

Table 2: for each dataset and seed, a stratified 80/20 split, the training rows dealt iid to 2 clients,
then ExtraTreesClassifier on the pooled rows and each federated mode. Datasets: spambase and satellite
(from --data-dir, where present), waveform-21 (generated), scikit-learn's digits (10 classes, bundled),
and any --table PATH:LABEL (e.g. UCI letter). Figure 4: one dataset, 1 to 9 clients, the federated model
against the mean of the models each client trains on its own rows.

    .venv/bin/python -m benchmarks.bench_horizontal_accuracy [--seeds 5] [--trees 100] [--json out.json]
        [--table letter.parquet:lettr] [--figure docs/horizontal_clients.png]
        [--epsilon-curve letter --epsilon-figure docs/gdp_epsilon.png]
        (the figures need `make bench-venv` for matplotlib)
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.figures import epsilon_axis
from benchmarks.markdown import markdown_table
from fedcore.data.datasets import make_waveform
from fedcore.data.io import read_table
from fedcore.data.split import split_horizontal
from fedcore.metrics import metrics
from fedcore.simulation import build_estimator, declared_ranges, reference_extra_trees, split_train_test

PAPER = {  # Federated Extra-Trees paper, Table 2: ET, FET, FET-LDP, FET-GDP
    "spambase": (0.9307, 0.9348, 0.9259, 0.9339),
    "waveform-21": (0.8342, 0.8361, 0.8343, None),
}
MODES = (("FET", "extra-trees", "none"), ("FET-LDP", "extra-trees", "ldp"), ("FET-GDP", "extra-trees", "gdp"),
         ("PPD-ERT", "ppd-ert", "secagg"), ("PPD-ERT-domain", "ppd-ert", "secagg-domain"))
"""(column, algorithm, privacy) of each federated mode.

PPD-ERT runs histogram thresholds (the default), PPD-ERT-domain the paper's.
"""


def datasets(data_dir: Path, extra: list[str] = ()) -> dict[str, tuple[pd.DataFrame, str]]:
    """Name -> (table, label column).

    The UCI tables only where their file exists, then digits and every `extra` "path:label".
    """
    from sklearn.datasets import load_digits

    out: dict[str, tuple[pd.DataFrame, str]] = {}
    for name, label in (("spambase", "type"), ("satellite", "classes")):
        path = data_dir / f"{name}.parquet"
        if path.exists():
            out[name] = (pd.read_parquet(path), label)
    out["waveform-21"] = (make_waveform(5000, random_state=0), "class")
    out["digits"] = (load_digits(as_frame=True).frame, "target")
    for spec in extra:
        path, _, label = spec.rpartition(":")
        out[Path(path).stem] = (read_table(path), label)
    return out


def accuracy(model, test: pd.DataFrame, label: str) -> float:
    """Test accuracy of a fitted `model` on `test`."""
    predicted = model.predict(test.drop(columns=[label]))
    return metrics("classification", test[label].to_numpy(), predicted)["accuracy"]


def run_table2(table: pd.DataFrame, label: str, seed: int, trees: int, clients: int, epsilon: float,
               modes: tuple = MODES) -> dict:
    """Accuracy of the reference and of every federated mode on one seeded split."""
    train, test = split_train_test(table, label, "classification", 0.2, seed)
    params = {"n_estimators": trees, "max_depth": None, "max_features": "sqrt", "random_state": seed}
    reference = reference_extra_trees("classification", train, test, label, params)
    result = {"ET": reference["metrics"]["accuracy"]}
    parties = split_horizontal(train, clients, label=label, seed=seed)
    ranges = declared_ranges(train, label)
    for name, algorithm, privacy in modes:
        if privacy == "secagg-domain":
            model = build_estimator(algorithm, "secagg", "classification", params, feature_ranges=ranges,
                                    thresholds="domain")
        else:
            # epsilon is GDP's whole model's; FET-LDP runs the Bloom defaults (an epsilon would set its own)
            model = build_estimator(algorithm, privacy, "classification",
                                    _gdp_params(params) if privacy == "gdp" else params,
                                    epsilon=epsilon if privacy == "gdp" else None, feature_ranges=ranges)
        started = time.perf_counter()
        model.fit(parties, label=label)
        result[f"{name}_fit_s"] = time.perf_counter() - started
        result[name] = accuracy(model, test, label)
    return result


GDP_MAX_DEPTH = 8
"""GDP spends the model's total budget over trees x levels: it needs a bounded depth (issue #31)."""


def _gdp_params(params: dict) -> dict:
    return {**params, "max_depth": GDP_MAX_DEPTH}


def run_clients(table: pd.DataFrame, label: str, seed: int, trees: int, counts: list[int]) -> list[dict]:
    """Federated (plain FET) against local-only mean accuracy for each number of clients."""
    train, test = split_train_test(table, label, "classification", 0.2, seed)
    params = {"n_estimators": trees, "max_depth": None, "max_features": "sqrt", "random_state": seed}
    rows = []
    for m in counts:
        parties = split_horizontal(train, m, label=label, seed=seed)
        federated = build_estimator("extra-trees", "none", "classification", params).fit(parties, label=label)
        local = [accuracy(build_estimator("extra-trees", "none", "classification", params)
                          .fit([p], label=label), test, label) for p in parties]
        rows.append({"clients": m, "federated": accuracy(federated, test, label),
                     "local_only": float(np.mean(local))})
    return rows


def run_epsilon_curve(table: pd.DataFrame, label: str, seed: int, trees: int, clients: int,
                      epsilons: list[float]) -> list[dict]:
    """FET-GDP's accuracy at each total epsilon (depth GDP_MAX_DEPTH), beside ExtraTrees on the same split."""
    train, test = split_train_test(table, label, "classification", 0.2, seed)
    params = {"n_estimators": trees, "max_depth": None, "max_features": "sqrt", "random_state": seed}
    reference = reference_extra_trees("classification", train, test, label, params)["metrics"]["accuracy"]
    parties = split_horizontal(train, clients, label=label, seed=seed)
    return [{"epsilon": eps, "ET": reference,
             "FET-GDP": accuracy(build_estimator("extra-trees", "gdp", "classification", _gdp_params(params),
                                                 epsilon=eps)
                                 .fit(parties, label=label), test, label)} for eps in epsilons]


def plot_epsilon(name: str, curve: list[dict], path: Path) -> None:
    """FET-GDP accuracy against epsilon per query (log scale), with ExtraTrees and ExtraTrees - 3 pp."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4), dpi=120)
    eps = [r["epsilon"] for r in curve]
    reference = float(np.mean([r["ET"] for r in curve]))
    axis.semilogx(eps, [r["FET-GDP"] for r in curve], "-o", color="tab:red", label="FET-GDP")
    epsilon_axis(axis, eps, reference, "ExtraTrees (pooled rows)", "epsilon per count query")
    axis.set_title(f"FET-GDP on {name}: accuracy against epsilon")
    axis.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)


def plot_clients(curves: dict[str, list[dict]], path: Path) -> None:
    """The Figure 4 analogue as a PNG: accuracy against clients, federated (solid) vs local-only (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4), dpi=120)
    for (name, rows), color in zip(curves.items(), ("tab:blue", "tab:orange", "tab:green"), strict=False):
        clients = [r["clients"] for r in rows]
        axis.plot(clients, [r["federated"] for r in rows], "-o", color=color,
                  label=f"{name}: federated (FET)")
        axis.plot(clients, [r["local_only"] for r in rows], "--s", color=color,
                  label=f"{name}: local-only (mean)")
    axis.set_xlabel("number of clients (iid rows)")
    axis.set_ylabel("test accuracy")
    axis.set_title("Federated Extra-Trees: joining helps as data is spread thinner")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)


def parse_args() -> argparse.Namespace:
    """The command line: which tables, curves and figures, over how many seeds and trees."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path,
                        default=Path(__file__).resolve().parents[2] / "shared" / "datasets")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--epsilon", type=float, default=1.0, help="FET-GDP epsilon per query")
    parser.add_argument("--modes", nargs="+", choices=[m[0] for m in MODES], default=[m[0] for m in MODES],
                        help="federated modes of Table 2 to run (default: all)")
    parser.add_argument("--curve-clients", type=int, nargs="*", default=list(range(1, 10)),
                        help="client counts of the Figure 4 curve (none: skip the curve)")
    parser.add_argument("--curve-seeds", type=int, default=3)
    parser.add_argument("--curve-trees", type=int, default=50, help="trees per model in the clients curve")
    parser.add_argument("--figure", type=Path, help="write the clients curve as a PNG here")
    parser.add_argument("--json", type=Path, help="also write the per-seed results here")
    parser.add_argument("--table", action="append", default=[], metavar="PATH:LABEL",
                        help="another classification table for Table 2 (repeatable), e.g. "
                             "letter.parquet:lettr")
    parser.add_argument("--only", nargs="*", help="Table 2 datasets to run (default: all)")
    parser.add_argument("--epsilon-curve", help="dataset for FET-GDP's accuracy against epsilon")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--epsilon-seeds", type=int, default=2)
    parser.add_argument("--epsilon-figure", type=Path, help="write the epsilon curve as a PNG here")
    return parser.parse_args()


def table2(args: argparse.Namespace, tables: dict, modes: tuple, raw: dict) -> list[dict]:
    """Table 2: one row of mean accuracies per dataset; the per-seed results go into `raw`."""
    rows = []
    for name, (table, label) in tables.items():
        runs = [run_table2(table, label, seed, args.trees, args.clients, args.epsilon, modes)
                for seed in range(args.seeds)]
        raw["table2"][name] = runs
        mean = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
        row = {"dataset": name, "rows x cols": f"{table.shape[0]} x {table.shape[1] - 1}",
               "ET (sklearn)": mean["ET"]}
        for mode, _, _ in modes:
            row[mode] = mean[mode]
            row[f"{mode} - ET (pp)"] = 100 * (mean[mode] - mean["ET"])
        paper = PAPER.get(name)
        row["paper ET / FET / LDP / GDP"] = (" / ".join("-" if v is None else f"{v:.4f}" for v in paper)
                                             if paper else "")
        rows.append(row)
        print(f"{name}: " + ", ".join(f"{k}={v:.4f}" for k, v in mean.items()), flush=True)
    return rows


def clients_curves(args: argparse.Namespace, tables: dict, raw: dict) -> dict[str, list[dict]]:
    """Figure 4 for spambase and waveform-21 where present: mean accuracies against the clients."""
    curves = {}
    for name in [n for n in ("spambase", "waveform-21") if n in tables and args.curve_clients]:
        table, label = tables[name]
        per_seed = [run_clients(table, label, seed, args.curve_trees, args.curve_clients)
                    for seed in range(args.curve_seeds)]
        curves[name] = [{"clients": m, "federated": float(np.mean([s[i]["federated"] for s in per_seed])),
                         "local_only": float(np.mean([s[i]["local_only"] for s in per_seed]))}
                        for i, m in enumerate(args.curve_clients)]
        raw["clients"][name] = curves[name]
        print(f"{name} clients curve: {curves[name]}", flush=True)
    return curves


def epsilon_curve(args: argparse.Namespace) -> list[dict]:
    """FET-GDP's mean accuracy against epsilon on the `--epsilon-curve` dataset."""
    table, label = datasets(args.data_dir, args.table)[args.epsilon_curve]
    per_seed = [run_epsilon_curve(table, label, seed, args.trees, args.clients, args.epsilons)
                for seed in range(args.epsilon_seeds)]
    curve = [{key: float(np.mean([s[i][key] for s in per_seed])) for key in per_seed[0][i]}
             for i in range(len(args.epsilons))]
    print(f"{args.epsilon_curve} epsilon curve: {curve}", flush=True)
    return curve


def report(args: argparse.Namespace, rows: list[dict], curves: dict[str, list[dict]], raw: dict) -> None:
    """Print the tables, draw the figures asked for and write the raw results."""
    print(f"\nMachine: {platform.processor() or platform.machine()}, Python {platform.python_version()}; "
          f"{args.seeds} seeds, {args.trees} trees, max_features sqrt, {args.clients} clients (iid), GDP "
          f"epsilon {args.epsilon} per query; clients curve: {args.curve_trees} trees, {args.curve_seeds} "
          "seeds\n")
    print(markdown_table(rows))
    for name, curve in curves.items():
        print(f"\n{name}: accuracy against clients\n")
        print(markdown_table([{"clients": r["clients"], "federated": r["federated"],
                               "local-only (mean)": r["local_only"],
                               "gain (pp)": 100 * (r["federated"] - r["local_only"])} for r in curve]))
    if args.figure and curves:
        plot_clients(curves, args.figure)
        print(f"\nfigure: {args.figure}")
    for name, curve in raw["epsilon"].items():
        print(f"\n{name}: FET-GDP accuracy against epsilon per query\n")
        print(markdown_table([{"epsilon": r["epsilon"], "FET-GDP": r["FET-GDP"], "ET": r["ET"],
                               "GDP - ET (pp)": 100 * (r["FET-GDP"] - r["ET"])} for r in curve]))
        if args.epsilon_figure:
            plot_epsilon(name, curve, args.epsilon_figure)
            print(f"\nfigure: {args.epsilon_figure}")
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))


def main() -> None:
    """Run the selected tables and curves, print the results and draw the figures asked for."""
    args = parse_args()
    raw = {"table2": {}, "clients": {}, "epsilon": {}}
    tables = datasets(args.data_dir, args.table)
    if args.only is not None:
        tables = {name: tables[name] for name in args.only}
    modes = tuple(m for m in MODES if m[0] in args.modes)
    rows = table2(args, tables, modes, raw)
    curves = clients_curves(args, tables, raw)
    if args.epsilon_curve:
        raw["epsilon"][args.epsilon_curve] = epsilon_curve(args)
    report(args, rows, curves, raw)


if __name__ == "__main__":
    main()
