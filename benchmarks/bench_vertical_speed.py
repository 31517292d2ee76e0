"""Training and prediction speed of vertical Federated Forest, with the references run in the same run.

Data: make_classification(200_000, 40, n_informative=20), 160k train / 40k test; 3 parties; 100 trees,
max_features sqrt, bootstrap. For each depth: Federated Forest over the in-process transport (fit,
one-round prediction of the 40k rows, node-by-node for comparison), scikit-learn's RandomForest, XGBoost
`hist` random forest (centralized) and XGBoost's own federated vertical mode (3 workers on loopback).
Then 1,000,000 x 40 at depth 10 in a child process, reporting time and peak memory. Prints Markdown
with ratios (reference time / Federated Forest time: > 1 means Federated Forest is faster).

    .venv/bin/python -m benchmarks.bench_vertical_speed [--depths 10 16] [--skip-xgboost] [--skip-1m]
    .venv/bin/python -m benchmarks.bench_vertical_speed --pairs boosting [--before OLD [--concurrent]]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
from sklearn.datasets import make_classification

from benchmarks.harness import child_json, interleaved, machine_line
from benchmarks.markdown import markdown_table
from fedcore.data.split import split_vertical
from fedcore.vertical.estimators import FederatedForestClassifier

N_FEATURES = 40
N_TREES = 100


def make_data(n_rows: int, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The benchmark table, split 80/20 (first rows train)."""
    X, y = make_classification(n_rows, N_FEATURES, n_informative=20, random_state=seed)
    frame = pd.DataFrame(X, columns=[f"f{i}" for i in range(N_FEATURES)])
    frame["y"] = y
    cut = int(0.8 * n_rows)
    return frame.iloc[:cut].reset_index(drop=True), frame.iloc[cut:].reset_index(drop=True)


def run_federated_forest(train: pd.DataFrame, test: pd.DataFrame, depth: int, n_parties: int = 3,
                         node_by_node: bool = True) -> dict:
    """Fit and predict with the engine; times, accuracy and communication."""
    parties = split_vertical(train, n_parties, label="y", seed=0)
    columns = [[c for c in p.columns if c != "y"] for p in parties]
    test_parties = [test[c] for c in columns]
    model = FederatedForestClassifier(n_estimators=N_TREES, max_depth=depth, max_features="sqrt",
                                      random_state=0)
    started = time.perf_counter()
    model.fit(parties, label="y")
    fit_s = time.perf_counter() - started
    s = model.master_.structure
    out = {"fit_s": fit_s, "nodes": int(s.n_nodes), "leaves": int((s.left == -1).sum()),
           "train_rounds": model.training_communication_["rounds"],
           "train_mb": model.training_communication_["bytes"] / 2**20}
    for method in ("one-round", "node-by-node") if node_by_node else ("auto",):
        before = dict(model.communication_)
        started = time.perf_counter()
        predicted = model.predict(test_parties, method=method)
        out[f"predict_{method}_s"] = time.perf_counter() - started
        out[f"predict_{method}_rounds"] = model.communication_["rounds"] - before["rounds"]
        out[f"predict_{method}_mb"] = (model.communication_["bytes"] - before["bytes"]) / 2**20
        out["accuracy"] = float((predicted == test["y"].to_numpy()).mean())
    return out


def run_sklearn(train: pd.DataFrame, test: pd.DataFrame, depth: int) -> dict:
    """scikit-learn RandomForestClassifier with the same trees, depth, features and bootstrap."""
    from sklearn.ensemble import RandomForestClassifier

    model = RandomForestClassifier(n_estimators=N_TREES, max_depth=depth, max_features="sqrt", n_jobs=-1,
                                   random_state=0)
    X, y = train.drop(columns="y").to_numpy(), train["y"].to_numpy()
    started = time.perf_counter()
    model.fit(X, y)
    fit_s = time.perf_counter() - started
    started = time.perf_counter()
    predicted = model.predict(test.drop(columns="y").to_numpy())
    return {"fit_s": fit_s, "predict_s": time.perf_counter() - started,
            "accuracy": float((predicted == test["y"].to_numpy()).mean())}


