"""Serving one institution's agent over Arrow Flight with mutual TLS, from the federation config.

The agent is the one the config's algorithm registers (`fedcore.algorithms`), vertical or horizontal.
"""

from __future__ import annotations

import threading

from fedcore.agents.base import SessionAgent
from fedcore.agents.data import InstitutionData, institution_from_config
from fedcore.compute.cluster import hold_shared
from fedcore.config import FederationConfig
from fedcore.errors import ConfigError, PartyUnavailable, ProtocolError
from fedcore.privacy.keyauth import PartyIdentity
from fedcore.transport.flight import AgentServer


def build_institution_server(config: FederationConfig, name: str, master: str = "master",
                             data: InstitutionData | None = None) -> AgentServer:
    """An AgentServer for institution `name`.

    It serves `data` or, without it, (re)loads and validates the configured files at each session start.
    With `compute: dask`, its shutdown closes the cluster this process started for it (or the client of the
    one it reached), unless another of the process's agent servers still holds it (`hold_shared`).
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
    agent: SessionAgent = config.implementation.institution_agent(config, source, name, identity)
    # the process's cluster for its `compute:` (started or connected at first use) is held while it serves
    release = hold_shared(inst.compute) if inst.compute is not None else None
    try:
        # with tls.master_ca only a master certificate passes the TLS handshake: no member's call is read
        return AgentServer(agent, location=inst.endpoint, tls_cert=inst.cert, tls_key=inst.key,
                           ca_cert=config.tls["ca"], master_ca=config.tls.get("master_ca"),
                           allowed_master=master, busy_seconds=config.training.agent_session_timeout_s,
                           on_shutdown=release)
    except BaseException:
        if release is not None:
            release()
        raise


def serve_until_session_closed(server: AgentServer, idle_timeout_s: float | None = None,
                               poll_s: float = 0.2) -> None:
    """Serve until the master closes the session (an agent started for one session, e.g. by Prefect).

    It gives up, stops serving and raises PartyUnavailable rather than hold its port for a master that is
    gone:
    once the master has called (a ping, a keep-alive, a message), when it has been silent for the session
    window (`server.guard.busy_seconds`: a live master's transport sends keep-alives every few seconds) or
    its session is abandoned (no message or keep-alive of it for that long, while the agent was not
    answering); before the master ever called, with `idle_timeout_s`, after that long (it never came). So
    a retried run's agents can bind the port within the window of the old master's death.

    It also raises ProtocolError, once the master closed the session, when the party refused or failed on
    one of the session's messages (`AgentServer.session_failure`): a run serving a failed session fails.
    """
    thread = threading.Thread(target=server.serve, name=f"agent-{server.name}", daemon=True)
    thread.start()
    stop = threading.Event()
    reason = None
    while thread.is_alive() and not stop.wait(poll_s):
        reason = _why_stop_waiting(server, idle_timeout_s)
        if reason is not None:
            break
    server.shutdown()
    thread.join(timeout=10)
    if reason:
        raise PartyUnavailable(f"agent {server.name!r}: {reason}; stopped serving")
    failure = server.session_failure()
    if failure is not None:
        raise ProtocolError(f"agent {server.name!r}: its session failed here: {failure}; stopped serving")


def _why_stop_waiting(server: AgentServer, idle_timeout_s: float | None) -> str | None:
    """Why an agent serving one session should stop now: "" when its master closed it, None to go on."""
    agent, window = server.party, server.guard.busy_seconds
    if agent.closed and agent.sessions:
        return ""
    if server.guard.in_session():
        if server.guard.abandoned():
            return (f"no message and no keep-alive from the master for {window:g} s (mid-session): its "
                    "master is gone")
        return None
    silent = server.silent_seconds()
    if silent is not None and silent > window:  # it came (pings, keep-alives), then went silent
        state = "mid-session" if agent.sessions else "before a session started"
        return f"no call from the master for {window:g} s ({state}): its master is gone"
    # before its first session message, the idle timeout holds whether the master called or not: pings and
    # keep-alives of a session that never starts here must not hold the agent forever
    if not agent.sessions and idle_timeout_s is not None and server.idle_seconds() > idle_timeout_s:
        return f"no message from the master for {idle_timeout_s:g} s (before a session started)"
    return None
