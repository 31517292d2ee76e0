"""Helpers of the crash tests and of the flow tests that reuse a federation.

A second copy of a federation on other ports, the processes serving it, and the tables of a registered
version. The crash tests are tests/flows/test_resume.py and tests/flows/test_master_crash.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

MODEL = "retail-response"
PARAMS = {"n_estimators": 24, "max_depth": 6, "tree_batch_size": 2}


def copy_federation(reference_work: Path, crash_work: Path) -> Path:
    """A copy of the federation in `reference_work` whose agents listen on other ports.

    Same data, keys and certificates, so both can run side by side; returns the copy's config path.
    """
    from flows.demos.workspace import free_port

    shutil.copytree(reference_work, crash_work)
    config_path = crash_work / "federation.yaml"
    raw = yaml.safe_load(config_path.read_text())
    for institution in raw["institutions"]:
        institution["endpoint"] = f"grpc+tls://127.0.0.1:{free_port()}"
    config_path.write_text(yaml.safe_dump(raw))
    return config_path


def start_agents(config_path: Path, log_dir: Path) -> list[subprocess.Popen]:
    """`fedforest agent serve` for every institution of the config, as `retrain --agents local` starts them.

    They watch this process; for flows run with `agents="running"`. Stop them with
    `tasks.agents.stop_local_agents`.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    processes = []
    for institution in yaml.safe_load(config_path.read_text())["institutions"]:
        name = institution["name"]
        with open(log_dir / f"running-agent-{name}.log", "ab") as log:
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "fedcore.cli", "agent", "serve", "--config", str(config_path),
                 "--institution", name, "--parent-pid", str(os.getpid())],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}))
    return processes


def command_lines() -> dict[int, list[str]]:
    """Every process's command line, by pid."""
    lines = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        lines[int(entry.name)] = [a.decode(errors="replace") for a in argv]
    return lines


def agent_pids(config_path: Path, institution: str | None = None) -> list[int]:
    """Processes of `fedforest agent serve --config <config_path> [--institution <institution>]`."""
    return [pid for pid, argv in command_lines().items()
            if "serve" in argv and str(config_path) in argv and (institution is None or institution in argv)]


def wait_for_file(folder: Path, pattern: str, timeout_s: float, stop: dict | None = None) -> bool:
    """Poll until a file matching `pattern` exists under `folder` (or `stop["stop"]` is set)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not (stop or {}).get("stop"):
        if list(folder.glob(pattern)):
            return True
        time.sleep(0.005)
    return False


def version_tables(work: Path, version: str = "v0001") -> dict[str, bytes]:
    """The Arrow tables of `version` of MODEL at the master and every institution, by owner and file name."""
    files = {}
    for folder in sorted((work / "registry").glob(f"*/{MODEL}/{version}")):
        for table in folder.glob("*.arrow"):
            files[f"{folder.parents[1].name}/{table.name}"] = table.read_bytes()
    return files
