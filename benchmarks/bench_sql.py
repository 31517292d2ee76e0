"""A party's table read from PostgreSQL and its predictions written back, against references (issue #30).

A throwaway PostgreSQL server (the test suite's `tests.postgres.throwaway_server`; or `--url` for one of
yours) gets a table of `--rows` x `--features` float8 columns and a bigint id, made inside the server
(`generate_series`, `setseed(0)`). Then, each measurement in a fresh process (so that its peak RSS is its
own) and the pairs run in turn (A B A B ...; the median of `--repeat` pairs is quoted):

* **read**: fedforest's source (`fedcore.agents.data.read_source` on `{sql: {table: ...}}`: ADBC, Arrow, then
  the party's pandas frame) against PostgreSQL's own `COPY (SELECT * FROM t) TO STDOUT (FORMAT binary)`
  by `psql` into /dev/null (the issue's target: at most 1.5x);
* **read, small**: the same source against `pandas.read_sql` over SQLAlchemy and psycopg2 on the first
  `--pandas-rows` rows (pandas builds a Python object per value, so its full-size run would take many
  minutes and tens of GiB: the ratio is taken at the smaller size, both sides in the same run; target >= 5x);
* **write**: `--write-rows` predictions (id, class, two probabilities) delivered by
  `fedcore.data.sql_sink.deliver_predictions` (created table, delete-then-append in one transaction)
  against `COPY ... FROM STDIN (FORMAT binary)` of the same rows, delivery columns included, by `psql`
  into an empty table (target: at most 1.5x); a `CHECKPOINT` before each run of either side.

A Python child's time is its operation's own (after its imports and, for the write, after building the
frame); a `psql` child's is its whole process (start-up is milliseconds). Each run also reports the CPU
seconds of the client process (a Python child's operation, `time.process_time`; a `psql` child's whole
process, from `RUSAGE_CHILDREN`): on a shared machine the reading process's CPU time is steadier than its
wall time, though against `COPY` most of the work is the server's, which only wall time shows. The load
average is printed under the table.

    .venv/bin/python -m benchmarks.bench_sql [--rows 10000000] [--features 40] [--pandas-rows 1000000]
        [--write-rows 1000000] [--repeat 3] [--url postgresql://...]

Needs psycopg2 for the pandas reference (`pip install psycopg2-binary`; benchmarks only).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness import interleaved, machine_line
from benchmarks.markdown import markdown_table

CHILD = [sys.executable, "-m", "benchmarks.bench_sql", "--child"]


def _psql(url: str, sql: str, stdin: Path | None = None, stdout: Path | None = None) -> None:
    """Run `sql` with psql (one statement, errors stop it)."""
    with open(stdin or os.devnull, "rb") as source, open(stdout or os.devnull, "wb") as sink:
        subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", url, "-c", sql], stdin=source,
                       stdout=sink, check=True)


def make_table(url: str, name: str, rows: int, features: int) -> None:
    """`name` with an id and `features` float8 columns of uniform values, made in the server."""
    columns = ", ".join(f"random() AS f{j}" for j in range(features))
    _psql(url, f"DROP TABLE IF EXISTS {name}")
    _psql(url, f"SELECT setseed(0); CREATE TABLE {name} AS SELECT g::bigint AS id, {columns} "
               f"FROM generate_series(1, {rows}) AS g")
    _psql(url, f"VACUUM ANALYZE {name}")


def _timed_process(command: list[str]) -> dict:
    """Run `command`: what it printed as JSON if it measured itself, else its wall seconds."""
    import resource

    start, used = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, stdout=subprocess.PIPE, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = done.stdout.decode().strip()
    if text.startswith("{"):
        return json.loads(text.splitlines()[-1])
    cpu = after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime
    return {"seconds": wall, "cpu_s": cpu, "peak_mib": float("nan")}


def paired(a: Callable[[], dict], b: Callable[[], dict], repeat: int,
           before: Callable[[], None] = lambda: None) -> tuple[list[dict], list[dict]]:
    """`repeat` runs of a and b in turn (a b a b ...), `before` each run: a's runs, b's runs."""
    pairs = interleaved(a, b, repeat, before)
    return [first for first, _ in pairs], [second for _, second in pairs]


def _median(runs: list[dict], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def _row(what: str, ours: list[dict], reference: list[dict], reference_name: str, rows: int) -> dict:
    """The report's row of one measurement, printed to standard error at once too (kept if a run is cut)."""
    print(json.dumps({"measurement": what, "rows": rows, "ours": ours, "reference": reference}),
          file=sys.stderr)
    ratios = [a["seconds"] / b["seconds"] for a, b in zip(ours, reference, strict=True)]
    cpu_ratios = [a["cpu_s"] / b["cpu_s"] for a, b in zip(ours, reference, strict=True)]
    return {"measurement": what, "rows": f"{rows:,}", "fedforest s": _median(ours, "seconds"),
            "fedforest CPU s": _median(ours, "cpu_s"), "fedforest peak MiB": _median(ours, "peak_mib"),
            "reference": reference_name, "reference s": _median(reference, "seconds"),
            "reference CPU s": _median(reference, "cpu_s"),
            "ratio (median of pairs)": statistics.median(ratios),
            "CPU ratio (median of pairs)": statistics.median(cpu_ratios)}