def run_xgboost_hist(train: pd.DataFrame, test: pd.DataFrame, depth: int) -> dict:
    """XGBoost `hist` random forest, centralized (one round of 100 bagged trees)."""
    import xgboost as xgb

    params = {"tree_method": "hist", "num_parallel_tree": N_TREES, "max_depth": depth, "learning_rate": 1.0,
              "subsample": 0.632, "colsample_bynode": math.sqrt(N_FEATURES) / N_FEATURES, "reg_lambda": 1e-5,
              "objective": "binary:logistic", "seed": 0, "nthread": os.cpu_count()}
    dtrain = xgb.DMatrix(train.drop(columns="y").to_numpy(), label=train["y"].to_numpy())
    dtest = xgb.DMatrix(test.drop(columns="y").to_numpy())
    started = time.perf_counter()
    booster = xgb.train(params, dtrain, num_boost_round=1)
    fit_s = time.perf_counter() - started
    started = time.perf_counter()
    predicted = booster.predict(dtest) > 0.5
    return {"fit_s": fit_s, "predict_s": time.perf_counter() - started,
            "accuracy": float((predicted == test["y"].to_numpy()).mean())}


def run_xgbrf(train: pd.DataFrame, test: pd.DataFrame, depth: int) -> dict:
    """XGBoost's scikit-learn random forest, issue #34's reference: 0.632 of rows, 0.16 of columns a node."""
    from xgboost import XGBRFClassifier

    model = XGBRFClassifier(n_estimators=N_TREES, max_depth=depth, subsample=0.632, colsample_bynode=0.16,
                            n_jobs=2, random_state=0)
    X, y = train.drop(columns="y").to_numpy(), train["y"].to_numpy()
    started = time.perf_counter()
    model.fit(X, y)
    fit_s = time.perf_counter() - started
    started = time.perf_counter()
    predicted = model.predict(test.drop(columns="y").to_numpy())
    return {"fit_s": fit_s, "predict_s": time.perf_counter() - started,
            "accuracy": float((predicted == test["y"].to_numpy()).mean())}


BOOSTING = {"n_estimators": 100, "max_depth": 6, "learning_rate": 0.3, "reg_lambda": 1.0, "gamma": 0.0,
            "min_child_weight": 1.0}
"""Issue #32's boosting run: 100 rounds of depth 6, XGBoost's defaults otherwise (255 bins both)."""


def run_federated_boosting(train: pd.DataFrame, test: pd.DataFrame, n_parties: int = 3) -> dict:
    """Vertical boosting (plain SecureBoost) in-process: fit, one-round prediction of the test rows."""
    from fedcore.vertical.boosting_estimators import FederatedBoostingClassifier

    parties = split_vertical(train, n_parties, label="y", seed=0)
    columns = [[c for c in p.columns if c != "y"] for p in parties]
    model = FederatedBoostingClassifier(**BOOSTING, max_bins=255, random_state=0)
    started = time.perf_counter()
    model.fit(parties, label="y")
    fit_s = time.perf_counter() - started
    started = time.perf_counter()
    predicted = model.predict([test[c] for c in columns], method="one-round")
    return {"fit_s": fit_s, "predict_s": time.perf_counter() - started,
            "accuracy": float((predicted == test["y"].to_numpy()).mean()),
            "train_rounds": model.training_communication_["rounds"],
            "train_mb": model.training_communication_["bytes"] / 2**20}


def run_xgboost_boosting(train: pd.DataFrame, test: pd.DataFrame) -> dict:
    """XGBoost `hist` gradient boosting on the pooled columns, the same rounds and parameters, 2 threads."""
    from xgboost import XGBClassifier

    model = XGBClassifier(**BOOSTING, tree_method="hist", max_bin=255, n_jobs=2, random_state=0)
    X, y = train.drop(columns="y").to_numpy(), train["y"].to_numpy()
    started = time.perf_counter()
    model.fit(X, y)
    fit_s = time.perf_counter() - started
    started = time.perf_counter()
    predicted = model.predict(test.drop(columns="y").to_numpy())
    return {"fit_s": fit_s, "predict_s": time.perf_counter() - started,
            "accuracy": float((predicted == test["y"].to_numpy()).mean())}


