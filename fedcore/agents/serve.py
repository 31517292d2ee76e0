"""Serving one institution's agent over Arrow Flight with mutual TLS, from the federation config.

The agent is the vertical or the horizontal one, by the config's setting.
"""

from __future__ import annotations

import threading

from fedcore.agents.base import SessionAgent
from fedcore.agents.data import InstitutionData, institution_from_config
from fedcore.config import FederationConfig
from fedcore.errors import ConfigError, ProtocolError
from fedcore.privacy.keyauth import PartyIdentity
from fedcore.transport.flight import AgentServer
from fedcore.vertical.agent import VerticalInstitutionAgent


def build_institution_server(config: FederationConfig, name: str, master: str = "master",
                             data: InstitutionData | None = None) -> AgentServer:
    """An AgentServer for institution `name`.

    It serves `data` or, without it, (re)loads and validates the configured files at each session start.
    """
    inst = config.institution(name)
    missing = [what for what, value in (("endpoint", inst.endpoint), ("cert", inst.cert), ("key", inst.key),
                                        ("tls.ca", config.tls.get("ca"))) if not value]
    if missing:
        raise ConfigError(f"{config.path}: institution {name!r} needs {', '.join(missing)} to serve "
                          "over Flight")
    source = data if data is not None else (lambda: institution_from_config(config, name))
    # the mTLS certificate and key also sign the keys a master relays between institutions (PPD-ERT's
    # secure-aggregation keys, Paillier mode's sealing keys; peers check them against the consortium CA),
    # so the master cannot substitute its own
    assert inst.cert is not None and inst.key is not None, "checked with the others in `missing` above"
    identity = PartyIdentity.from_certificate(name, inst.cert, inst.key, config.tls["ca"])
    agent: SessionAgent
    if config.setting == "horizontal":
        from fedcore.horizontal.agent import HorizontalInstitutionAgent

        agent = HorizontalInstitutionAgent(source, name=name, identity=identity)
    else:
        agent = VerticalInstitutionAgent(source, config.read_consortium_key(), name=name, identity=identity)
    return AgentServer(agent, location=inst.endpoint, tls_cert=inst.cert, tls_key=inst.key,
                       ca_cert=config.tls["ca"], allowed_master=master)


def serve_until_session_closed(server: AgentServer, idle_timeout_s: float | None = None,
                               poll_s: float = 0.2) -> None:
    """Serve until the master closes the session (an agent started for one session, e.g. by Prefect).

    With `idle_timeout_s`, give up when the master sends nothing for that long (it never came, or died
    mid-session): the agent stops and raises ProtocolError rather than holding its port forever.
    """
    thread = threading.Thread(target=server.serve, name=f"agent-{server.name}", daemon=True)
    thread.start()
    stop = threading.Event()
    idle = False
    while thread.is_alive() and not stop.wait(poll_s):
        agent = server.party
        if agent.closed and agent.sessions:
            break
        if idle_timeout_s is not None and server.idle_seconds() > idle_timeout_s:
            idle = True
            break
    server.shutdown()
    thread.join(timeout=10)
    if idle:
        state = "mid-session" if server.party.sessions else "before a session started"
        raise ProtocolError(f"agent {server.name!r}: no message from the master for {idle_timeout_s:g} s "
                            f"({state}); stopped serving")
