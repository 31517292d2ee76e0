"""`fedforest agent serve`: run one institution's agent, answering the master over Flight with mutual TLS.

    fedforest agent serve --config federation.yaml --institution bank

The agent serves the institution's agent (vertical or horizontal, by the config's setting) on its `endpoint` with its `cert`/`key` and the
consortium CA (`tls.ca`); at the start of every session it loads the institution's files and checks them
against its data contract. Only the master whose
certificate names it `--master` (default "master") is served. Ctrl-C or SIGTERM stops it cleanly.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import TYPE_CHECKING

from fedcore.config import FederationConfig, load_config
from fedcore.errors import ConfigError

if TYPE_CHECKING:  # imported when used: `fedforest --help` stays fast
    from fedcore.transport.flight import AgentServer


def register(commands: argparse._SubParsersAction) -> None:
    """Add `fedforest agent serve`."""
    agent = commands.add_parser("agent", help="run an institution's agent")
    actions = agent.add_subparsers(dest="agent_command", required=True, metavar="ACTION")
    serve = actions.add_parser("serve", help="serve one institution's data to the master over Flight (mTLS)",
                               description="Load one institution's data and answer the master's protocol "
                                           "requests over Arrow Flight with mutual TLS until stopped.")
    serve.add_argument("--config", required=True, metavar="FILE", help="the federation config (YAML)")
    serve.add_argument("--institution", required=True, metavar="NAME", help="the institution to serve")
    serve.add_argument("--master", default="master", metavar="NAME",
                       help="the master certificate name allowed to call (default master)")
    serve.set_defaults(handler=_serve)


def build_agent(config: FederationConfig, name: str, master: str = "master") -> AgentServer:
    """An `AgentServer` for institution `name` on its endpoint, with its certificate and the consortium CA;
    it (re)loads and validates the institution's data at the start of every session."""
    from fedcore.vertical.serving import build_institution_server

    inst = config.institution(name)
    missing = [k for k, v in (("endpoint", inst.endpoint), ("cert", inst.cert), ("key", inst.key)) if not v]
    if missing:
        raise ConfigError(f"{config.path}: institution {name!r} needs {', '.join(map(repr, missing))} to run an agent")
    if "ca" not in config.tls:
        raise ConfigError(f"{config.path}: tls needs 'ca' (the consortium CA certificate) to run an agent")
    if not inst.endpoint.startswith("grpc+tls://"):
        raise ConfigError(f"{config.path}: institution {name!r}: endpoint must be grpc+tls://HOST:PORT, "
                          f"got {inst.endpoint!r}")
    return build_institution_server(config, name, master)


class _Stop(Exception):
    """Raised by the SIGTERM handler to leave `serve()`."""


def _raise_stop(signum, frame) -> None:
    raise _Stop(signal.Signals(signum).name)


def serve_until_stopped(server: AgentServer) -> None:
    """Serve until Ctrl-C or SIGTERM (Flight shuts the server down on either, then Python sees it)."""
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    try:
        server.serve()
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.shutdown()


def _serve(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    server = build_agent(config, args.institution, args.master)
    inst = config.institution(args.institution)
    role = "label holder" if inst.is_label_holder else "passive party"
    print(f"agent {inst.name!r} ({role}) serving on "
          f"{inst.endpoint.rsplit(':', 1)[0]}:{server.port} for master {args.master!r}", flush=True)
    serve_until_stopped(server)
    print(f"agent {inst.name!r} stopped", flush=True)
    sys.stdout.flush()
    return 0
