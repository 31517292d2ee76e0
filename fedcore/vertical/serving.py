"""Serving one institution's agent over Arrow Flight with mutual TLS, from the federation config."""

from __future__ import annotations

import threading

from fedcore.config import FederationConfig
from fedcore.errors import ConfigError
from fedcore.transport.flight import AgentServer
from fedcore.vertical.institution import InstitutionAgent, InstitutionData, institution_from_config


def build_institution_server(config: FederationConfig, name: str, master: str = "master",
                             data: InstitutionData | None = None) -> AgentServer:
    """An AgentServer for institution `name`, serving `data` or, without it, (re)loading and validating the
    configured files at each session start."""
    inst = config.institution(name)
    missing = [what for what, value in (("endpoint", inst.endpoint), ("cert", inst.cert), ("key", inst.key),
                                        ("tls.ca", config.tls.get("ca"))) if not value]
    if missing:
        raise ConfigError(f"{config.path}: institution {name!r} needs {', '.join(missing)} to serve over Flight")
    source = data if data is not None else (lambda: institution_from_config(config, name))
    agent = InstitutionAgent(source, config.read_consortium_key(), name=name)
    return AgentServer(agent, location=inst.endpoint, tls_cert=inst.cert, tls_key=inst.key, ca_cert=config.tls["ca"],
                       allowed_master=master)


def serve_until_session_closed(server: AgentServer, poll_s: float = 0.2) -> None:
    """Serve until the master closes the session (an agent started for one session, e.g. by Prefect)."""
    thread = threading.Thread(target=server.serve, name=f"agent-{server.name}", daemon=True)
    thread.start()
    stop = threading.Event()
    while thread.is_alive() and not stop.wait(poll_s):
        agent = server.party
        if agent.closed and agent.sessions:
            break
    server.shutdown()
    thread.join(timeout=10)