# -- the children ----------------------------------------------------------------------------------------
def _peak_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_read(url: str, table: str, order_by: str | None = None) -> dict:
    """Read `table` into the party's frame as fedforest does (an agent: in its ID column's order)."""
    from fedcore.agents.data import read_source
    from fedcore.data.sql import SqlSource

    start, cpu = time.perf_counter(), time.process_time()
    frame = read_source(SqlSource(url=("url", url), table=table), "benchmark", order_by=order_by)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"seconds": seconds, "cpu_s": cpu, "peak_mib": _peak_mib(), "rows": len(frame)}


def child_pandas(url: str, table: str) -> dict:
    """pandas.read_sql over SQLAlchemy (psycopg2) of `table`."""
    import pandas as pd
    import sqlalchemy

    engine = sqlalchemy.create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1))
    start, cpu = time.perf_counter(), time.process_time()
    with engine.connect() as conn:
        frame = pd.read_sql(sqlalchemy.text(f"SELECT * FROM {table}"), conn)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"seconds": seconds, "cpu_s": cpu, "peak_mib": _peak_mib(), "rows": len(frame)}


def predictions(rows: int):
    """`rows` predictions as a party delivers them: id, class, one probability per class."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    yes = rng.random(rows)
    return pd.DataFrame({"id": np.arange(rows, dtype=np.int64),
                         "prediction": np.where(yes > 0.5, "yes", "no"), "proba_no": 1.0 - yes,
                         "proba_yes": yes})


def child_write(url: str, table: str, rows: int) -> dict:
    """Deliver `rows` predictions into `table` as fedforest does."""
    from fedcore.data.sql import SqlSource
    from fedcore.data.sql_sink import deliver_predictions

    frame = predictions(rows)
    start, cpu = time.perf_counter(), time.process_time()
    deliver_predictions(SqlSource(url=("url", url), table=table), frame, "bench", "1", "run-1", "benchmark")
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"seconds": seconds, "cpu_s": cpu, "peak_mib": _peak_mib(), "rows": rows}


# -- the run ---------------------------------------------------------------------------------------------
def run(url: str, args: argparse.Namespace, scratch: Path) -> list[dict]:
    """Every measurement against `url`'s database; the report's rows."""
    print(f"making {args.rows:,} x {args.features} in the server ...", file=sys.stderr)
    make_table(url, "bench", args.rows, args.features)
    small = min(args.pandas_rows, args.rows)
    _psql(url, "DROP TABLE IF EXISTS bench_small")
    _psql(url, f"CREATE TABLE bench_small AS SELECT * FROM bench WHERE id <= {small}")
    report = []

    def ours(table: str, *order: str) -> Callable[[], dict]:
        return lambda: _timed_process([*CHILD, "read", url, table, *order])

    def copy_out(select: str) -> Callable[[], dict]:
        command = ["psql", "-X", "-q", url, "-o", os.devnull, "-c",
                   f"COPY ({select}) TO STDOUT (FORMAT binary)"]
        return lambda: _timed_process(command)

    if "read" in args.measure:
        print("read vs COPY TO ...", file=sys.stderr)
        a, b = paired(ours("bench"), copy_out("SELECT * FROM bench"), args.repeat)
        report.append(_row("read table into the party", a, b, "COPY TO STDOUT (FORMAT binary) > /dev/null",
                           args.rows))
    if "ordered" in args.measure:  # what an agent reads: the same query in its ID column's order
        print("read in ID order vs COPY TO in ID order ...", file=sys.stderr)
        from fedcore.data.sql import SqlSource

        ordered = SqlSource(url=("url", url), table="bench").select(order_by="id")
        a, b = paired(ours("bench", "id"), copy_out(ordered), args.repeat)
        report.append(_row("read table into the party, ORDER BY id", a, b,
                           "COPY (same query) TO STDOUT (FORMAT binary) > /dev/null", args.rows))
    if "pandas" in args.measure:
        print("read vs pandas.read_sql ...", file=sys.stderr)
        a, b = paired(ours("bench_small"), lambda: _timed_process([*CHILD, "pandas", url, "bench_small"]),
                      args.repeat)
        report.append(_row("read table into the party", a, b, "pandas.read_sql (SQLAlchemy, psycopg2)",
                           small))
    if "write" in args.measure:
        report.append(_write(url, args, scratch))
    return report


def _write(url: str, args: argparse.Namespace, scratch: Path) -> dict:
    """Delivering predictions against COPY FROM of the same rows into an empty table."""
    print("write vs COPY FROM ...", file=sys.stderr)
    _psql(url, "DROP TABLE IF EXISTS preds")
    _timed_process([*CHILD, "write", url, "preds", str(args.write_rows)])
    dump = scratch / "preds.bin"
    _psql(url, "COPY preds TO STDOUT (FORMAT binary)", stdout=dump)
    _psql(url, "DROP TABLE IF EXISTS preds_copy")
    _psql(url, "CREATE TABLE preds_copy (LIKE preds)")
    copy_in = ["sh", "-c", f"exec psql -X -q -v ON_ERROR_STOP=1 '{url}' "
                           f"-c 'COPY preds_copy FROM STDIN (FORMAT binary)' < {dump}"]

    def empty() -> None:  # and a checkpoint: the previous run's WAL is not flushed during the next one
        _psql(url, "DROP TABLE IF EXISTS preds")
        _psql(url, "TRUNCATE preds_copy")
        _psql(url, "CHECKPOINT")

    a, b = paired(lambda: _timed_process([*CHILD, "write", url, "preds", str(args.write_rows)]),
                  lambda: _timed_process(copy_in), args.repeat, before=empty)
    return _row("write predictions (new table)", a, b, "COPY FROM STDIN (FORMAT binary)", args.write_rows)


def main() -> None:
    """Start (or use) a server, measure, print the Markdown report."""
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, url, table, *rest = sys.argv[2:]
        result = {"read": lambda: child_read(url, table, *rest), "pandas": lambda: child_pandas(url, table),
                  "write": lambda: child_write(url, table, int(rest[0]))}[kind]()
        print(json.dumps(result))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--features", type=int, default=40)
    parser.add_argument("--pandas-rows", type=int, default=1_000_000)
    parser.add_argument("--write-rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--url", help="an existing server's database (default: a throwaway server)")
    parser.add_argument("--measure", default="read,ordered,pandas,write",
                        help="which measurements, comma-separated (read, ordered, pandas, write)")
    args = parser.parse_args()
    args.measure = set(args.measure.split(","))
    print(f"start: {machine_line()}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as scratch:
        if args.url:
            report = run(args.url, args, Path(scratch))
        else:
            from tests.postgres import throwaway_server

            with throwaway_server() as server:
                report = run(server.url(), args, Path(scratch))
    print(f"# bench_sql ({platform.machine()}, {os.cpu_count()} cores; medians of {args.repeat} pairs)\n")
    print(markdown_table(report, digits=2))
    print(f"\nAt the end: {machine_line()}")


if __name__ == "__main__":
    main()
