"""Compile and cache every numba kernel once: `python -m fedcore.warmup` (run by `make venv`).

So that the first demo, simulation or agent is as fast as the second.

Kernels are cached under NUMBA_CACHE_DIR, which fedcore sets to one place for every entry point unless
the user chose one (`fedcore.__init__`). This trains and applies tiny forests of each engine, task and
privacy mode on a small mixed table (numbers, a category, missing values), which compiles each kernel
for the types real data gives it.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pandas as pd


def warm_table(n_rows: int = 240, seed: int = 0) -> pd.DataFrame:
    """A small table with what real tables have: numbers, a category, missing values, two labels."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_rows, 3))
    x[rng.random(n_rows) < 0.05, 0] = np.nan
    colour = pd.Categorical(rng.choice(["red", "green", "blue"], n_rows))
    return pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "colour": colour,
                         "y": (x[:, 1] + x[:, 2] > 0).astype(int), "target": x[:, 1] * 2.0 + x[:, 2]})


def warm_up() -> list[str]:
    """Fit and predict with every engine on `warm_table`; returns what was run."""
    from fedcore.data.split import split_horizontal, split_vertical
    from fedcore.horizontal.estimators import (
        FederatedExtraTreesClassifier,
        FederatedExtraTreesRegressor,
        PPDERTClassifier,
    )
    from fedcore.vertical.estimators import FederatedForestClassifier, FederatedForestRegressor

    table = warm_table()
    classes, values = table.drop(columns=["target"]), table.drop(columns=["y"])
    done = []
    for name, model, frame, label in (
            ("vertical classification", FederatedForestClassifier(n_estimators=2, max_depth=4), classes, "y"),
            ("vertical regression", FederatedForestRegressor(n_estimators=2, max_depth=4), values, "target")):
        fitted = model.fit(split_vertical(frame, 2, label=label), label=label)
        fitted.predict(split_vertical(frame.drop(columns=[label]), 2))
        done.append(name)
    ranges = {c: (float(table[c].min()), float(table[c].max())) for c in ("a", "b", "c")}
    HorizontalEstimator = FederatedExtraTreesClassifier | FederatedExtraTreesRegressor | PPDERTClassifier
    horizontal: list[tuple[str, HorizontalEstimator, pd.DataFrame, str]] = [
        (f"horizontal extra-trees {privacy}",
         FederatedExtraTreesClassifier(n_estimators=2, max_depth=4, privacy=privacy), classes, "y")
        for privacy in ("none", "gdp", "ldp")]
    horizontal += [
        ("horizontal extra-trees regression", FederatedExtraTreesRegressor(n_estimators=2, max_depth=4),
         values, "target"),
        ("horizontal ppd-ert", PPDERTClassifier(n_estimators=2, max_depth=4, feature_ranges=ranges),
         classes, "y")]
    for name, estimator, frame, label in horizontal:
        estimator.fit(split_horizontal(frame, 2, seed=0), label=label).predict(frame.drop(columns=[label]))
        done.append(name)
    return done


def main() -> int:
    """Warm the kernel cache and say where it is and how long it took."""
    import fedcore  # noqa: F401 - sets the default NUMBA_CACHE_DIR

    started = time.perf_counter()
    print(f"fedforest: compiling numba kernels into {os.environ.get('NUMBA_CACHE_DIR')} (once; a few minutes "
          "on a small machine)", file=sys.stderr, flush=True)
    done = warm_up()
    print(f"fedforest: kernels ready for {len(done)} engine modes in {time.perf_counter() - started:.0f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
