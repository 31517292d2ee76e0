"""`fedforest agent serve`: run one institution's agent, answering the master over Flight with mutual TLS.

    fedforest agent serve --config federation.yaml --institution bank

The agent serves the institution's agent (vertical or horizontal, by the config's setting) on its
`endpoint` with its `cert`/`key` and the consortium CA (`tls.ca`); at the start of every session it loads
the institution's files and checks them against its data contract. Only the master whose certificate
names it `--master` (default "master") is served. Ctrl-C or SIGTERM stops it cleanly.

    fedforest agent serve --config federation.yaml --institution bank --parent-pid 4242

With `--parent-pid` (how `retrain --agents local` starts its agents) the agent also stops once that
process is no longer its parent: a master killed with SIGKILL cannot stop its agents, and they would
otherwise hold their ports forever, in front of the agents a restarted master starts.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
import threading
import weakref
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
    serve.add_argument("--parent-pid", type=int, metavar="PID",
                       help="stop serving once process PID is no longer this agent's parent (the master that "
                            "started it died, even by SIGKILL)")
    serve.set_defaults(handler=_serve)


def build_agent(config: FederationConfig, name: str, master: str = "master") -> AgentServer:
    """An `AgentServer` for institution `name` on its endpoint, with its certificate and the consortium CA.

    It (re)loads and validates the institution's data at the start of every session.
    """
    from fedcore.agents.serve import build_institution_server

    inst = config.institution(name)
    missing = [k for k, v in (("endpoint", inst.endpoint), ("cert", inst.cert), ("key", inst.key)) if not v]
    if missing:
        raise ConfigError(f"{config.path}: institution {name!r} needs {', '.join(map(repr, missing))} to run "
                          "an agent")
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


def serve_until_stopped(server: AgentServer, parent_pid: int | None = None, poll_s: float = 0.25) -> bool:
    """Serve until Ctrl-C or SIGTERM, or until the process `parent_pid` is no longer this one's parent.

    Flight shuts the server down on either signal, then Python sees it. Returns whether the parent is
    gone.
    """
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    done, orphaned = threading.Event(), threading.Event()

    def watch_parent() -> None:
        while not done.wait(poll_s):
            if os.getppid() != parent_pid:  # re-parented: the process that started this agent has died
                orphaned.set()
                server.shutdown()  # from this thread: running calls finish, then serve() returns
                return

    watcher = threading.Thread(target=watch_parent, name="parent-watch", daemon=True)
    if parent_pid is not None:
        watcher.start()
    try:
        server.serve()
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        done.set()
        signal.signal(signal.SIGTERM, previous)
        server.shutdown()
    return orphaned.is_set()


def print_agent_log() -> None:
    """Print what the agent logs for its operator on stdout, next to the serving lines.

    That is the `fedcore.agents` log: contract violations, versions stored, predictions written.
    """
    from fedcore import agents

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("agent %(message)s"))
    agents.log.addHandler(handler)
    agents.log.setLevel(logging.INFO)


def _serve(args: argparse.Namespace) -> int:
    print_agent_log()
    config = load_config(args.config)
    server = build_agent(config, args.institution, args.master)
    inst = config.institution(args.institution)
    role = "label holder" if inst.is_label_holder else "passive party"
    print(f"agent {inst.name!r} ({role}) serving on "
          f"{inst.endpoint.rsplit(':', 1)[0]}:{server.port} for master {args.master!r}", flush=True)
    if serve_until_stopped(server, args.parent_pid):
        print(f"agent {inst.name!r}: the process that started it (pid {args.parent_pid}) is gone", flush=True)
    print(f"agent {inst.name!r} stopped", flush=True)
    sys.stdout.flush()
    served = weakref.ref(server)
    del server
    _exit_quickly(served)
    return 0


def _exit_quickly(served: weakref.ref) -> None:
    """Make the process exit at once once serving stopped.

    The master stops its local agents after every run and waits for them. Two things would hold it for
    seconds: gRPC's exit handler waits up to 2 s for gRPC to shut down, which it cannot while the Flight
    server object is alive, so the server is released here; and the interpreter's last garbage
    collections go over everything the session imported (GX, scipy, numba: 1.5-2 s of CPU), so what is
    left is frozen and left to the OS.
    """
    if served() is not None:  # held by a reference cycle: collect just once, then freeze the rest
        gc.collect()
    gc.freeze()
