"""`fedforest contract infer|check`: draft a data contract from a sample file, or check a file against one.

    fedforest contract infer data/bank.parquet --id customer_id --label responded --out bank.yaml
    fedforest contract check data/bank.parquet --contract data_contracts/bank.yaml --institution bank
    fedforest contract infer export.csv --sep ';' --decimal , --encoding latin-1 --id customer_id

`check` prints one line per expectation and exits 1 with a one-line error listing every failure.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fedcore.data.dialect import add_dialect_arguments, dialect_from_args
from fedcore.errors import InputError

if TYPE_CHECKING:
    from fedcore.contracts.expectations import ValidationReport

STATUS = {True: "ok", False: "FAIL", None: "skip"}


def register(commands: argparse._SubParsersAction) -> None:
    """Add `fedforest contract` with its `infer` and `check` subcommands."""
    contract = commands.add_parser("contract", help="draft or check a data contract",
                                   description="Draft a data contract from a sample file, or check a file "
                                               "against one.")
    actions = contract.add_subparsers(dest="contract_command", required=True, metavar="ACTION")
    infer = actions.add_parser("infer", help="draft a contract from a sample .parquet/.csv for you to review",
                               description="Draft a data contract (YAML) from a sample table: dtypes, "
                                           "nullability, widened numeric ranges and seen categories. Review "
                                           "it before use.")
    infer.add_argument("data", metavar="DATA", help="the sample table (.parquet or .csv)")
    infer.add_argument("--name", help="the contract (dataset) name (default: the file name without suffix)")
    infer.add_argument("--id", dest="id_column", metavar="COL",
                       help="the id column (default: a unique, non-null column named id or *_id)")
    infer.add_argument("--label", metavar="COL", help="the label column, if this dataset holds it")
    infer.add_argument("--out", metavar="FILE", help="write the draft here instead of printing it")
    infer.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    add_dialect_arguments(infer)
    infer.set_defaults(handler=_infer)
    check = actions.add_parser("check", help="validate a table against a contract",
                               description="Validate a table against its data contract with Great "
                                           "Expectations; exit 1 if any expectation fails.")
    check.add_argument("data", metavar="DATA", help="the table (.parquet or .csv)")
    check.add_argument("--contract", required=True, metavar="FILE", help="the contract YAML")
    check.add_argument("--institution", metavar="NAME", help="named in the report (default: the contract "
                                                             "name)")
    check.add_argument("--no-label", action="store_true", help="the table has no label column (prediction "
                                                               "data)")
    add_dialect_arguments(check)
    check.set_defaults(handler=_check)


def _infer(args: argparse.Namespace) -> int:
    from fedcore.contracts.model import dump_contract, infer_contract
    from fedcore.data.io import read_table

    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and not args.force:
        raise InputError(f"{str(out)!r} exists; pass --force to overwrite it")
    table = read_table(args.data, dialect_from_args(args))
    contract = infer_contract(table, args.name or Path(args.data).stem, id_column=args.id_column,
                              label=args.label)
    text = dump_contract(contract, source=f"{Path(args.data).name} ({len(table)} rows)")
    if out is None:
        sys.stdout.write(text)
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote a draft contract for {contract.name!r} ({len(contract.columns)} feature columns) to {out}; "
          f"review it before use")
    return 0


def _check(args: argparse.Namespace) -> int:
    from fedcore.contracts.expectations import validate_frame
    from fedcore.contracts.model import load_contract
    from fedcore.data.io import read_table

    contract = load_contract(args.contract)
    table = read_table(args.data, dialect_from_args(args))
    report = validate_frame(table, contract, args.institution or contract.name,
                            include_label=not args.no_label)
    print(format_report(report))
    sys.stdout.flush()
    report.raise_for_failure()  # `fedforest` turns it into one line on stderr and exit code 1
    return 0


def format_report(report: ValidationReport) -> str:
    """The per-expectation table: status, column, expectation(arguments), what was found."""
    header = ("status", "column", "expectation", "found")
    cells = [(STATUS[row["success"]], row["column"] if row["column"] is not None else "(table)",
              f"{row['expectation']}({row['expected']})" if row["expected"] else row["expectation"],
              row["found"])
             for row in report.rows]
    widths = [max(len(str(line[i])) for line in [header, *cells]) for i in range(3)]
    outcome = (f"all {len(report.rows)} expectations met" if report.success
               else f"{len(report.failures)} of {len(report.rows)} expectations FAILED")
    lines = [f"contract {report.contract!r} version {report.version}, institution {report.institution!r}: "
             f"{outcome} ({report.seconds:.1f} s)", ""]
    for line in [header, *cells]:
        lines.append("  ".join(str(value).ljust(width) for value, width in zip(line, widths, strict=False))
                     + "  " + str(line[3]))
    return "\n".join(line.rstrip() for line in lines)
