"""Small tables, first fit of a fresh process included: FET and PPD-ERT beside scikit-learn's ExtraTrees.

Issue #34's targets, 3 parties, 50 trees, fully grown: on UCI letter (`--data letter.parquet --label lettr`)
FET plain <= 1.5x and PPD-ERT (histogram thresholds) <= 2x ExtraTrees(n_jobs=-1); on an all-categorical
table (`--categorical`: about 8,000 rows x 22 string columns, built here like UCI mushroom) FET <= 2x
ExtraTrees on its one-hot encoding. The federated engines see the strings as categorical columns (codes in
the agreed category lists); ExtraTrees sees one 0/1 column per category.

Round 1 is the process's first fit of each engine (numba's start-up and its kernels' cache loading, pandas'
and scikit-learn's first calls included); rounds 2.. run the engines in turns in the warm process. Reported:
round 1 alone and the medians of the later rounds, wall and process CPU seconds (all threads), each as a
ratio to ExtraTrees of the same round.

Round 1 also pays Python compiling the source of every module imported late (numba's own, on its first
kernel) when no bytecode is cached: with PYTHONDONTWRITEBYTECODE set and a venv installed without .pyc files
(`pip install --no-compile`, as `make venv` does) that is every process, about 0.4 s of CPU more on the first
kernel than a user's process sees once Python has written the bytecode. The summary line says which; for a
read-only venv, `PYTHONPYCACHEPREFIX=<dir>` without PYTHONDONTWRITEBYTECODE keeps the bytecode elsewhere.

    .venv/bin/python -m benchmarks.bench_small_tables --data letter.parquet --label lettr [--repeat 3]
    .venv/bin/python -m benchmarks.bench_small_tables --categorical [--rows 8000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.bench_horizontal_engines import _timed, engines
from benchmarks.markdown import markdown_table
from fedcore.data.io import read_table
from fedcore.data.split import split_horizontal
from fedcore.simulation import split_train_test

REFERENCE = "ExtraTrees (sklearn, n_jobs=-1)"
CHOSEN = (REFERENCE, "FET", "PPD-ERT (secure aggregation, histogram thresholds)")
CATEGORY_COUNTS = (6, 4, 10, 2, 9, 2, 2, 2, 12, 2, 5, 4, 4, 9, 9, 2, 4, 3, 5, 9, 6, 7)
"""Categories of the 22 columns, about as many as UCI mushroom's (118 one-hot columns)."""


def categorical_table(rows: int, seed: int = 0) -> pd.DataFrame:
    """A mushroom-like table: 22 one-letter string columns (pandas Categorical) and a label `class` (e / p).

    Each column's category frequencies depend on the label (a few columns strongly, like mushroom's odor,
    most weakly), and columns of one row share a hidden cluster, so trees need several levels.
    """
    rng = np.random.default_rng(seed)
    label = rng.random(rows) < 0.48
    cluster = rng.integers(0, 6, rows)
    frame = {}
    for j, n in enumerate(CATEGORY_COUNTS):
        strength = 3.0 if j in (4, 19) else 0.6
        logits = rng.normal(size=(2, 6, n))  # (label, cluster, category)
        logits[1] += strength * rng.normal(size=n)  # poisonous shifts the frequencies
        p = np.exp(logits[label.astype(int), cluster])
        p /= p.sum(axis=1, keepdims=True)
        codes = (p.cumsum(axis=1) < rng.random((rows, 1))).sum(axis=1)
        letters = list("abcdefghijkl"[:n])  # the agreed category list every institution declares
        frame[f"c{j:02d}"] = pd.Categorical(np.array(letters)[np.minimum(codes, n - 1)], categories=letters)
    frame["class"] = pd.Series(np.where(label, "p", "e"), dtype=object)
    return pd.DataFrame(frame)


def main() -> None:
    """Fit ExtraTrees, FET and PPD-ERT in turns; print round 1 and the later rounds' medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path)
    parser.add_argument("--label")
    parser.add_argument("--categorical", action="store_true", help="the generated mushroom-like table")
    parser.add_argument("--rows", type=int, default=8000)
    parser.add_argument("--parties", type=int, default=3)
    parser.add_argument("--trees", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from sklearn.ensemble import ExtraTreesClassifier

    if args.categorical:
        table, label, name = categorical_table(args.rows), "class", f"mushroom-like ({args.rows} rows)"
    else:
        table, label, name = read_table(args.data), args.label, args.data.name
    train, test = split_train_test(table, label, "classification", 0.2, seed=0)
    parties = split_horizontal(train, args.parties, seed=0)
    encoded = pd.get_dummies(pd.concat([train, test]).drop(columns=label), dtype=float)
    X, X_test = encoded.iloc[:len(train)].to_numpy(), encoded.iloc[len(train):].to_numpy()
    y, y_test = train[label].to_numpy(), test[label].to_numpy()
    makers = {n: make for n, make in engines(args.trees).items() if n in CHOSEN}
    runs: dict[str, list[tuple[float, float]]] = {n: [] for n in makers}
    accuracy = {}
    for _ in range(args.repeat):
        for engine, make in makers.items():
            if make is None:
                model = ExtraTreesClassifier(n_estimators=args.trees, n_jobs=-1, random_state=0)
                runs[engine].append(_timed(model.fit, X, y))
                accuracy[engine] = float((model.predict(X_test) == y_test).mean())
            else:
                model = make()
                runs[engine].append(_timed(model.fit, parties, label=label))
                accuracy[engine] = float((model.predict(test.drop(columns=label)) == y_test).mean())
            print(f"{engine}: {runs[engine][-1][0]:.2f} s, CPU {runs[engine][-1][1]:.2f} s", flush=True)
    bytecode = "not written (PYTHONDONTWRITEBYTECODE)" if sys.dont_write_bytecode else "written and reused"
    print(f"\n{platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; {name}: "
          f"{len(train)} training rows x {table.shape[1] - 1} columns ({X.shape[1]} for ExtraTrees), "
          f"{len(np.unique(y))} classes, {args.parties} parties, {args.trees} trees, fully grown, "
          f"{args.repeat} rounds; Python bytecode {bytecode}\n")
    print(markdown_table([_row(engine, runs, accuracy[engine]) for engine in makers], digits=2))


def _row(engine: str, runs: dict[str, list[tuple[float, float]]], accuracy: float) -> dict:
    """An engine's round 1 and later rounds (median), wall and CPU, with their ratios to ExtraTrees."""
    mine, base = np.array(runs[engine]), np.array(runs[REFERENCE])
    row: dict = {"engine": engine, "accuracy": f"{accuracy:.3f}"}
    for label, rounds in (("round 1", slice(0, 1)), ("later", slice(1, None))):
        if len(mine[rounds]) == 0:
            continue
        for k, clock in enumerate(("wall", "CPU")):
            row[f"{label} {clock} s"] = float(np.median(mine[rounds, k]))
            row[f"{label} {clock} x ET"] = float(np.median(mine[rounds, k] / base[rounds, k]))
    return row


if __name__ == "__main__":
    main()
