"""The horizontal party on a Dask cluster against the in-process party (issue #29).

One institution, a horizontal FET fit (privacy none) of `--rows` x `--features`, `--trees` trees of depth
`--depth` (`--algorithm boosting`: horizontal boosting, `--trees` rounds, its bins cut from the declared
domain [-6, 6] of every feature), twice, each in its own process so that peak memory is its own:

* in process: the agent process reads the table and holds the party's rows (today's party);
* on Dask: a LocalCluster of `--workers` worker processes (one thread each, numba single-threaded, so
  the cluster uses the same cores as the in-process party's numba threads); the workers read their
  blocks from a Parquet dataset themselves, and the agent process only holds a 1,000-row sample for the
  schema (a deployment gets it from the data contracts) and the level's small arrays.

Reports time per tree and the ratio, the CPU seconds of the fit (the agent process's, plus on Dask every
worker process's: a loaded machine's wall times are noise), the per-level scheduling overhead (p50 / p95
over levels: a level's wall time at the agent minus, per round, the busiest worker's compute time on that
round's tasks, from Dask's task stream; boosting: per round of block tasks), the agent's peak RSS and each
worker's, and whether both forests are the same.

    .venv/bin/python -m benchmarks.bench_dask_party [--rows 2000000] [--features 20] [--trees 20]
        [--depth 8] [--workers 2] [--block-rows 250000] [--algorithm boosting]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.harness import add_forest_arguments, child_json
from benchmarks.markdown import markdown_table


def write_dataset(folder: Path, rows: int, features: int, row_group: int, ids: bool = False) -> None:
    """A synthetic classification table as 4 Parquet files of `row_group`-row groups (written in pieces).

    Its first 1,000 rows also go to `sample_path(folder)`, outside the dataset: the agent's schema sample
    (reading it from the dataset would decode a whole row group, `row_group` rows, in the agent). `ids`:
    a first column `pid`, the row's position (an agent's ID column).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    weights = rng.normal(size=features)
    per_file = -(-rows // 4)
    schema = _schema(features, ids)
    for index in range(4):
        n = min(per_file, rows - index * per_file)
        with pq.ParquetWriter(folder / f"part-{index}.parquet", schema) as writer:
            for start in range(0, n, row_group):
                m = min(row_group, n - start)
                x = rng.normal(size=(m, features))
                y = np.where(x @ weights + rng.normal(size=m) > 0, "yes", "no")
                first = {"pid": np.arange(m) + index * per_file + start} if ids else {}
                table = pa.table({**first, **{f"f{j}": x[:, j] for j in range(features)}, "y": y})
                writer.write_table(table.cast(schema), row_group_size=row_group)
                if index == 0 and start == 0:
                    pq.write_table(table.slice(0, 1000).cast(schema), sample_path(folder))


def sample_path(folder: Path) -> Path:
    """Where `write_dataset` puts its 1,000-row schema sample, beside the dataset folder."""
    return Path(folder).with_name(Path(folder).name + "-sample.parquet")


def _schema(features: int, ids: bool = False):
    import pyarrow as pa

    fields = [pa.field(f"f{j}", pa.float64()) for j in range(features)]
    return pa.schema([*([pa.field("pid", pa.int64())] if ids else []), *fields, pa.field("y", pa.string())])


def _peak_rss_mib() -> float:
    """This process's own peak RSS (`_vm_hwm_mib`).

    Not getrusage's ru_maxrss: on Linux a child's starts at its parent's peak at fork (it survives exec), so
    it reported the dataset writer's ~1.1 GiB as the agent's at 10M x 40 (issue #29).
    """
    return _vm_hwm_mib()


def _estimator(args: argparse.Namespace) -> type:
    """The benchmark's classifier class: FET, or horizontal boosting (`--algorithm boosting`)."""
    from fedcore.horizontal import FederatedExtraTreesClassifier
    from fedcore.horizontal.boosting import HorizontalBoostingClassifier

    return HorizontalBoostingClassifier if args.algorithm == "boosting" else FederatedExtraTreesClassifier


def _model(args: argparse.Namespace, cls: type | None = None, **kwargs):
    """The benchmark's classifier (`cls`: a subclass of `_estimator`), `args.trees` trees of `args.depth`."""
    if args.algorithm == "boosting":  # bins from declared domains: the same for the sample and the table
        kwargs["feature_ranges"] = {f"f{j}": (-6.0, 6.0) for j in range(args.features)}
    else:
        kwargs["max_features"] = "sqrt"
    return (cls or _estimator(args))(n_estimators=args.trees, max_depth=args.depth, random_state=1, **kwargs)


def _cpu_seconds() -> float:
    """This process's CPU time so far (user + system, every thread)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _digest(model) -> str:
    h = hashlib.sha256()
    for name, value in sorted(model.model_.arrays().items()):
        h.update(name.encode() + np.ascontiguousarray(value).tobytes())
    return h.hexdigest()[:16]


def run_in_process(args: argparse.Namespace) -> dict:
    """Today's party: the agent process reads the table and holds every row."""
    frame = pd.read_parquet(args.data)
    start = _cpu_seconds()
    model = _model(args).fit([frame], label="y")
    return {"seconds": model.fit_seconds_, "digest": _digest(model), "agent_peak_mib": _peak_rss_mib(),
            "cpu_s": _cpu_seconds() - start}


def fit_from_parquet(args: argparse.Namespace, client):
    """A FET fit whose party's rows are `args.data`'s blocks, read by the workers of `client` themselves.

    The agent process holds a 1,000-row sample (the schema's columns; a deployment gets them from its data
    contract) and the level's small arrays. Returns the fitted model and its `DaskPartyRows`.
    """
    from fedcore.compute.dask_rows import DaskPartyRows

    made: list[DaskPartyRows] = []

    class FromParquet(_estimator(args)):  # type: ignore[misc]
        def _rows(self, name, frame, schema):
            rows = DaskPartyRows.from_parquet(name, args.data, schema, self._cluster.client, args.block_rows)
            made.append(rows)
            return {"frame": None, "rows": rows}

    sample = pd.read_parquet(sample_path(args.data))
    model = _model(args, FromParquet, compute=client)
    model.fit([sample], label="y")
    return model, model.parties_[0].rows if args.algorithm == "boosting" else made[0]


def run_on_dask(args: argparse.Namespace) -> dict:
    """The party's rows on a LocalCluster whose workers read the Parquet dataset themselves."""
    from distributed import Client, LocalCluster, get_task_stream

    cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                           dashboard_address=":0", env={"NUMBA_NUM_THREADS": "1"})
    client = Client(cluster)
    workers_cpu = client.run(_cpu_seconds)
    agent_cpu = _cpu_seconds()
    with get_task_stream(client) as stream:
        model, rows = fit_from_parquet(args, client)
    agent_cpu = _cpu_seconds() - agent_cpu
    worker_cpu = sum(seconds - workers_cpu.get(worker, 0.0)
                     for worker, seconds in client.run(_cpu_seconds).items())
    workers_peak = client.run(lambda: _vm_hwm_mib())
    busy: dict[str, dict[str, float]] = {}
    transfers = sum(1 for task in stream.data for s in task["startstops"] if s["action"] == "transfer")
    for task in stream.data:
        compute = sum(s["stop"] - s["start"] for s in task["startstops"] if s["action"] == "compute")
        busy.setdefault(task["key"], {})[task["worker"]] = compute
    overheads = []
    for wall, keys in rows.rounds:
        per_worker: dict[str, float] = {}
        for key in keys:
            for worker, seconds in busy.get(key, {}).items():
                per_worker[worker] = per_worker.get(worker, 0.0) + seconds
        overheads.append(wall - max(per_worker.values(), default=0.0))
    levels = (overheads if args.algorithm == "boosting"  # per round of block tasks
              else [a + b for a, b in zip(overheads[0::2], overheads[1::2], strict=False)])  # ranges + counts
    result = {"seconds": model.fit_seconds_, "digest": _digest(model), "agent_peak_mib": _peak_rss_mib(),
              "cpu_s": agent_cpu + worker_cpu, "agent_cpu_s": agent_cpu, "workers_cpu_s": worker_cpu,
              "workers_peak_mib": sorted(workers_peak.values()), "blocks": len(rows.blocks),
              "levels": len(levels), "tasks": len(stream.data), "transfers": transfers,
              "overhead_p50_ms": 1000 * float(np.percentile(levels, 50)),
              "overhead_p95_ms": 1000 * float(np.percentile(levels, 95))}
    client.close()
    cluster.close()
    return result


