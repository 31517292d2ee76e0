"""A contract checked on a PostgreSQL table: fedforest's way against GX's own SQL datasource (issue #30).

A throwaway PostgreSQL server (`tests.postgres.throwaway_server`; or `--url`) gets a table made inside the
server (`setseed(0)`): a bigint id, `--features` float8 columns, a text category of four values, an int8,
a `date`, a `timestamptz` and a text label. Its contract is what `fedforest contract infer` gives for the
rows. Then, in this process, one after the other (`--repeat` times, A B A B ...):

* **fedforest**: the agent's read (`fedcore.data.sql.read_sql`: ADBC, Arrow, the party's pandas frame),
  then `fedcore.contracts.validate_frame` on that frame (GX's pandas datasource): the frame is what trains,
  so the read is counted too, but reported apart;
* **GX SQL**: GX's PostgreSQL datasource (SQLAlchemy and psycopg2) with a table asset, validating the same
  suite (`fedcore.contracts.expectations.build_suite`) in the server; the training read would come after.

Reported: wall seconds and this process's CPU seconds (`time.process_time`) of each, and every expectation
whose outcome differs between the two (the table keeps its contract, so every pandas row passes), with
what GX's SQL datasource observed. Then both run on a copy of the table with one label outside the
contract's classes, a null region and a repeated ID, to compare the failures they report.

    .venv/bin/python -m benchmarks.bench_contract_sql [--rows 200000] [--features 8] [--repeat 2] [--url ...]

Needs psycopg2 (the [bench] extra) for GX's SQL datasource; fedforest itself never imports it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import Any

from benchmarks.harness import machine_line


def make_table(server_execute: Any, rows: int, features: int) -> None:
    """`customers` (and a copy `broken` with three violations), made in the server."""
    floats = ", ".join(f"random() AS f{j}" for j in range(features))
    server_execute("DROP TABLE IF EXISTS customers")
    server_execute("DROP TABLE IF EXISTS broken")
    server_execute("SELECT setseed(0)")  # one connection: the seed holds for the next statement
    server_execute(
        "CREATE TABLE customers AS SELECT g::bigint AS customer_id, "
        f"{floats}, (ARRAY['north','south','east','west'])[1 + (g % 4)] AS region, "
        "(g % 1000)::int8 AS visits, DATE '2020-01-01' + (g % 2000) AS opened, "
        "TIMESTAMPTZ '2024-01-01 00:00:00+00' + (g % 100000) * INTERVAL '1 minute' AS seen_at, "
        "CASE WHEN random() < 0.3 THEN 'churn' ELSE 'stay' END AS churned "
        f"FROM generate_series(1, {rows}) AS g")
    server_execute("CREATE TABLE broken AS SELECT * FROM customers")
    server_execute("UPDATE broken SET churned = 'maybe' WHERE customer_id = 7")
    server_execute("UPDATE broken SET customer_id = 1 WHERE customer_id = 9")
    server_execute("UPDATE broken SET region = NULL WHERE customer_id = 11")
    server_execute("VACUUM ANALYZE customers")
    server_execute("VACUUM ANALYZE broken")


def fedforest_way(url: str, table: str, contract: Any) -> tuple[dict, Any]:
    """The agent's read, then GX on the frame: (times, report)."""
    from fedcore.contracts import validate_frame
    from fedcore.data.sql import SqlSource, read_sql

    wall, cpu = time.perf_counter(), time.process_time()
    frame = read_sql(SqlSource(("url", url), table=table), "bench", order_by="customer_id")
    read_wall, read_cpu = time.perf_counter() - wall, time.process_time() - cpu
    wall, cpu = time.perf_counter(), time.process_time()
    report = validate_frame(frame, contract, "bank")
    times = {"read_s": read_wall, "read_cpu_s": read_cpu, "validate_s": time.perf_counter() - wall,
             "validate_cpu_s": time.process_time() - cpu}
    return times, report