def boosting_pairs(train: pd.DataFrame, test: pd.DataFrame, repeats: int) -> list[dict]:
    """Vertical boosting and XGBoost hist in turn, `repeats` times: a row per run with the pair's ratio."""
    rows = []
    pairs = interleaved(lambda: run_federated_boosting(train, test),
                        lambda: run_xgboost_boosting(train, test), repeats)
    for repeat, (ours, reference) in enumerate(pairs):
        print(f"boosting run {repeat}: ours {json.dumps(ours)}, XGBoost {json.dumps(reference)}", flush=True)
        rows.append({"run": repeat, "boosting train s": ours["fit_s"],
                     "XGBoost hist train s": reference["fit_s"],
                     "train ratio (ours / XGBoost)": f"{ours['fit_s'] / reference['fit_s']:.2f}x",
                     "predict 40k one-round s": ours["predict_s"],
                     "XGBoost predict s": reference["predict_s"],
                     "accuracy": ours["accuracy"], "XGBoost accuracy": reference["accuracy"]})
    return rows


BOOSTING_CHILD = """
import hashlib, json, resource, sys, time
from benchmarks.bench_vertical_speed import BOOSTING, make_data
from fedcore.data.split import split_vertical
from fedcore.vertical.boosting_estimators import FederatedBoostingClassifier

if sys.argv[2] == "concurrent":  # a round's parties side by side (InProcessTransport)
    FederatedBoostingClassifier._concurrent_parties = True

def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

train, test = make_data(int(sys.argv[1]))
parties = split_vertical(train, 3, label="y", seed=0)
tests = [test[[c for c in p.columns if c != "y"]] for p in parties]
warm = split_vertical(train.iloc[:2000], 3, label="y", seed=0)
FederatedBoostingClassifier(**{**BOOSTING, "n_estimators": 3}, max_bins=255, random_state=0).fit(
    warm, label="y").predict([t.iloc[:100] for t in tests], method="one-round")
model = FederatedBoostingClassifier(**BOOSTING, max_bins=255, random_state=0)
cpu0, wall0 = cpu(), time.perf_counter()
model.fit(parties, label="y")
cpu1, wall1 = cpu(), time.perf_counter()
proba = model.predict_proba(tests, method="one-round")
wall2 = time.perf_counter()
print(json.dumps({"cpu_s": cpu1 - cpu0, "wall_s": wall1 - wall0, "predict_s": wall2 - wall1,
                  "proba": hashlib.sha256(proba.tobytes()).hexdigest()[:16],
                  "side_by_side": getattr(model.transport_, "concurrent", False),
                  "messages_per_round": model.training_communication_["messages"] / BOOSTING["n_estimators"],
                  "accuracy": float(((proba[:, 1] > 0.5) == test["y"].to_numpy()).mean())}))
"""
"""A child's boosting fit, timed by CPU (every thread) and wall clock after a warm-up fit, and the hash of
its predicted probabilities: run from a code copy's root, so only `make_data`/`BOOSTING` must exist there."""

XGBOOST_CHILD = """
import json, resource, sys, time
from benchmarks.bench_vertical_speed import make_data, run_xgboost_boosting

def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

train, test = make_data(int(sys.argv[1]))
cpu0 = cpu()
out = run_xgboost_boosting(train, test)  # (its CPU includes the predict, 0.05 s quietly)
print(json.dumps({"cpu_s": cpu() - cpu0, "wall_s": out["fit_s"], "predict_s": out["predict_s"],
                  "accuracy": out["accuracy"]}))
"""
"""XGBoost `hist`'s fit in a child process, with OpenMP's threads sleeping when idle (its CPU is its work)."""


def boosting_code_pairs(rows: int, before: str, repeats: int, concurrent: bool = False) -> list[dict]:
    """Boosting fits of the code at `before` and of this code, and XGBoost's, each in a child, orders rotated.

    CPU seconds (getrusage, every thread) and wall clock of each fit, niced as this process is, with the
    load average at each run's start: a row per run. `concurrent`: this code's parties answer side by side.
    """
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs = {"before": (before, BOOSTING_CHILD), "after": (here, BOOSTING_CHILD),
            "XGBoost": (here, XGBOOST_CHILD)}
    names = list(runs)
    rows_out = []
    for repeat in range(repeats):
        order = names[repeat % 3:] + names[:repeat % 3]
        for name in order:
            root, code = runs[name]
            env = {**os.environ, "PYTHONPATH": root, "OMP_WAIT_POLICY": "PASSIVE"}
            env.pop("NUMBA_CACHE_DIR", None)  # each copy's own cache (`fedcore.default_numba_cache`)
            load = os.getloadavg()[0]
            mode = "concurrent" if concurrent and name == "after" else "in-turn"
            done = subprocess.run([sys.executable, "-c", code, str(rows), mode], cwd=root, env=env,
                                  check=True, stdout=subprocess.PIPE, text=True)
            out = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"run {repeat} {name}: {json.dumps(out)} (load {load:.1f})", flush=True)
            rows_out.append({"run": repeat, "order": " > ".join(order), "code": name,
                             "parties side by side": out.get("side_by_side", "-"), "CPU s": out["cpu_s"],
                             "wall s": out["wall_s"], "predict 40k s": out["predict_s"],
                             "messages a round": out.get("messages_per_round", "-"),
                             "proba hash": out.get("proba", "-"), "accuracy": out["accuracy"],
                             "load at start": f"{load:.1f}"})
    return rows_out


