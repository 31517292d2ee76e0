"""`fedforest simulate`: split one table into simulated parties, train federated, compare, and print.

    fedforest simulate --data table.parquet --label y --parties 3 --trees 50 [--json]
    fedforest simulate --setting horizontal --algorithm extra-trees --privacy ldp --data t.parquet --label y
    fedforest simulate --data postgresql://user@host/db --table customers --label y  (or --query "SELECT")

Argument parsing and printing only; the work lives in `fedcore.simulation`. The setting, algorithm and
privacy mode are checked here, before the table is read, and refused as bad input.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fedcore.algorithms import SETTINGS, in_setting
from fedcore.algorithms import algorithm as find_algorithm
from fedcore.compute.cluster import compute_from_spec
from fedcore.data.dialect import add_dialect_arguments, dialect_from_args
from fedcore.data.io import read_table
from fedcore.data.split import PARTITIONS
from fedcore.errors import ParameterError
from fedcore.privacy.settings import MODE_FIELDS, privacy_with
from fedcore.simulation.params import TASK_DEFAULT, TASKS
from fedcore.trees.budget import available_bytes
from fedcore.trees.params import check_max_features, check_model_fits

if TYPE_CHECKING:
    import pandas as pd

MAX_SEED = 2**32 - 1
"""scikit-learn's train/test split and reference forests take seeds up to 2^32 - 1."""

DESCRIPTION = """\
Split one table into simulated parties, train federated, and compare with scikit-learn and with the
single-party run of the same engine.

The table may hold numbers, booleans, strings (categorical, at most 255 distinct values a column),
missing values in any feature column, and dates: a Parquet date or timestamp column, or a CSV column
whose values are all ISO dates or datetimes (2024-03-01, 2024-03-01T08:30:00+01:00), becomes days since
1970-01-01 UTC in both settings; the output lists every converted column. The horizontal setting
agrees on each string column's category list from the whole table, standing in for the data contracts
that declare them in a real federation."""


