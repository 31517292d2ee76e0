"""Vertical boosting with every party's rows on Dask against the same fit in process (issues #29, #32).

`--parties` parties share `--features` numeric columns of `--rows` rows (a logistic label at the first);
`FederatedBoostingClassifier` fits `--trees` rounds of depth `--depth` in process, then with every party on
one LocalCluster of `--workers` in-process workers (threads, `processes=False`, blocks of `--block-rows`),
the two in turn `--repeats` times. CPU seconds are this process's (the parties, the master, the scheduler
and the workers are all its threads), so their ratio is the Dask party's extra work; the wall times on a
shared machine are noise. Each Dask fit's model is compared with the in-process one, byte for byte.

    .venv/bin/python -m benchmarks.bench_dask_vertical_boosting [--rows 200000] [--features 20]
        [--parties 3] [--trees 10] [--depth 6] [--workers 2] [--block-rows 50000] [--repeats 2]
"""

from __future__ import annotations

import argparse
import hashlib
import time

import numpy as np
import pandas as pd

from benchmarks.harness import add_forest_arguments, interleaved, machine_line
from benchmarks.markdown import markdown_table


def _parties(rows: int, features: int, parties: int) -> list[pd.DataFrame]:
    """The parties' frames: contiguous groups of columns, the label with the first."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, features))
    y = (x @ rng.normal(size=features) + rng.normal(size=rows) > 0).astype(np.int64)
    frames = [pd.DataFrame(x[:, cols], columns=[f"x{c}" for c in cols])
              for cols in np.array_split(np.arange(features), parties)]
    frames[0]["label"] = y
    return frames


def _digest(model) -> str:
    """The master's structure and every party's splits (sha256, 16 hex digits)."""
    h = hashlib.sha256()
    s = model.master_.structure
    for field in ("tree", "node", "left", "right", "owner", "weight", "value"):
        h.update(np.ascontiguousarray(getattr(s, field)).tobytes())
    for party in model.parties_:
        for field in ("feature", "threshold", "missing_left"):
            h.update(np.ascontiguousarray(getattr(party.model, field)).tobytes())
    return h.hexdigest()[:16]


def _fit(args: argparse.Namespace, frames: list[pd.DataFrame], client) -> dict:
    """One fit: wall and CPU seconds of this process, and the model's digest."""
    from fedcore.vertical.boosting_estimators import FederatedBoostingClassifier

    extra = {} if client is None else {"compute": client, "block_rows": args.block_rows}
    model = FederatedBoostingClassifier(n_estimators=args.trees, max_depth=args.depth, random_state=1,
                                        **extra)
    wall, cpu = time.perf_counter(), time.process_time()
    model.fit(frames, label="label")
    return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu, "digest": _digest(model)}


def main() -> None:
    """Fit in process and on Dask in turn; print the table and the machine line."""
    from distributed import Client, LocalCluster

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_forest_arguments(parser, rows=200_000, features=20, trees=10, depth=6, workers=2, block_rows=50_000)
    parser.add_argument("--parties", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    frames = _parties(args.rows, args.features, args.parties)
    with (LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=False,
                       dashboard_address=None) as cluster, Client(cluster, set_as_default=False) as client):
        _fit(args, [f.head(2000) for f in frames], client)  # kernels and cluster warm before timing
        pairs = interleaved(lambda: _fit(args, frames, None), lambda: _fit(args, frames, client),
                            args.repeats)
    print(f"vertical boosting (logistic), {args.rows:,} x {args.features} over {args.parties} parties, "
          f"{args.trees} rounds of depth {args.depth}; Dask: {args.workers} in-process workers, blocks of "
          f"{args.block_rows:,} rows\n")
    print(markdown_table([
        {"pair": i + 1, "in process: wall s, CPU s": f"{a['wall']:.1f}, {a['cpu']:.1f}",
         "Dask: wall s, CPU s": f"{b['wall']:.1f}, {b['cpu']:.1f}",
         "wall ratio": f"{b['wall'] / a['wall']:.2f}",
         "CPU ratio": f"{b['cpu'] / a['cpu']:.2f}", "same model": str(a["digest"] == b["digest"])}
        for i, (a, b) in enumerate(pairs)]))
    print(f"\n{machine_line()}")


if __name__ == "__main__":
    main()