def forest_pairs(train: pd.DataFrame, test: pd.DataFrame, depth: int, repeats: int) -> list[dict]:
    """Vertical forest and XGBRFClassifier in turn, `repeats` times: a row per run with the pair's ratio."""
    rows = []
    pairs = interleaved(lambda: run_federated_forest(train, test, depth, node_by_node=False),
                        lambda: run_xgbrf(train, test, depth), repeats)
    for repeat, (ours, reference) in enumerate(pairs):
        print(f"forest run {repeat}: ours {json.dumps(ours)}, XGBRF {json.dumps(reference)}", flush=True)
        rows.append({"run": repeat, "forest train s": ours["fit_s"],
                     "XGBRFClassifier train s": reference["fit_s"],
                     "train ratio (ours / XGBRF)": f"{ours['fit_s'] / reference['fit_s']:.2f}x",
                     "predict 40k s": ours["predict_auto_s"], "XGBRF predict s": reference["predict_s"],
                     "accuracy": ours["accuracy"], "XGBRF accuracy": reference["accuracy"]})
    return rows


def run_xgboost_federated(train: pd.DataFrame, test: pd.DataFrame, depth: int) -> dict:
    """XGBoost's federated vertical mode, 3 workers on loopback (see reference_xgboost_federated.py)."""
    from benchmarks.reference_xgboost_federated import run_xgboost_federated_vertical

    result = run_xgboost_federated_vertical(
        train.drop(columns="y").to_numpy(), train["y"].to_numpy(), test.drop(columns="y").to_numpy(),
        n_parties=3, n_trees=N_TREES, max_depth=depth, seed=0, y_test=test["y"].to_numpy(),
        predict_batch_rows=4000)
    return {"fit_s": result.get("train_s"), "predict_s": result.get("predict_s"),
            "accuracy": result.get("accuracy"), "error": result.get("error")}


def large_run(rows: int, depth: int) -> dict:
    """Fit rows x 40 at `depth` in a child process; its wall time and peak resident memory."""
    code = (
        "import json, resource, sys, time\n"
        "from benchmarks.bench_vertical_speed import make_data, run_federated_forest\n"
        f"train, test = make_data({rows})\n"
        f"out = run_federated_forest(train, test, {depth}, node_by_node=False)\n"
        "out['peak_rss_gib'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20\n"
        "print(json.dumps(out))\n"
    )
    return child_json([sys.executable, "-c", code], quiet=True)


def _ratio(reference: float | None, ours: float) -> str:
    return f"{reference / ours:.2f}x" if reference else "-"


def run_pairs(args: argparse.Namespace) -> None:
    """`--pairs`: ours against XGBoost in turn (with `--before`: two code copies' boosting fits too)."""
    from benchmarks.xgboost_check import require_xgboost

    require_xgboost()
    if args.before:
        rows = boosting_code_pairs(args.rows, args.before, args.repeats, args.concurrent)
    else:
        train, test = make_data(args.rows)
        warm = split_vertical(train.iloc[:2000], 3, label="y")  # load the compiled kernels before timing
        FederatedForestClassifier(n_estimators=2, max_depth=3).fit(warm, label="y").predict(
            [test.iloc[:100][[c for c in p.columns if c != "y"]] for p in warm])
        if args.pairs == "boosting":
            run_federated_boosting(train.iloc[:2000], test.iloc[:100])  # compile the boosting kernels
            rows = boosting_pairs(train, test, args.repeats)
        else:
            rows = forest_pairs(train, test, args.depths[0], args.repeats)
    print("\n" + markdown_table(rows, digits=3))
    print("\n" + machine_line())