def gx_sql_way(url: str, table: str, contract: Any) -> tuple[dict, list]:
    """GX's PostgreSQL datasource validating the same suite in the server: (times, GX's results)."""
    from fedcore.contracts.expectations import _gx, build_suite

    gx, _ = _gx()
    from great_expectations.data_context.types.base import ProgressBarsConfig

    wall, cpu = time.perf_counter(), time.process_time()
    suite = build_suite(contract)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"great_expectations(\.|$)")
        context = gx.get_context(mode="ephemeral")
        context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        source = context.data_sources.add_postgres("bank", connection_string=url.replace(
            "postgresql://", "postgresql+psycopg2://"))
        batch = source.add_table_asset("customers", table_name=table).add_batch_definition_whole_table(
            "whole").get_batch()
        result = batch.validate(suite, result_format={"result_format": "SUMMARY",
                                                      "partial_unexpected_count": 20})
    times = {"validate_s": time.perf_counter() - wall, "validate_cpu_s": time.process_time() - cpu}
    return times, sorted(result.results, key=lambda r: r.expectation_config.meta["fedforest"]["index"])


def differences(report: Any, results: list) -> list[str]:
    """Each expectation whose outcome differs: its pandas row against what GX's SQL datasource observed."""
    lines = []
    for row, sql in zip(report.rows, results, strict=True):
        if bool(row["success"]) != bool(sql.success):
            observed = sql.result.get("observed_value", sql.result.get("unexpected_count"))
            error = sql.exception_info.get("exception_message") if sql.exception_info else None
            lines.append(f"{row['column'] or 'table'}: {row['expectation']}({row['expected']}): pandas "
                         f"{'pass' if row['success'] else 'fail: ' + row['found']}; GX SQL "
                         f"{'pass' if sql.success else 'fail'}, observed {observed!r}"
                         + (f", error {error!r}" if error else ""))
    return lines


def run(url: str, args: argparse.Namespace) -> None:
    """Make the tables, infer the contract, time both ways in turn, then compare their outcomes."""
    import adbc_driver_postgresql.dbapi as pg

    from fedcore.contracts.model import infer_contract
    from fedcore.data.sql import SqlSource, read_sql

    with pg.connect(url, autocommit=True) as conn, conn.cursor() as cursor:
        make_table(cursor.execute, args.rows, args.features)
    frame = read_sql(SqlSource(("url", url), table="customers"), "bench", order_by="customer_id")
    contract = infer_contract(frame, "bank", "customer_id", "churned")
    del frame
    ours, theirs = [], []
    report = results = None
    for _ in range(args.repeat):
        times, report = fedforest_way(url, "customers", contract)
        ours.append(times)
        times, results = gx_sql_way(url, "customers", contract)
        theirs.append(times)
    print(f"rows {args.rows}, {len(contract.columns)} feature columns, {len(report.rows)} expectations")
    for name, runs in (("fedforest (ADBC read + GX pandas)", ours), ("GX SQL datasource", theirs)):
        print(f"{name}: " + "; ".join(f"{key} " + ", ".join(f"{r[key]:.2f}" for r in runs)
                                      for key in runs[0]))
    print(f"pandas report success {report.success}; GX SQL success {all(r.success for r in results)}")
    print("outcomes that differ:", *(differences(report, results) or ["none"]), sep="\n  ")
    _, bad = fedforest_way(url, "broken", contract)
    _, bad_sql = gx_sql_way(url, "broken", contract)
    print("broken table, fedforest's failure lines:", *bad.failure_lines(), sep="\n  ")
    print("broken table, GX SQL's failed expectations:",
          *[f"{r.expectation_config.type}({r.expectation_config.kwargs.get('column')}): "
            f"{r.result.get('unexpected_count', r.result.get('observed_value'))} "
            f"{r.result.get('partial_unexpected_list', '')}" for r in bad_sql if not r.success], sep="\n  ")


def main() -> None:
    """Parse the options, start a throwaway server unless `--url`, and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--features", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--url", help="an existing server's database (default: a throwaway server)")
    args = parser.parse_args()
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    print(f"start: {machine_line()}", file=sys.stderr)
    if args.url:
        run(args.url, args)
    else:
        from tests.postgres import throwaway_server

        with throwaway_server() as server:
            run(server.url(), args)
    print(f"At the end: {machine_line()}")


if __name__ == "__main__":
    main()