def _vm_hwm_mib() -> float:
    """This process's peak resident memory (Linux VmHWM), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    """Write the table, run both parties (each in its own process), print the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_forest_arguments(parser, rows=2_000_000, features=20, trees=20, depth=8, workers=2,
                         block_rows=250_000)
    parser.add_argument("--algorithm", choices=("extra-trees", "boosting"), default="extra-trees")
    parser.add_argument("--mode", choices=("in-process", "dask"), help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:  # one measured run, in its own process
        run = run_in_process if args.mode == "in-process" else run_on_dask
        print(json.dumps(run(args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "table"
        write_dataset(data, args.rows, args.features, args.block_rows)
        results = {}
        for mode in ("in-process", "dask"):
            command = [sys.executable, "-m", "benchmarks.bench_dask_party", *sys.argv[1:], "--mode", mode,
                       "--data", str(data)]
            results[mode] = child_json(command, quiet=True)
    ref, dask = results["in-process"], results["dask"]
    print(f"{args.algorithm}, {args.rows:,} x {args.features}, {args.trees} trees, depth {args.depth}; "
          f"{platform.processor()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
          f"{args.workers} workers, {dask['blocks']} blocks of {args.block_rows:,} "
          "rows\n")
    print(markdown_table([
        {"party": "in process (reference)", "s per tree": f"{ref['seconds'] / args.trees:.2f}",
         "ratio": "1.00", "CPU s": f"{ref['cpu_s']:.1f}", "CPU ratio": "1.00",
         "agent peak RSS (MiB)": f"{ref['agent_peak_mib']:.0f}", "workers' peak RSS (MiB)": "-",
         "forest digest": ref["digest"]},
        {"party": f"Dask, {args.workers} workers", "s per tree": f"{dask['seconds'] / args.trees:.2f}",
         "ratio": f"{dask['seconds'] / ref['seconds']:.2f}", "CPU s": f"{dask['cpu_s']:.1f}",
         "CPU ratio": f"{dask['cpu_s'] / ref['cpu_s']:.2f}",
         "agent peak RSS (MiB)": f"{dask['agent_peak_mib']:.0f}",
         "workers' peak RSS (MiB)": ", ".join(f"{m:.0f}" for m in dask["workers_peak_mib"]),
         "forest digest": dask["digest"]}]))
    what = ("per-round", "rounds of block tasks") if args.algorithm == "boosting" else ("per-level", "levels")
    print(f"\nCPU s on Dask: the agent process (client and scheduler) {dask['agent_cpu_s']:.1f}, the workers "
          f"{dask['workers_cpu_s']:.1f}")
    print(f"\n{what[0]} scheduling overhead over {dask['levels']} {what[1]}: "
          f"p50 {dask['overhead_p50_ms']:.1f} ms, p95 {dask['overhead_p95_ms']:.1f} ms; same forest: "
          f"{ref['digest'] == dask['digest']}; {dask['tasks']} tasks, {dask['transfers']} transfers between "
          "workers")


if __name__ == "__main__":
    main()
