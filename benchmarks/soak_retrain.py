"""Soak: 20 consecutive retrain runs of the demo federation (small) in one master process.

Local agents over Flight + mutual TLS. After each run: agent processes still alive, the master's open file
descriptors and its resident memory. Passes when no agent survives its run, descriptors do not grow, and
memory grows by at most 10% between the second and the last run (the first run warms caches).

    .venv/bin/python -m benchmarks.soak_retrain [--runs 20] [--customers 1500]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.markdown import markdown_table

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


def rss_mib() -> float:
    """This process's resident memory (VmRSS) in MiB, NaN if /proc does not say."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def agent_processes(config: Path) -> int:
    """How many running processes are agents serving the federation of `config`."""
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "agent" in argv and str(config) in argv:
                count += 1
    return count


def main() -> int:
    """Run the soak and print a row per run; exit status 0 when it passes, else 1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--customers", type=int, default=1500)
    args = parser.parse_args()
    from prefect.testing.utilities import prefect_test_harness

    from flows.demos.vertical import prepare_workspace
    from flows.retrain import retrain

    rows = []
    with tempfile.TemporaryDirectory() as work, prefect_test_harness(server_startup_timeout=180):
        config, _ = prepare_workspace(Path(work), n_customers=args.customers)
        raw = yaml.safe_load(config.read_text())
        raw["params"] = {"n_estimators": 10, "max_depth": 6, "random_state": 0}
        config.write_text(yaml.safe_dump(raw))
        for run in range(1, args.runs + 1):
            started = time.perf_counter()
            result = retrain(str(config), agents="local", predict=True)
            rows.append({"run": run, "version": result["version"], "seconds": time.perf_counter() - started,
                         "agents alive": agent_processes(config),
                         "open fds": len(os.listdir("/proc/self/fd")), "RSS MiB": rss_mib()})
            print(rows[-1], flush=True)
    growth = rows[-1]["RSS MiB"] / rows[1]["RSS MiB"] - 1
    fd_growth = rows[-1]["open fds"] - rows[1]["open fds"]
    print(f"\nMachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; {args.runs} runs, {args.customers} customers, 10 trees depth 6\n")
    print(markdown_table(rows, digits=1))
    print(f"\nleaked agents: {sum(r['agents alive'] for r in rows)}; open fds run 2 -> {len(rows)}: "
          f"{fd_growth:+d}; RSS run 2 -> {len(rows)}: {100 * growth:+.1f}%")
    ok = sum(r["agents alive"] for r in rows) == 0 and fd_growth <= 5 and growth <= 0.10
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
