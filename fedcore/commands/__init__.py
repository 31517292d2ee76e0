"""Subcommands of `fedforest` beyond simulate/demo, one module each.

Every module here defines `register(commands)`, which adds its subparser(s) to the `fedforest`
subparsers and sets `handler=<function(args) -> exit code>`; `fedcore.cli` discovers them in name order.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil


def register_all(commands: argparse._SubParsersAction) -> None:
    """Let every command module in this package add its subcommands."""
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        importlib.import_module(f"{__name__}.{module}").register(commands)