def register(commands: argparse._SubParsersAction) -> None:
    """Add `fedforest simulate`."""
    sim = commands.add_parser("simulate", help="split one table into simulated parties, train and evaluate",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sim.add_argument("--data", required=True, metavar="FILE",
                     help="the table (.parquet or .csv), or a PostgreSQL URL (postgresql://user@host/db) "
                          "with --table or --query")
    source = sim.add_mutually_exclusive_group()
    source.add_argument("--table", metavar="NAME", help="with a PostgreSQL --data: the table to read")
    source.add_argument("--query", metavar="SQL", help="with a PostgreSQL --data: the query to read")
    sim.add_argument("--label", required=True, metavar="COL", help="the label column")
    sim.add_argument("--id-column", "--id", dest="id_column", metavar="COL",
                     help="a row id column, left out of the features")
    sim.add_argument("--drop", action="append", default=[], metavar="COL",
                     help="a column to leave out of the features (repeat for several)")
    sim.add_argument("--setting", default="vertical",
                     help="vertical (columns split) or horizontal (rows split)")
    sim.add_argument("--algorithm", default=None,
                     help="vertical: forest (default) or boosting (--trees rounds of XGBoost's defaults: "
                          "depth 6 unless --max-depth, learning rate 0.3, lambda 1); horizontal: "
                          "extra-trees (default) or ppd-ert")
    sim.add_argument("--privacy", default=None,
                     help="forest: none (default), paillier or ou (encrypted labels); boosting: none "
                          "(default), paillier or ou (encrypted gradients); extra-trees: none "
                          "(default), ldp or gdp; ppd-ert: secagg (default) or secagg-dp (distributed DP on "
                          "the masked sums)")
    sim.add_argument("--epsilon", type=float, default=None,
                     help="gdp, secagg-dp: the whole model's epsilon per row (default 1.0; secagg-dp "
                          "needs --max-depth, gdp without it trains its default leaf plan); ldp: each "
                          "row's label epsilon, over any number of reports (default 2.0)")
    sim.add_argument("--delta", type=float, default=None,
                     help="gdp, secagg-dp: the whole model's delta (default 1e-6), the probability the "
                          "epsilon guarantee fails for a row")
    sim.add_argument("--thresholds", choices=("histogram", "domain"), default=None,
                     help="ppd-ert: candidate thresholds within each node's populated grid cells (histogram, "
                          "the default) or uniform in the declared domain (domain, the paper's)")
    sim.add_argument("--partition", choices=PARTITIONS, default="iid",
                     help="horizontal: how rows go to parties (default iid)")
    sim.add_argument("--partition-column", metavar="COL", help="the column whose values decide the party "
                                                                "(--partition column)")
    sim.add_argument("--alpha", type=float, default=0.5, help="Dirichlet alpha of --partition dirichlet "
                                                               "(default 0.5; smaller is more skewed)")
    sim.add_argument("--parties", type=int, default=2, help="number of simulated parties (default 2)")
    sim.add_argument("--trees", type=int, default=100, help="number of trees (default 100)")
    sim.add_argument("--max-depth", type=int, default=None, metavar="N", help="depth limit (default none)")
    sim.add_argument("--max-features", type=_max_features, default=TASK_DEFAULT, metavar="F",
                     help="features per node: sqrt, log2, none, a count or a fraction "
                          "(default sqrt for classification, all for regression)")
    sim.add_argument("--seed", type=_seed, default=0,
                     help=f"seed of the split, the parties and the forests (0 to {MAX_SEED}, default 0)")
    sim.add_argument("--test-size", type=float, default=0.2, help="held-out fraction of rows (default 0.2)")
    sim.add_argument("--task", choices=TASKS, default="auto", help="auto infers it from the label")
    sim.add_argument("--dask", metavar="SPEC", default=None,
                     help="every party's rows on Dask: local:N (a local cluster of N workers) or a scheduler "
                          "address (tcp://host:8786); the forest is the in-process one (vertical: "
                          "classification)")
    sim.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_dialect_arguments(sim)
    sim.set_defaults(handler=_simulate)


def _max_features(text: str) -> str | int | float | None:
    """Parse --max-features: sqrt, log2, none (all features), a count >= 1, a fraction in (0, 1], default."""
    lowered = text.strip().lower()
    if lowered in ("sqrt", "log2", TASK_DEFAULT):
        return lowered
    if lowered in ("none", "all"):
        return None
    try:
        value: int | float = int(lowered)
    except ValueError:
        try:
            value = float(lowered)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected sqrt, log2, none, default, a count >= 1 or a "
                                             f"fraction in (0, 1], got {text!r}") from None
    try:
        check_max_features(value)
    except ParameterError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def _seed(text: str) -> int:
    """Parse --seed: an integer from 0 to 2^32 - 1 (what scikit-learn's split and reference forests take)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"the seed must be between 0 and {MAX_SEED} (the train/test split "
                                         "and scikit-learn's reference forests take 32-bit seeds), "
                                         f"got {value}")
    return value


def _not_available(args: argparse.Namespace) -> str | None:
    """Why the requested setting, algorithm or privacy mode does not exist, or None (filling defaults)."""
    if args.setting not in SETTINGS:
        return f"unknown setting {args.setting!r}: choose one of {list(SETTINGS)}"
    offered = {a.id: a.title for a in in_setting(args.setting)}
    args.algorithm = args.algorithm or next(iter(offered))
    if args.algorithm not in offered:
        names = ", ".join(f"{k!r} ({v})" for k, v in offered.items())
        return f"unknown algorithm {args.algorithm!r}: the {args.setting} setting offers {names}"
    if args.thresholds is not None and args.algorithm != "ppd-ert":
        return f"--thresholds applies to --algorithm ppd-ert only, not {args.algorithm!r}"
    modes = find_algorithm(args.algorithm, args.setting).privacy_modes  # an id may live in both settings
    args.privacy = args.privacy or modes[0]
    if args.privacy not in modes:
        return (f"algorithm {args.algorithm!r} supports privacy {', '.join(repr(m) for m in modes)}, "
                f"got {args.privacy!r}")
    if args.dask is not None:
        compute_from_spec(args.dask)  # a bad spec is refused before the table is read
    for option in ("epsilon", "delta"):
        unused = _unused_option(option, getattr(args, option), args.algorithm, args.privacy, modes)
        if unused:
            return unused
    if args.privacy == "secagg-dp" and args.max_depth is None:
        return f"--privacy {args.privacy} needs --max-depth: the model's budget is spread over trees x levels"
    return None


def _unused_option(field: str, value: object, algorithm: str, privacy: str,
                   modes: Sequence[str]) -> str | None:
    """Why --`field` does not apply to `privacy` (a privacy field only some modes have), or None."""
    if value is None or field in MODE_FIELDS[privacy]:
        return None
    using = [m for m in modes if field in MODE_FIELDS[m]]
    if not using:
        return f"--{field} applies to --algorithm extra-trees only, not {algorithm!r}"
    return f"--{field} applies to privacy {' and '.join(repr(m) for m in using)} only, not {privacy!r}"


def _simulate(args: argparse.Namespace) -> int:
    reason = _not_available(args)
    if reason:
        raise ParameterError(reason)
    # the one privacy parser (fedcore.privacy.settings), before the table is read
    privacy = privacy_with(args.privacy, find_algorithm(args.algorithm, args.setting), epsilon=args.epsilon,
                           delta=args.delta,
                           thresholds=args.thresholds)
    table = _read_data(args)
    _check_model_fits(args, len(table))
    # the algorithm's setting's simulator, imported only when it runs (first-use seconds)
    result = find_algorithm(args.algorithm, args.setting).simulate_command(table, args, privacy)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_result(result))
    return 0


def _read_data(args: argparse.Namespace) -> pd.DataFrame:
    """--data as a file, or a PostgreSQL URL's --table or --query (`fedcore.data.sql`, as agents read it)."""
    from fedcore.data.sql import IDENTIFIER, SqlSource, read_sql

    if not args.data.startswith(("postgresql://", "postgres://")):
        if args.table or args.query:
            raise ParameterError("--table and --query apply to a PostgreSQL --data URL "
                                 "(postgresql://user@host/db), not a file")
        return read_table(args.data, dialect_from_args(args))
    if not (args.table or args.query):
        raise ParameterError("a PostgreSQL --data URL needs --table NAME or --query \"SELECT ...\"")
    if args.table and not IDENTIFIER.fullmatch(args.table):
        raise ParameterError(f"--table {args.table!r} is not a table name like 'customers' or "
                             "'bank.customers' (letters, digits, underscores)")
    return read_sql(SqlSource(("url", args.data), table=args.table, query=args.query), "--data")


