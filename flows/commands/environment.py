"""The Prefect environment the pipeline commands run in: no telemetry, and which Prefect home records runs."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from flows import AGENT_MODES

QUIET_ENV = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
             "GX_ANALYTICS_ENABLED": "false",
             # a fresh ephemeral server migrates its SQLite database first: allow for a slow, busy machine
             "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}


def use_federation_prefect_home(config_path: Path) -> Path | None:
    """Record runs in the federation's own Prefect home (`<config folder>/.prefect`), if it exists.

    `demo` creates that home and tells you to start the UI on it; PREFECT_HOME or PREFECT_API_URL, when
    set, say where instead. Returns the home used, if any. Keeps the demo's runs and the tour's
    `retrain`/`predict` runs together.
    """
    home = config_path.resolve().parent / ".prefect"
    if "PREFECT_HOME" in os.environ or "PREFECT_API_URL" in os.environ or not home.is_dir():
        return None
    os.environ["PREFECT_HOME"] = str(home)
    print(f"fedforest: recording runs in {home} (this federation's Prefect home; browse them with "
          f"PREFECT_HOME={home} prefect server start)", file=sys.stderr)
    return home


def quiet(verbose: bool) -> None:
    """Turn off telemetry (unless set otherwise) and, unless `verbose`, Prefect's log lines below WARNING."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    if not verbose:
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


def add_config_option(parser: argparse.ArgumentParser) -> None:
    """Add `--config`, the federation config every master pipeline command reads."""
    parser.add_argument("--config", required=True, type=Path, metavar="FILE",
                        help="the federation config (YAML)")


def add_agents_option(parser: argparse.ArgumentParser) -> None:
    """Add `--agents`, how a master pipeline command reaches the institutions' agents."""
    parser.add_argument("--agents", choices=AGENT_MODES, default="running",
                        help="start agents as deployments, as local processes, or use running ones (default)")
