"""Training at scale with the default settings.

Rows x 40 features, 100 trees, depth 10, 3 parties in-process (vertical Federated Forest or horizontal FET),
batches planned from the memory budget.

Each run is a child process, so its peak resident memory (ru_maxrss) is its own. Reports the fit time,
the planned batches, the peak memory and the data's own size, and checks the planner's estimate: the
growth state (peak minus the memory held before fitting) per tree of a batch and row.

    .venv/bin/python -m benchmarks.bench_memory --rows 10000000 [--setting vertical] [--trees 100]
        [--depth 10] [--budget-mb N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from benchmarks.harness import child_json

CHILD = r"""
import json, resource, time
import numpy as np, pandas as pd

rows, features, trees, depth, setting, budget = {rows}, {features}, {trees}, {depth}, {setting!r}, {budget}
rng = np.random.default_rng(0)
columns = {{f"f{{i:02d}}": rng.standard_normal(rows, dtype=np.float32) for i in range(features)}}
signal = sum(columns[f"f{{i:02d}}"] * (1.0 / (1 + i)) for i in range(features // 4))
label = (signal + 0.5 * rng.standard_normal(rows, dtype=np.float32) > 0).astype(np.int8)
if setting == "vertical":
    from fedcore.vertical.estimators import FederatedForestClassifier as Model
    names = list(columns)
    parties = [pd.DataFrame({{n: columns.pop(n) for n in names[i::3]}}) for i in range(3)]
    parties[0]["y"] = label
else:
    from fedcore.horizontal import FederatedExtraTreesClassifier as Model
    frame = pd.DataFrame(columns)
    frame["y"] = label
    columns.clear()
    cuts = [0, rows // 3, 2 * rows // 3, rows]
    parties = [frame.iloc[a:b].reset_index(drop=True) for a, b in zip(cuts[:-1], cuts[1:])]
    del frame
data_gib = sum(p.memory_usage(deep=True).sum() for p in parties) / 2**30
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
model = Model(n_estimators=trees, max_depth=depth, random_state=0, memory_budget_mb=budget)
started = time.perf_counter()
model.fit(parties, label="y")
fit_s = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
grower = model.master_.grower
print(json.dumps({{"setting": setting, "rows": rows, "fit_s": fit_s, "batch_size": grower.batch_size,
                  "batches": len(grower.batches()), "data_gib": data_gib, "before_fit_gib": before,
                  "peak_rss_gib": peak,
                  "growth_bytes_per_tree_row": (peak - before) * 2**30 / (grower.batch_size * rows)}}))
"""


def run(rows: int, features: int, trees: int, depth: int, setting: str, budget: int | None) -> dict:
    """One fit in a child process: its JSON summary."""
    code = CHILD.format(rows=rows, features=features, trees=trees, depth=depth, setting=setting,
                        budget=budget)
    try:
        return child_json([sys.executable, "-c", code], quiet=True)
    except subprocess.CalledProcessError as failed:
        return {"setting": setting, "rows": rows, "error": failed.stderr.strip().splitlines()[-1:]}


def main() -> None:
    """Run each setting in a child process and print its time and peak memory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--features", type=int, default=40)
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--depth", type=int, default=10)
    parser.add_argument("--setting", nargs="+", default=["vertical", "horizontal"])
    parser.add_argument("--budget-mb", type=int, default=None,
                        help="memory_budget_mb (default: the planner's)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = [run(args.rows, args.features, args.trees, args.depth, s, args.budget_mb) for s in args.setting]
    for r in results:
        print(json.dumps(r))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