def _check_model_fits(args: argparse.Namespace, n_rows: int) -> None:
    """Refuse trees and a depth whose worst-case model cannot fit in this machine's available memory.

    Checked before the table is split and any party exists; the simulator holds the master's and every
    party's model tables (`fedcore.trees.params.check_model_fits`). The trees grow on the training rows.
    """
    cls = find_algorithm(args.algorithm, args.setting).params_class()
    # boosting: K trees a round (softmax) is not known before the label is read; its default depth is 6
    depth = {} if args.max_depth is None else {"max_depth": args.max_depth}
    params = cls(n_estimators=args.trees, random_state=args.seed, **depth)
    if not 0 < args.test_size < 1:
        return  # the simulator refuses it, naming it
    n_train = n_rows - math.ceil(args.test_size * n_rows)  # scikit-learn's train_test_split
    check_model_fits(params, max(n_train, 1), available_bytes(), colocated_parties=max(args.parties, 0))


def format_result(result: dict) -> str:
    """A readable table of a simulation result.

    Federated vs scikit-learn vs single-party (and, horizontal, local-only) metrics, times, rounds and
    megabytes, then the verdict, the privacy budget and what happened to the columns.
    """
    single, reference = result["single_party"], result["reference"]
    local = (result.get("local_only") or {}).get("mean")
    rows = [(name, result["metrics"][name], reference["metrics"][name], single["metrics"][name],
             local[name] if local else None) for name in result["metrics"]]
    rows += [
        ("train s", result["timing"]["train_s"], reference["train_s"], single["train_s"], None),
        ("predict s", result["timing"]["predict_s"], reference["predict_s"], single["predict_s"], None),
        ("rounds", result["communication"]["rounds"], None, single["rounds"], None),
        ("MB", result["communication"]["bytes"] / 1e6, None, single["bytes"] / 1e6, None),
    ]
    mode = f" ({result['privacy']})" if "privacy" in result else ""
    header = ("", f"federated (M={result['parties']})", "reference", "single-party (M=1)",
              "local-only (mean)" if local else "")
    lines = [
        f"{result['setting']} {result['algorithm']}{mode}, {result['task']}: {result['rows_train']} train "
        f"rows, {result['rows_test']} test rows; reference = {reference['name']}",
        "",
        f"{header[0]:<10}{header[1]:>18}{header[2]:>14}{header[3]:>22}{header[4]:>20}".rstrip(),
    ]
    lines += [f"{name:<10}{_cell(a):>18}{_cell(b):>14}{_cell(c):>22}{_cell(d) if local else '':>20}".rstrip()
              for name, a, b, c, d in rows]
    identical = result["single_party_identical"]
    verdict = "not expected: noise is added" if identical is None else ("yes" if identical else "NO")
    lines += ["", f"single-party identical (same trees, same predictions): {verdict}"]
    if "in_process_identical" in result:
        lines.append("on Dask, identical to the same federation in process: "
                     f"{'yes' if result['in_process_identical'] else 'NO'}")
    summary = _privacy_summary(result.get("privacy_report") or {})
    if summary:
        lines.append(f"privacy: {summary} (details in --json)")
    return "\n".join(lines + _column_lines(result.get("columns") or {}))


