"""The part every master flow shares: reach the institutions' agents and check their data.

It always disconnects and stops what was started, whatever happens in between.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedcore.config import FederationConfig
from fedcore.transport.flight import FlightTransport
from flows import AGENT_MODES
from tasks.agents import (
    cancel_agent_runs,
    connect_agents,
    release_agents,
    start_local_agents,
    stop_local_agents,
    trigger_agent_deployments,
    wait_for_agent_runs,
    wait_until_serving,
)
from tasks.validation import collect_validation


def check_agent_mode(agents: str) -> None:
    """Refuse an unknown way of starting agents before anything starts."""
    if agents not in AGENT_MODES:
        raise ValueError(f"agents must be one of {AGENT_MODES}, got {agents!r}")


@contextmanager
def agent_session(config: FederationConfig, agents: str, purpose: str | None = None,
                  agent_runs: dict[str, str] | None = None) -> Iterator[tuple[FlightTransport, dict]]:
    """Start (or reach) the agents and collect their data-contract results; yield (transport, validation).

    A contract violation stops here, before any training. On the way out, also when the flow failed,
    every agent is told the session is over, the transport is closed, local agents are stopped and the
    agents' deployment runs are awaited (their final states are logged). When the agents could not all be
    reached (one's run failed first), the deployment runs still going are cancelled at once: no session
    will come for them.

    Deployment runs are named `<institution>: <purpose>` (`bank: retrain churn-90d`); `agent_runs`, when
    given, receives {institution: run id}, for the caller to rename them (`tasks.agents.name_agent_runs`).
    """
    check_agent_mode(agents)
    log_dir = Path(config.path).parent / "logs"
    processes = start_local_agents(config, log_dir) if agents == "local" else []
    agent_runs = {} if agent_runs is None else agent_runs
    connected = False
    try:
        if processes:  # one that cannot bind its port says so, before the master reaches whoever holds it
            wait_until_serving(config, processes, log_dir, timeout_s=config.training.connect_timeout_s)
        # a run that ends before serving (bad config, missing key) fails this at once
        if agents == "deployments":
            agent_runs.update(trigger_agent_deployments(config, purpose=purpose))
        transport = connect_agents(config, timeout_s=config.training.connect_timeout_s, agent_runs=agent_runs)
        connected = True
        try:
            yield transport, collect_validation(transport)
        finally:
            release_agents(transport)
            transport.close()
    finally:
        stop_local_agents(processes)
        if agent_runs and not connected:
            cancel_agent_runs(list(agent_runs.values()),
                              "the master could not reach every agent of this session (its run says why), "
                              "so no session will come")
        if agent_runs:
            wait_for_agent_runs(list(agent_runs.values()))
