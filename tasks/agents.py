"""Starting institution agents and connecting to them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prefect import get_run_logger, task

from fedcore.config import FederationConfig
from fedcore.errors import CertificateRefused
from fedcore.transport.flight import FlightTransport
from tasks.common import DATA_LOCAL


@task(**DATA_LOCAL)
def start_local_agents(config: FederationConfig, log_dir: Path) -> list[subprocess.Popen]:
    """Start `fedforest agent serve` for every institution as a local process (the embedded default)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    processes = []
    for inst in config.institutions:
        log_path = log_dir / f"agent-{inst.name}.log"
        with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "fedcore.cli", "agent", "serve", "--config", str(config.path),
                 "--institution", inst.name],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}))
        get_run_logger().info("started agent for %s (pid %d), log %s", inst.name, processes[-1].pid, log_path)
    return processes


def stop_local_agents(processes: list[subprocess.Popen], timeout_s: float = 10.0) -> None:
    """Terminate local agents and wait for them; kill any that do not stop."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@task(**DATA_LOCAL)
def trigger_agent_deployments(config: FederationConfig, deployment: str = "institution-agent") -> list[str]:
    """Start each institution's agent flow on its own work pool (production); returns the flow run ids."""
    from prefect.deployments import run_deployment

    runs = []
    for inst in config.institutions:
        run = run_deployment(f"{deployment}/{inst.name}", parameters={"config_path": str(config.path),
                                                                      "institution": inst.name},
                             timeout=0, as_subflow=False)
        runs.append(str(run.id))
    return runs


def worth_retrying(task, task_run, state) -> bool:
    """Retry a failed connection unless a certificate was refused: that needs an operator, not time."""
    return not isinstance(state.result(raise_on_failure=False), CertificateRefused)


@task(**DATA_LOCAL, retries=2, retry_delay_seconds=2, retry_condition_fn=worth_retrying)
def connect_agents(config: FederationConfig, timeout_s: float = 60.0) -> FlightTransport:
    """A mutual-TLS Flight transport to every institution, once all agents answer."""
    transport = FlightTransport.from_config(config)
    try:
        transport.wait_ready(timeout_s=timeout_s)
    except BaseException:
        transport.close()
        raise
    return transport
