"""Issue #29's scale and recovery targets for a horizontal party on Dask.

`scale`: under a per-process memory limit L, how many rows the in-process party trains within L (its peak
RSS measured at two sizes, then at the estimate of a line through the last two sizes run, until the
estimate repeats: the most rows that stayed within L), and a party of `--factor` times those rows on a
LocalCluster of `--workers` worker processes, each limited to L by Dask
(a worker over its limit is restarted by its nanny: the run reports whether any was). Reports rows, time,
the peak RSS of the agent process and of each worker, and the forest digest of the in-process run against
the Dask run of the same rows (where both fit).

`recovery`: the same forest on a LocalCluster of `--workers` worker processes, once undisturbed and once with
one worker process killed (SIGKILL) after `--kill-after` of the undisturbed run's time; Dask's nanny starts
a new worker and the lost blocks are rebuilt from their lineage (the Parquet row groups read again, the
levels replayed). Reports both times, the extra time, and whether both forests are the in-process one.

    .venv/bin/python -m benchmarks.bench_dask_scale scale [--limit 2GiB] [--features 20] [--factor 5]
        [--workers 4] [--trees 4] [--depth 8] [--block-rows 250000]
    .venv/bin/python -m benchmarks.bench_dask_scale recovery [--rows 2000000] [--features 20] [--workers 2]
        [--trees 6] [--depth 8] [--kill-after 0.5]
    .venv/bin/python -m benchmarks.bench_dask_scale --setting vertical [--limit 2GiB] [--features 20]
        [--parties 3] [--factor 5] [--workers 2] [--trees 4] [--depth 8] [--block-rows 250000]

`--setting vertical` (`benchmarks/vertical_parties.py`) is `scale` for a vertical session, every party's
agent its own process over Flight: the rows at which the largest in-process agent (reading its whole table)
stays within L, found as `scale` finds them, then every party on its own LocalCluster of `--workers`
workers of L, reading its Parquet metadata only, at those rows and at `--factor` times them; time to align
and per tree, each agent's and worker's peak RSS, and whether the forests are the same. `scale` and
`recovery` are horizontal.

Each measured run is its own process (its peak RSS is its own); the tables go to stdout as Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.bench_dask_party import (
    _digest,
    _peak_rss_mib,
    _vm_hwm_mib,
    fit_from_parquet,
    run_in_process,
    write_dataset,
)
from benchmarks.harness import add_forest_arguments, child_json
from benchmarks.markdown import markdown_table
from benchmarks.vertical_parties import run_in_process as vertical_in_process
from benchmarks.vertical_parties import run_on_dask as vertical_on_dask
from benchmarks.vertical_parties import write_parties


def _cluster(args: argparse.Namespace, memory_limit: str | int | None):
    from distributed import Client, LocalCluster

    from fedcore.compute.cluster import agent_dask_config

    agent_dask_config()  # as an agent's own cluster (`fedcore.compute.cluster._connect`)
    cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                           dashboard_address=":0", memory_limit=memory_limit or "auto",
                           env={"NUMBA_NUM_THREADS": "1"})
    return cluster, Client(cluster)


def _worker_pids(client) -> dict[str, int]:
    return client.run(os.getpid)


# -- measured runs, each in its own process -------------------------------------------------------------
def run_on_dask(args: argparse.Namespace) -> dict:
    """The Dask party on `args.data`, workers limited to `args.limit`: time, digest, peaks, restarts."""
    cluster, client = _cluster(args, args.limit)
    before = _worker_pids(client)
    model, rows = fit_from_parquet(args, client)
    after = _worker_pids(client)
    peaks = client.run(_vm_hwm_mib)
    result = {"seconds": model.fit_seconds_, "digest": _digest(model), "agent_peak_mib": _peak_rss_mib(),
              "workers_peak_mib": sorted(peaks.values()), "blocks": len(rows.blocks),
              "restarted": sorted(set(before.items()) ^ set(after.items())) != []}
    client.close()
    cluster.close()
    return result


def run_with_a_kill(args: argparse.Namespace) -> dict:
    """The Dask party with one worker process killed after `args.kill_at` seconds of the fit."""
    cluster, client = _cluster(args, None)
    pids = _worker_pids(client)
    killed: list[int] = []

    def kill() -> None:
        time.sleep(args.kill_at)
        pid = pids[sorted(pids)[0]]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    model, _ = fit_from_parquet(args, client)
    thread.join(timeout=0)
    result = {"seconds": model.fit_seconds_, "digest": _digest(model), "killed": bool(killed),
              "workers_after": len(client.scheduler_info()["workers"])}
    client.close()
    cluster.close()
    return result


def run_undisturbed(args: argparse.Namespace) -> dict:
    """The Dask party, no worker lost (the recovery's reference time)."""
    cluster, client = _cluster(args, None)
    model, _ = fit_from_parquet(args, client)
    client.close()
    cluster.close()
    return {"seconds": model.fit_seconds_, "digest": _digest(model)}


RUNS = {"in-process": run_in_process, "dask": run_on_dask, "kill": run_with_a_kill, "calm": run_undisturbed,
        "vertical-in-process": vertical_in_process, "vertical-dask": vertical_on_dask}


def _measure(mode: str, data: Path, rows: int, extra: list[str]) -> dict:
    """One run of `mode` on `data` in its own process; its JSON result."""
    command = [sys.executable, "-m", "benchmarks.bench_dask_scale", "--run", mode, "--data", str(data),
               "--rows", str(rows), *extra]
    print(f"  running {mode} on {rows:,} rows ...", file=sys.stderr, flush=True)
    return child_json(command, quiet=True)


def _dataset(tmp: Path, rows: int, args: argparse.Namespace) -> Path:
    folder = tmp / f"rows-{rows}"
    if not folder.exists():
        print(f"  writing {rows:,} x {args.features} ...", file=sys.stderr, flush=True)
        write_dataset(folder, rows, args.features, args.block_rows)
    return folder


def _shared(args: argparse.Namespace) -> list[str]:
    return ["--features", str(args.features), "--trees", str(args.trees), "--depth", str(args.depth),
            "--workers", str(args.workers), "--block-rows", str(args.block_rows)]


def rows_within(args: argparse.Namespace, limit_mib: float,
                run_at: Callable[[int], dict]) -> tuple[int, dict[int, dict], list]:
    """The most rows whose in-process run (`run_at(rows)`, its "agent_peak_mib") stayed within L.

    Peaks at `--probe-rows` and twice that, then at the estimate of a line through the last two sizes run
    (whole blocks) until the estimate is a size already run. Returns those rows, every run, and the points.
    """
    runs = {n: run_at(n) for n in (args.probe_rows, 2 * args.probe_rows)}
    points = [(n, run["agent_peak_mib"]) for n, run in runs.items()]
    for _ in range(5):  # a line through the last two sizes, until its estimate is a size already run
        (n0, p0), (n1, p1) = points[-2:]
        estimate = n1 + int((limit_mib - p1) * (n1 - n0) / (p1 - p0))
        estimate -= estimate % args.block_rows  # whole blocks
        if estimate in runs or estimate <= 0:
            break
        runs[estimate] = run_at(estimate)
        points.append((estimate, runs[estimate]["agent_peak_mib"]))
    fitting = [n for n, run in runs.items() if run["agent_peak_mib"] <= limit_mib]
    return (max(fitting) if fitting else min(runs)), runs, points


def scale(args: argparse.Namespace) -> None:
    """The scale target: rows the in-process party trains within L, and `factor` times them on Dask."""
    from dask.utils import format_bytes, parse_bytes

    limit_mib = parse_bytes(args.limit) / 2**20
    shared = _shared(args)
    with tempfile.TemporaryDirectory(dir=args.tmp) as name:
        tmp = Path(name)
        fit_rows, runs, points = rows_within(
            args, limit_mib, lambda n: _measure("in-process", _dataset(tmp, n, args), n, shared))
        ref, data = runs[fit_rows], _dataset(tmp, fit_rows, args)
        same = _measure("dask", data, fit_rows, [*shared, "--limit", args.limit])
        big_rows = args.factor * fit_rows
        big = _measure("dask", _dataset(tmp, big_rows, args), big_rows, [*shared, "--limit", args.limit])
    print(f"limit L = {format_bytes(parse_bytes(args.limit))} per process; {args.features} features, "
          f"{args.trees} trees of depth {args.depth}; {platform.machine()}, {os.cpu_count()} cores; "
          "in-process peak RSS by rows: " + ", ".join(f"{p:.0f} MiB at {n:,}" for n, p in points) + "\n")
    print(markdown_table([
        {"run": "in process (reference)", "rows": f"{fit_rows:,}",
         "s per tree": f"{ref['seconds'] / args.trees:.2f}",
         "agent peak RSS (MiB)": f"{ref['agent_peak_mib']:.0f}", "workers' peak RSS (MiB)": "-",
         "worker restarted": "-", "forest digest": ref["digest"]},
        *({"run": f"Dask, {args.workers} workers of L", "rows": f"{r:,}",
           "s per tree": f"{run['seconds'] / args.trees:.2f}",
           "agent peak RSS (MiB)": f"{run['agent_peak_mib']:.0f}",
           "workers' peak RSS (MiB)": ", ".join(f"{m:.0f}" for m in run["workers_peak_mib"]),
           "worker restarted": "yes" if run["restarted"] else "no", "forest digest": run["digest"]}
          for r, run in ((fit_rows, same), (big_rows, big)))]))
    print(f"\nin-process within L: {ref['agent_peak_mib'] <= limit_mib}; the same forest on Dask at "
          f"{fit_rows:,} rows: "
          f"{ref['digest'] == same['digest']}; {args.factor}x the rows trained on Dask within L per worker: "
          f"{not big['restarted'] and max(big['workers_peak_mib']) <= limit_mib}")


def recovery(args: argparse.Namespace) -> None:
    """The recovery target: a worker killed mid-forest; the same forest, and the extra time."""
    shared = _shared(args)
    with tempfile.TemporaryDirectory(dir=args.tmp) as name:
        data = _dataset(Path(name), args.rows, args)
        ref = _measure("in-process", data, args.rows, shared)
        calm = _measure("calm", data, args.rows, shared)
        kill_at = args.kill_after * calm["seconds"]
        hit = _measure("kill", data, args.rows, [*shared, "--kill-at", f"{kill_at:.3f}"])
    print(f"{args.rows:,} x {args.features}, {args.trees} trees of depth {args.depth}, {args.workers} "
          "workers; "
          f"{platform.machine()}, {os.cpu_count()} cores; a worker killed {kill_at:.1f} s into the fit\n")
    print(markdown_table([{"run": run, "fit s": f"{result['seconds']:.1f}", "forest digest": result["digest"]}
                          for run, result in (("in process (reference)", ref), ("Dask, undisturbed", calm),
                                              ("Dask, one worker killed", hit))]))
    print(f"\nworker killed: {hit['killed']}; workers at the end: {hit['workers_after']}; extra time "
          f"{hit['seconds'] - calm['seconds']:.1f} s ({hit['seconds'] / calm['seconds']:.2f}x); the same "
          "forest: "
          f"{ref['digest'] == calm['digest'] == hit['digest']}")


def vertical(args: argparse.Namespace) -> None:
    """The scale target, vertical: every party's in-process limit under L, then `factor` times it on Dask."""
    from dask.utils import format_bytes, parse_bytes

    limit_mib = parse_bytes(args.limit) / 2**20
    shared = [*_shared(args), "--parties", str(args.parties), "--limit", args.limit]
    with tempfile.TemporaryDirectory(dir=args.tmp) as name:
        tmp = Path(name)

        def parties(rows: int) -> Path:
            folder = tmp / f"rows-{rows}"
            if not folder.exists():
                print(f"  writing {args.parties} parties' {rows:,} x {args.features} ...", file=sys.stderr,
                      flush=True)
                write_parties(folder, rows, args.features, args.parties, args.block_rows)
            return folder

        fit_rows, runs, points = rows_within(
            args, limit_mib, lambda n: _measure("vertical-in-process", parties(n), n, shared))
        same = _measure("vertical-dask", parties(fit_rows), fit_rows, shared)
        big_rows = args.factor * fit_rows
        big = _measure("vertical-dask", parties(big_rows), big_rows, shared)
    ref = runs[fit_rows]
    print(f"limit L = {format_bytes(parse_bytes(args.limit))} per process; {args.features} features over "
          f"{args.parties} parties (each agent its own process), {args.trees} trees of depth {args.depth}; "
          f"Dask: each party {args.workers} workers of L; {platform.machine()}, {os.cpu_count()} cores; "
          "in-process peak RSS of the largest agent by rows: "
          + ", ".join(f"{p:.0f} MiB at {n:,}" for n, p in points) + "\n")
    print(markdown_table([
        {"run": run, "rows": f"{rows:,}", "align s": f"{r['align_seconds']:.1f}",
         "s per tree": f"{r['seconds'] / args.trees:.2f}",
         "agents' peak RSS (MiB)": ", ".join(f"{m:.0f}" for m in r["agents_peak_mib"]),
         "workers' peak RSS (MiB), per party": "; ".join(", ".join(f"{m:.0f}" for m in party)
                                                         for party in r["workers_peak_mib"] if party) or "-",
         "worker restarted": ("yes" if any(r["restarted"]) else "no") if r["restarted"] else "-",
         "forest digest": r["digest"]}
        for run, rows, r in (("in process (reference)", fit_rows, ref),
                             ("Dask, a cluster per party", fit_rows, same),
                             ("Dask, a cluster per party", big_rows, big))]))
    workers = [m for party in big["workers_peak_mib"] for m in party]
    print(f"\nin-process within L: {ref['agent_peak_mib'] <= limit_mib}; the same forest on Dask at "
          f"{fit_rows:,} rows: {ref['digest'] == same['digest']}; {args.factor}x the rows trained on Dask "
          f"within L per worker: {not any(big['restarted']) and max(workers) <= limit_mib}")


def main() -> None:
    """`scale` or `recovery` (see the module doc); `--run` is one measured run, used internally."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", nargs="?", choices=("scale", "recovery"))
    parser.add_argument("--setting", choices=("horizontal", "vertical"), default="horizontal")
    parser.add_argument("--parties", type=int, default=3, help="institutions (vertical)")
    parser.add_argument("--limit", default="2GiB", help="per-process memory limit L")
    parser.add_argument("--factor", type=int, default=5, help="times the in-process rows on Dask")
    parser.add_argument("--probe-rows", type=int, default=500_000, help="first in-process probe")
    add_forest_arguments(parser, rows=2_000_000, features=20, trees=4, depth=8, workers=4, block_rows=250_000)
    parser.add_argument("--kill-after", type=float, default=0.5,
                        help="kill a worker after this share of the undisturbed fit's time (recovery)")
    parser.add_argument("--tmp", default=None, help="where the Parquet datasets are written")
    parser.add_argument("--timeline", default=None,
                        help="vertical runs: each agent's answers and task stream as JSON in this folder "
                             "(`benchmarks/timeline.py`)")
    parser.add_argument("--run", choices=tuple(RUNS), help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--kill-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        print(json.dumps(RUNS[args.run](args)))
    elif args.setting == "vertical":
        vertical(args)
    elif args.target == "scale":
        scale(args)
    elif args.target == "recovery":
        recovery(args)
    else:
        parser.error("say scale or recovery")


if __name__ == "__main__":
    main()
