"""Compile and cache every numba kernel once: `python -m fedcore.warmup` (run by `make venv`).

So that the first demo, simulation or agent is as fast as the second.

Kernels are cached under NUMBA_CACHE_DIR, which fedcore sets to one place for every entry point unless
the user chose one (`fedcore.__init__`). This trains and applies tiny forests of each engine, task and
privacy mode on a small mixed table (numbers, a category, missing values), which compiles each kernel
for the types real data gives it.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
import pandas as pd


def warm_table(n_rows: int = 240, seed: int = 0) -> pd.DataFrame:
    """A small table with what real tables have: numbers, a category, missing values, three labels.

    `y` has two classes, `class3` three (boosting's softmax kernels), `target` is a number.
    """
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_rows, 3))
    x[rng.random(n_rows) < 0.05, 0] = np.nan
    colour = pd.Categorical(rng.choice(["red", "green", "blue"], n_rows))
    return pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "colour": colour,
                         "y": (x[:, 1] + x[:, 2] > 0).astype(int), "target": x[:, 1] * 2.0 + x[:, 2],
                         "class3": np.digitize(x[:, 1] - x[:, 2], [-0.5, 0.5])})


MEASURED_S = 100
"""Seconds a cold warm-up takes on two cores: `rm -rf .numba_cache && time python -m fedcore.warmup` gave 80 s
wall, 68 s CPU, for the seven forest modes on a shared two-core machine (the first engine mode compiles the
shared kernels: half); with the two boosting modes, all nine took 95 s of CPU (151 s wall with tests
running beside it), the horizontal boosting kernels about 19 s of it. Since the two settings compile side
by side (`warm_up_side_by_side`), the wall time is about the vertical modes' alone (not re-measured on a
quiet machine: the estimate is kept)."""


def warm_steps() -> list[tuple[str, Callable[[], object]]]:
    """Each engine mode's kernel group, as (name, fit and predict tiny forests on `warm_table`).

    Each step also predicts a single row: a column-major table of one row is C-contiguous too, which numba
    types as another array layout, so the prediction kernels compiled again for it (an online scorer's first
    one-row request paid seconds; so did the suite's one-row cases).
    """
    from fedcore.data.split import split_horizontal, split_vertical
    from fedcore.horizontal.boosting.estimators import HorizontalBoostingClassifier
    from fedcore.horizontal.estimators import (
        FederatedExtraTreesClassifier,
        FederatedExtraTreesRegressor,
        PPDERTClassifier,
    )
    from fedcore.vertical.boosting_estimators import FederatedBoostingClassifier
    from fedcore.vertical.estimators import FederatedForestClassifier, FederatedForestRegressor

    table = warm_table()
    classes, values = table.drop(columns=["target", "class3"]), table.drop(columns=["y", "class3"])
    three_classes = table.drop(columns=["y", "target"])

    VerticalEstimator = FederatedForestClassifier | FederatedForestRegressor | FederatedBoostingClassifier

    def vertical(model: VerticalEstimator, frame: pd.DataFrame, label: str) -> Callable[[], object]:
        def fit_and_predict() -> object:
            fitted = model.fit(split_vertical(frame, 2, label=label), label=label)
            features = frame.drop(columns=[label])
            fitted.predict(split_vertical(features.head(1), 2))  # one row: see warm_steps
            return fitted.predict(split_vertical(features, 2))
        return fit_and_predict

    HorizontalEstimator = (FederatedExtraTreesClassifier | FederatedExtraTreesRegressor | PPDERTClassifier
                           | HorizontalBoostingClassifier)

    def horizontal(model: HorizontalEstimator, frame: pd.DataFrame, label: str) -> Callable[[], object]:
        def fit_and_predict() -> object:
            fitted = model.fit(split_horizontal(frame, 2, seed=0), label=label)
            fitted.predict(frame.drop(columns=[label]).head(1))  # one row: see warm_steps
            return fitted.predict(frame.drop(columns=[label]))
        return fit_and_predict

    ranges = {c: (float(table[c].min()), float(table[c].max())) for c in ("a", "b", "c")}
    steps = [("vertical classification",
              vertical(FederatedForestClassifier(n_estimators=2, max_depth=4), classes, "y")),
             ("vertical regression",
              vertical(FederatedForestRegressor(n_estimators=2, max_depth=4), values, "target"))]
    # gdp: the default plan (leaves) with one chosen level, so both its paths compile: the noisy-count
    # splits of plan splits and the drawn levels and leaf release of plan leaves
    gdp_both_paths = {"mode": "gdp", "plan": "leaves", "split_levels": 1}
    steps += [(f"horizontal extra-trees {name}",
               horizontal(FederatedExtraTreesClassifier(n_estimators=2, max_depth=4, privacy=privacy,
                                                        feature_ranges=ranges), classes, "y"))
              for name, privacy in (("none", "none"), ("gdp", gdp_both_paths), ("ldp", "ldp"))]
    steps += [("horizontal extra-trees regression",
               horizontal(FederatedExtraTreesRegressor(n_estimators=2, max_depth=4), values, "target")),
              ("horizontal ppd-ert",
               horizontal(PPDERTClassifier(n_estimators=2, max_depth=4, feature_ranges=ranges), classes,
                          "y")),
              ("vertical boosting",
               vertical(FederatedBoostingClassifier(n_estimators=2, max_depth=3), classes, "y")),
              ("horizontal boosting",
               # three classes: softmax, whose loss kernels the vertical label holder shares
               horizontal(HorizontalBoostingClassifier(n_estimators=2, max_depth=3, feature_ranges=ranges),
                          three_classes, "class3")),
              # last: side by side, the horizontal process runs it after its own steps, when the vertical
              # kernels it shares are cached by the other process (`setting_groups`)
              ("vertical forest on dask", lambda: on_dask(lambda client: vertical(
                  FederatedForestClassifier(n_estimators=2, max_depth=4, compute=client, block_rows=100),
                  classes, "y")()))]
    return steps


def on_dask(fit: Callable[[Any], object]) -> object:
    """`fit(client)` on a one-worker LocalCluster in this process, so the Dask party's block kernels compile.

    They run only on Dask workers (`fedcore.compute.dask_vertical`); left cold, every worker process of
    every party compiled them at once in its first tree level (issue #29).
    """
    from distributed import Client, LocalCluster

    with (LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster,
          Client(cluster, set_as_default=False) as client):
        return fit(client)


def warm_up(report: Callable[[int, int, str, float | None], None] | None = None,
            only: tuple[str, ...] | None = None) -> list[str]:
    """Fit and predict with every engine on `warm_table` (or the steps named in `only`); returns what was run.

    `report(index, count, name, seconds)` is called as each group starts (seconds None) and when it is done;
    index and count number the whole list of steps, so a subset's reports still say `[3/9]`.
    """
    steps = warm_steps()
    done = []
    for index, (name, step) in enumerate(steps, start=1):
        if only is not None and name not in only:
            continue
        if report:
            report(index, len(steps), name, None)
        started = time.perf_counter()
        step()
        if report:
            report(index, len(steps), name, time.perf_counter() - started)
        done.append(name)
    return done


def setting_groups(names: list[str]) -> list[tuple[str, ...]]:
    """The warm-up in two groups of about equal compile time, each in the order given.

    The first holds the vertical steps fitted in process; the second the horizontal steps, then the vertical
    forest on Dask.

    The settings share no kernel (numba's compile events over a cold warm-up, 2026-11-29): the in-process
    vertical steps took 74 s of CPU (42 s of it `_direct_splits`), the horizontal ones 54 s and the Dask step
    about 18 s; split by setting, the vertical process took 91 s on a fresh clone, the horizontal one 47 s.
    Last in the horizontal process (it is the last of `warm_steps`, whose order each group keeps), the Dask
    step finds most vertical kernels it shares already cached by the other process; the two prediction
    kernels (`own_split_sets`, `_threshold_bitmaps`) it may compile as well when it predicts first (under
    load: 84 s and 91 s of CPU per process, both included). Run first there, it compiled the shared
    kernels beside the vertical process: 55 s, the warm-up 98 s.
    """
    in_process = tuple(name for name in names if name.startswith("vertical") and not name.endswith("on dask"))
    horizontal = tuple(name for name in names if name.startswith("horizontal"))
    on_dask = tuple(name for name in names if name.startswith("vertical") and name.endswith("on dask"))
    return [in_process, horizontal + on_dask]


def warm_processes() -> int:
    """How many warm-up processes: one per setting when the machine has two cores or more, else one."""
    return min(2, os.cpu_count() or 1)


def _warm_group(names: tuple[str, ...]) -> list[str]:
    """One process's share of the warm-up: its steps, each reported on one whole line when done."""
    return warm_up(_print_done, only=names)


def warm_up_side_by_side(processes: int) -> list[str]:
    """The warm-up in one process per setting (at most `processes`) when the machine has the cores.

    A fresh clone's `make venv` otherwise compiles on one core while the other waits. Both processes write
    the same numba cache, as pytest's workers do; each writes a kernel's index atomically.
    """
    groups = setting_groups([name for name, _ in warm_steps()])
    if processes < 2:
        return warm_up(_print_step)
    context = multiprocessing.get_context("spawn")  # no forked numba or OpenMP state
    with ProcessPoolExecutor(max_workers=min(processes, len(groups)), mp_context=context) as pool:
        done = [name for names in pool.map(_warm_group, groups) for name in names]
    return done


def _print_step(index: int, count: int, name: str, seconds: float | None) -> None:
    """`fedforest: [3/7] horizontal extra-trees none ... 12 s`: the name as it starts, its time when done."""
    if seconds is None:
        print(f"fedforest: [{index}/{count}] {name} ...", end="", file=sys.stderr, flush=True)
    else:
        print(f" {seconds:.0f} s", file=sys.stderr, flush=True)


def _print_done(index: int, count: int, name: str, seconds: float | None) -> None:
    """`fedforest: [3/9] horizontal extra-trees none ... 12 s`, a whole line when done (stderr is shared)."""
    if seconds is not None:
        print(f"fedforest: [{index}/{count}] {name} ... {seconds:.0f} s", file=sys.stderr, flush=True)


def _minutes(seconds: float) -> str:
    """`2 minutes`, `1 minute`, `40 s`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{round(seconds / 60)} minutes"


def main() -> int:
    """Warm the kernel cache, saying which engine mode compiles, where the cache is and how long it took."""
    import fedcore  # noqa: F401 - sets the default NUMBA_CACHE_DIR

    started = time.perf_counter()
    processes = warm_processes()
    order = "the vertical and the horizontal modes side by side" if processes > 1 else "one after another"
    print(f"fedforest: compiling the numba kernels into {os.environ.get('NUMBA_CACHE_DIR')}, {order} (the "
          f"first time only: about {_minutes(MEASURED_S)} on two cores; seconds once cached)",
          file=sys.stderr, flush=True)
    done = warm_up_side_by_side(processes)
    print(f"fedforest: kernels ready for {len(done)} engine modes in {time.perf_counter() - started:.0f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