def main() -> None:
    """Time vertical training at each depth beside the XGBoost references and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[10, 16])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--skip-xgboost", action="store_true", help="skip both XGBoost references")
    parser.add_argument("--pairs", choices=("boosting", "forest"),
                        help="only issue #32/#34's pairs: vertical boosting (100 rounds, depth 6) against "
                             "XGBoost hist, or the forest (first --depths) against XGBRFClassifier")
    parser.add_argument("--repeats", type=int, default=2, help="pairs run in turn this many times")
    parser.add_argument("--before", metavar="DIR",
                        help="with --pairs boosting: also time the boosting fit of the code copy at DIR (a "
                             "checkout of an earlier commit), each fit in a child process, by CPU and wall")
    parser.add_argument("--concurrent", action="store_true",
                        help="with --before: this code's in-process parties answer side by side")
    parser.add_argument("--skip-1m", action="store_true", help="skip the 1,000,000-row run")
    parser.add_argument("--xgboost-federated-depths", type=int, nargs="*", default=None,
                        help="depths at which to run XGBoost's federated mode (default: all; it takes ~10 "
                             "min at depth 16)")
    args = parser.parse_args()
    if args.pairs and args.skip_xgboost:  # a pair's reference is XGBoost: there is nothing to skip to
        parser.error("--pairs times ours against XGBoost; --skip-xgboost would leave no pair")

    if args.before and args.pairs != "boosting":
        parser.error("--before times boosting fits: give --pairs boosting")
    if args.pairs:
        run_pairs(args)
        return
    train, test = make_data(args.rows)
    warm = split_vertical(train.iloc[:2000], 3, label="y")  # load the compiled kernels before timing
    FederatedForestClassifier(n_estimators=2, max_depth=3).fit(warm, label="y").predict(
        [test.iloc[:100][[c for c in p.columns if c != "y"]] for p in warm])

    rows = []
    for depth in args.depths:
        ff = run_federated_forest(train, test, depth)
        print(f"depth {depth} federated forest: {json.dumps(ff)}", flush=True)
        refs = {"sklearn RF": run_sklearn(train, test, depth)}
        if not args.skip_xgboost:
            refs["XGBoost hist RF (centralized)"] = run_xgboost_hist(train, test, depth)
            if args.xgboost_federated_depths is None or depth in args.xgboost_federated_depths:
                refs["XGBoost federated vertical"] = run_xgboost_federated(train, test, depth)
        rows.append({"depth": depth, "system": "Federated Forest (3 parties, in-process)",
                     "train s": ff["fit_s"], "predict 40k s": ff["predict_one-round_s"],
                     "accuracy": ff["accuracy"], "train ratio": "1.00x", "predict ratio": "1.00x"})
        rows.append({"depth": depth, "system": "  same, node-by-node prediction", "train s": "",
                     "predict 40k s": ff["predict_node-by-node_s"], "accuracy": "", "train ratio": "",
                     "predict ratio": _ratio(ff["predict_node-by-node_s"], ff["predict_one-round_s"])})
        for name, ref in refs.items():
            print(f"depth {depth} {name}: {json.dumps(ref)}", flush=True)
            failed = ref.get("error")
            rows.append({"depth": depth, "system": name,
                         "train s": "failed" if failed else ref["fit_s"],
                         "predict 40k s": "" if failed else ref["predict_s"],
                         "accuracy": "" if failed else ref["accuracy"],
                         "train ratio": "" if failed else _ratio(ref["fit_s"], ff["fit_s"]),
                         "predict ratio": "" if failed else _ratio(ref["predict_s"],
                                                                   ff["predict_one-round_s"])})
            if failed:
                print(f"  {name} failed: {str(failed)[:300]}", flush=True)
        print(f"  federated forest: {ff['nodes']} nodes, {ff['train_rounds']} training rounds, "
              f"{ff['train_mb']:.1f} MiB training traffic, one-round prediction "
              f"{ff['predict_one-round_rounds']} rounds / {ff['predict_one-round_mb']:.1f} MiB", flush=True)

    print("\n" + markdown_table(rows, digits=3))
    if not args.skip_1m:
        big = large_run(1_000_000, 10)
        print(f"\n1,000,000 x 40, depth 10, 3 parties: train {big['fit_s']:.1f} s, predict 200k rows "
              f"{big['predict_auto_s']:.1f} s, peak RSS {big['peak_rss_gib']:.2f} GiB, accuracy "
              f"{big['accuracy']:.4f}")
    print(f"\nMachine: {os.cpu_count()} cores; numpy {np.__version__}")


if __name__ == "__main__":
    main()
