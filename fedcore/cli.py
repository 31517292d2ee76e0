"""The `fedforest` command: the parser, its one-line errors, and the subcommands it discovers.

    fedforest simulate --data table.parquet --label y --parties 3 --trees 50 [--json]
    fedforest demo
    fedforest --version

Every subcommand is a module with a `register(commands)` function that adds its subparser(s) and sets
`handler=<function(args) -> exit code>`: fedcore's in `fedcore/commands/`, the Prefect-backed ones (demo,
retrain, predict) in `flows/commands/`. pyproject.toml lists them all in the `fedforest.commands`
entry-point group; this module registers whatever the group holds, by name, so fedcore never imports
Prefect (a flows command module imports it only when its command runs).

Bad input ends as one line `fedforest: error: ...` on stderr and exit code 1, whoever finds it: the
argument parser of any subcommand (a missing option, a value of the wrong type, an unknown choice), a
command's own checks, or an error fedcore raises on purpose (and unreadable files). `--help` and
`--version` exit 0.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, entry_points, version

from fedcore.errors import FedForestError

PROG = "fedforest"
BAD_INPUT = 1
COMMANDS_GROUP = "fedforest.commands"
"""The entry-point group of pyproject.toml naming every subcommand's `register` function."""


def _package_version() -> str:
    try:
        return version("fedforest")
    except PackageNotFoundError:
        return "unknown"


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are bad input like any other: one line on stderr, exit code 1.

    There is no usage block: the line names the `--help` to read instead. `add_subparsers` makes every
    subcommand's parser of the same class, so every registered command follows it too.
    """

    def error(self, message: str) -> None:  # type: ignore[override]
        """Write `message` as one line and exit with `BAD_INPUT`."""
        _error(f"{message} (see '{self.prog} --help')")
        self.exit(BAD_INPUT)


def register_commands(commands: argparse._SubParsersAction) -> None:
    """Let every module of the `fedforest.commands` entry-point group add its subcommands, by name."""
    registered = entry_points(group=COMMANDS_GROUP)
    if not registered:
        raise FedForestError(f"no commands are registered (the {COMMANDS_GROUP!r} entry points of the "
                             "installed package are missing or stale): reinstall it, e.g. make venv or "
                             "pip install -e .")
    for entry in sorted(registered, key=lambda e: e.name):
        entry.load()(commands)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: `--version` and every registered subcommand."""
    parser = OneLineParser(prog=PROG, description="Federated random forests across institutions.")
    parser.add_argument("--version", action="version", version=f"{PROG} {_package_version()}")
    register_commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return parser


def _error(message: str) -> None:
    sys.stderr.write(f"{PROG}: error: {' '.join(message.split())}\n")


def main(argv: list[str] | None = None) -> int:
    """Run the `fedforest` command; return its exit code (0 ok, 1 bad input: one line on stderr)."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help and --version (0), usage errors (1, `OneLineParser.error`)
        return stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except FedForestError as error:
        _error(str(error))
        return BAD_INPUT
    try:
        return args.handler(args)
    except (FedForestError, OSError) as error:
        _error(str(error))
        return BAD_INPUT
    except MemoryError:
        _error("out of memory: the data or the parameters need more memory than this machine has left; lower "
               "the number of trees or the depth, or train on fewer rows")
        return BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
