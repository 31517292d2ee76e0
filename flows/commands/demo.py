"""`fedforest demo`: the whole pipeline on this machine, on Prefect's ephemeral server.

    fedforest demo [--setting horizontal] [--algorithm ppd-ert] [--privacy secagg] [--work DIR]
    fedforest demo --algorithm boosting                     # the vertical demo with gradient boosting
    fedforest demo --setting horizontal --algorithm boosting   # the hospitals with histogram boosting
    fedforest demo --source postgres [--database-url URL]   # the vertical demo's tables in PostgreSQL

Each demo writes its config, data, registry and Prefect home into its own workspace (`demo_folder`).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from fedcore.algorithms import ALGORITHMS, in_setting
from fedcore.algorithms import algorithm as find_algorithm
from fedcore.errors import ConfigError, ParameterError
from flows.commands.environment import quiet


def register(commands: argparse._SubParsersAction) -> None:
    """Add `fedforest demo`."""
    demo = commands.add_parser("demo", help="the whole pipeline on this machine (Prefect ephemeral server)",
                               description="Generate three institutions with overlapping customers and run "
                                           "the retrain pipeline on Prefect's ephemeral server, agents on "
                                           "loopback.")
    demo.add_argument("--work", type=Path, default=None,
                      help="workspace folder (default: each demo its own, work/demo, work/demo-boosting, "
                           "work/demo-horizontal, work/demo-ppd-ert or work/demo-horizontal-boosting)")
    demo.add_argument("--verbose", action="store_true", help="show Prefect's own log lines")
    demo.add_argument("--setting", choices=("vertical", "horizontal"), default="vertical",
                      help="vertical: bank, e-commerce, insurer share customers (default); horizontal: three "
                           "hospitals share columns")
    demo.add_argument("--algorithm", choices=tuple(ALGORITHMS), default=None,
                      help="vertical demo: forest (default) or boosting (gradient boosting, early stopping "
                           "on the bank's held-out rows); horizontal demo: extra-trees (default), ppd-ert or "
                           "boosting (histogram boosting)")
    demo.add_argument("--privacy", choices=("none", "ldp", "gdp", "secagg"), default=None,
                      help="horizontal demo: extra-trees none (default) | ldp | gdp; ppd-ert secagg; "
                           "boosting secagg (default) | none")
    demo.add_argument("--source", choices=("files", "postgres"), default="files",
                      help="where the institutions' tables and predictions live: Parquet files in the "
                           "workspace (default, no server) or a PostgreSQL database (vertical demo)")
    demo.add_argument("--database-url", metavar="URL", default=None,
                      help="--source postgres: the database's connection string (default: the "
                           "FEDFOREST_DEMO_DB_URL environment variable)")
    demo.add_argument("--customers", type=int, default=6000, metavar="N",
                      help="vertical demo: customers generated (default 6000)")
    demo.set_defaults(handler=_demo)


def demo_folder(setting: str, algorithm: str) -> Path:
    """Each demo's own default workspace, so one never overwrites another's config, data or registry.

    A setting's default algorithm's demo: work/demo (vertical) or work/demo-horizontal; another's:
    work/demo-<algorithm>, or work/demo-<setting>-<algorithm> for an id whose first registration is another
    setting's (horizontal boosting: work/demo-horizontal-boosting).
    """
    if algorithm == in_setting(setting)[0].id:
        return Path("work/demo" if setting == "vertical" else "work/demo-horizontal")
    if ALGORITHMS[algorithm].setting != setting:
        return Path(f"work/demo-{setting}-{algorithm}")
    return Path(f"work/demo-{algorithm}")


def _demo(args: argparse.Namespace) -> int:
    try:
        chosen = find_algorithm(args.algorithm or in_setting(args.setting)[0].id, args.setting)
    except ParameterError as error:
        raise ConfigError(f"fedforest demo --setting {args.setting}: {error}") from None
    if not chosen.deployable:  # a demo runs the federation's flows; refused before anything is written
        runnable = [a.id for a in in_setting(args.setting) if a.deployable]
        raise ConfigError(f"fedforest demo --setting {args.setting}: algorithm {chosen.id!r} runs in "
                          f"simulation and the estimators only so far (fedforest simulate --setting "
                          f"{args.setting} --algorithm {chosen.id}); the demo runs {runnable}")
    algorithm = chosen.id
    database = None
    if args.source == "postgres":
        from flows.demos.postgres import database_url

        if args.setting != "vertical":
            raise ConfigError("fedforest demo --source postgres runs the vertical demo: leave out --setting "
                              "horizontal")
        database = database_url(args.database_url)  # before anything is written
    work = (args.work or demo_folder(args.setting, algorithm)).resolve()
    (work / ".prefect").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(work / ".prefect"))
    quiet(args.verbose)
    if not args.verbose:  # Prefect's own lines are quieted: show training progress as plain lines
        from fedcore.progress import echo_progress

        echo_progress()
    if args.setting == "horizontal":
        from flows.demos.horizontal import run_horizontal_demo

        return run_horizontal_demo(work, algorithm=algorithm, privacy=args.privacy)
    from flows.demos.vertical import run_demo

    return run_demo(work, n_customers=args.customers, database=database, algorithm=algorithm)