def _column_lines(columns: dict) -> list[str]:
    """What the simulator did to the table's columns: id and dropped columns, dates, agreed categories."""
    lines = []
    left_out = [f"id column {columns['id']!r}"] if columns.get("id") else []
    if columns.get("dropped"):
        left_out.append(f"dropped {', '.join(repr(c) for c in columns['dropped'])}")
    if left_out:
        lines.append(f"not features: {'; '.join(left_out)}")
    dates = columns.get("dates") or []
    if dates:
        shown = ", ".join(f"{d['column']!r} ({d['from']})" for d in dates)
        lines.append(f"dates converted to {dates[0]['to']}: {shown}")
    categories = columns.get("categories") or {}
    if categories:
        shown = ", ".join(f"{name!r} ({n})" for name, n in categories.items())
        lines.append(f"category lists from {columns['categories_from']}: {shown}")
    return lines


def _privacy_summary(report: dict) -> str:
    """One line on the differential-privacy budget of a horizontal run (empty when no noise is added)."""
    if report.get("mode") == "gdp":
        return (f"global DP, epsilon {report['epsilon_total']:.4g} (delta {report['delta']:g}) spent by the "
                f"busiest row of the most charged party, of the model's budget {report['epsilon_budget']:g}")
    if report.get("mode") == "secagg-dp":
        return (f"distributed DP on the masked sums, epsilon {report['epsilon_total']:.4g} (delta "
                f"{report['delta']:g}) spent by the busiest row against the master, of the model's budget "
                f"{report['epsilon_budget']:g}; against the master with the other parties "
                f"{report['epsilon_coalition']:.4g}")
    if report.get("mode") == "ldp":
        return (f"local DP on labels ({report['mechanism']}), epsilon {report['epsilon']:.3g} per row, "
                "however many trees")
    if report.get("algorithm") == "ppd-ert":
        return f"thresholds: {report['thresholds']}"
    return ""


def _cell(value: float | int | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{value:.4f}"
