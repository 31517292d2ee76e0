"""`fedforest sample-table`: write a table to try `fedforest simulate` on (the README's tour uses it).

    fedforest sample-table --out work/customers.csv [--rows 5000] [--seed 0]

The demo's customers as one table: an ID column (`customer_id`), numbers, booleans, strings, an ISO
date (`customer_since`), missing values, and two labels to choose from: `responded` (yes/no, a
classification) and `premium` (a regression). CSV or Parquet by the file's suffix.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedcore.errors import ParameterError

FORMATS = (".csv", ".parquet")


def register(commands: argparse._SubParsersAction) -> None:
    """Add `fedforest sample-table`."""
    sample = commands.add_parser("sample-table", help="write a sample customer table to try simulate on",
                                 description="Write the demo's customers as one table (CSV or Parquet by the "
                                             "suffix of --out): customer_id, numbers, booleans, strings, an "
                                             "ISO date and missing values; labels responded (yes/no) and "
                                             "premium.")
    sample.add_argument("--out", required=True, type=Path, metavar="FILE", help="where to write (.csv or "
                                                                                ".parquet)")
    sample.add_argument("--rows", type=int, default=5000, metavar="N", help="customers (default 5000, at "
                                                                            "least 20)")
    sample.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    sample.set_defaults(handler=_write)


def _write(args: argparse.Namespace) -> int:
    from fedcore.data.scenario import make_customer_table

    suffix = args.out.suffix.lower()
    if suffix not in FORMATS:
        raise ParameterError(f"--out {args.out}: the file must end in .csv or .parquet")
    if not 20 <= args.rows <= 10_000_000:
        raise ParameterError(f"--rows must be between 20 and 10000000, got {args.rows}")
    if args.seed < 0:
        raise ParameterError(f"--seed must be 0 or more, got {args.seed}")
    table = make_customer_table(args.rows, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".csv":
        table.to_csv(args.out, index=False)
    else:
        table.to_parquet(args.out, index=False)
    print(f"{args.out}: {len(table)} customers, {len(table.columns)} columns; try\n"
          f"  fedforest simulate --data {args.out} --label responded --id-column customer_id\n"
          f"  fedforest simulate --data {args.out} --label premium --task regression --id-column customer_id")
    return 0
