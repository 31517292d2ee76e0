"""A master that starts its own agents waits until each says it is serving.

It names an agent that exited first (its port taken by another run's agent) instead of talking to whoever
holds the port.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedcore.errors import PartyUnavailable
from tasks.agents import STARTED, wait_until_serving

ENDPOINT = "grpc+tls://127.0.0.1:8815"


def _config(*names: str) -> SimpleNamespace:
    institutions = [SimpleNamespace(name=name, endpoint=ENDPOINT) for name in names]
    return SimpleNamespace(institutions=institutions,
                           institution=lambda name: next(i for i in institutions if i.name == name))


def _agent(log_dir: Path, name: str, says: str, exit_code: int | None) -> subprocess.Popen:
    """A stand-in agent process writing `says` to its log (after the master's start line).

    It then exits with `exit_code`, or stays up (None).
    """
    log_path = log_dir / f"agent-{name}.log"
    with open(log_path, "ab") as log:
        log.write(f"agent {name!r} (passive party) serving on an old run's port\n".encode())  # an earlier run
        log.write(f"{STARTED} {name} by master pid 1\n".encode())
        log.flush()
        code = f"print({says!r}, flush=True)\n" + ("import time; time.sleep(30)" if exit_code is None
                                                    else f"raise SystemExit({exit_code})")
        return subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT)


def test_an_agent_that_cannot_bind_its_port_is_named_with_what_it_said(tmp_path: Path) -> None:
    serving = _agent(tmp_path, "bank", "agent 'bank' (label holder) serving on grpc+tls://127.0.0.1:1", None)
    failed = _agent(tmp_path, "insurer", "OSError: [Errno 98] Address already in use", 1)
    try:
        with pytest.raises(PartyUnavailable,
                           match=r"the agent this run started for 'insurer' exited \(code 1\) before "
                                 r"serving: OSError: \[Errno 98\] Address already in use; is another "
                                 r"run's agent holding grpc\+tls://127.0.0.1:8815\?"):
            wait_until_serving(_config("bank", "insurer"), [serving, failed], tmp_path, timeout_s=20)
        wait_until_serving(_config("bank"), [serving], tmp_path, timeout_s=20)  # only this run's lines count
    finally:
        serving.kill()
        serving.wait()


def test_an_earlier_runs_serving_line_does_not_count(tmp_path: Path) -> None:
    silent = _agent(tmp_path, "bank", "starting", None)
    try:
        with pytest.raises(PartyUnavailable,
                           match=r"the agents this run started for \['bank'\] did not start serving "
                                 r"within 1 s"):
            wait_until_serving(_config("bank"), [silent], tmp_path, timeout_s=1)
    finally:
        silent.kill()
        silent.wait()
