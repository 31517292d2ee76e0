"""Transport overhead of Arrow Flight with mutual TLS against the in-process transport.

Three agents (each its own process) and a master on loopback train 200k x 40 (100 trees, depth 10), then the
same training with every party in the master's process. Reports times, rounds and bytes, and the overhead as a
share of the in-process training time (target: at most 25%).

    .venv/bin/python -m benchmarks.bench_flight_load [--rows 200000] [--trees 100] [--depth 10]
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import platform
import tempfile
import time
from pathlib import Path

import pandas as pd

from benchmarks.markdown import markdown_table
from fedcore.data.split import split_vertical
from fedcore.transport.flight import AgentServer, FlightTransport
from fedcore.transport.inprocess import InProcessTransport
from fedcore.transport.tls import init_ca, issue_certificate
from fedcore.trees.params import ForestParams
from fedcore.vertical.master import VerticalMaster
from fedcore.vertical.party import VerticalParty

PARTIES = ("bank", "ecommerce", "insurer")
FEATURE_KEY = hashlib.sha256(b"fedforest benchmark").digest()


def make_parties(rows: int, features: int = 40) -> list[pd.DataFrame]:
    """A synthetic classification table of `rows` x `features`, split vertically over PARTIES."""
    from sklearn.datasets import make_classification

    x, y = make_classification(rows, features, n_informative=20, random_state=0)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(features)])
    frame["y"] = y
    return split_vertical(frame, len(PARTIES), label="y", seed=0)


def serve(name: str, path: str, certs: str, port_queue) -> None:
    """Child process: one institution's agent on an ephemeral port, until killed."""
    frame = pd.read_parquet(path)
    party = VerticalParty(name, frame, "y" if "y" in frame.columns else None, feature_key=FEATURE_KEY)
    c = Path(certs)
    server = AgentServer(party, tls_cert=c / f"{name}.pem", tls_key=c / f"{name}.key", ca_cert=c / "ca.pem")
    port_queue.put((name, server.port))
    server.serve()


def train(transport, params: ForestParams) -> dict:
    """Fit a forest with `params` over `transport`: seconds, rounds, bytes and node count."""
    master = VerticalMaster(transport, params)
    started = time.perf_counter()
    master.fit()
    return {"seconds": time.perf_counter() - started, "rounds": transport.stats.rounds,
            "bytes": transport.stats.bytes, "nodes": master.structure.n_nodes}


def main() -> None:
    """Time training over Flight and in process, and print the overhead."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--depth", type=int, default=10)
    args = parser.parse_args()
    params = ForestParams(n_estimators=args.trees, max_depth=args.depth, random_state=0)
    frames = make_parties(args.rows)

    inprocess = InProcessTransport({n: VerticalParty(n, f, "y" if "y" in f.columns else None,
                                                     feature_key=FEATURE_KEY).handle
                                    for n, f in zip(PARTIES, frames, strict=True)})
    train(inprocess, ForestParams(n_estimators=2, max_depth=3))  # compile the kernels once
    local = train(InProcessTransport({n: VerticalParty(n, f, "y" if "y" in f.columns else None,
                                                       feature_key=FEATURE_KEY).handle
                                      for n, f in zip(PARTIES, frames, strict=True)}), params)
    print(f"in-process: {local}", flush=True)

    with tempfile.TemporaryDirectory() as work:
        certs = Path(work) / "certs"
        init_ca(certs)
        issue_certificate(certs, "master", certs, role="master")
        for name, frame in zip(PARTIES, frames, strict=True):
            issue_certificate(certs, name, certs)
            frame.to_parquet(Path(work) / f"{name}.parquet")
        context = multiprocessing.get_context("spawn")
        ports = context.Queue()
        children = [context.Process(target=serve,
                                    args=(n, str(Path(work) / f"{n}.parquet"), str(certs), ports),
                                    daemon=True) for n in PARTIES]
        for child in children:
            child.start()
        try:
            endpoints = dict(ports.get(timeout=120) for _ in PARTIES)
            with FlightTransport({n: f"grpc+tls://127.0.0.1:{endpoints[n]}" for n in PARTIES},
                                 tls_cert=certs / "master.pem", tls_key=certs / "master.key",
                                 ca_cert=certs / "ca.pem") as warm:
                warm.wait_ready(60)
                train(warm, ForestParams(n_estimators=2, max_depth=3))  # each agent compiles its kernels
            with FlightTransport({n: f"grpc+tls://127.0.0.1:{endpoints[n]}" for n in PARTIES},
                                 tls_cert=certs / "master.pem", tls_key=certs / "master.key",
                                 ca_cert=certs / "ca.pem") as transport:
                flight_run = train(transport, params)
        finally:
            for child in children:
                child.kill()
                child.join()
    print(f"flight: {flight_run}", flush=True)
    overhead = flight_run["seconds"] / local["seconds"] - 1
    print(f"\nMachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; {args.rows} "
          f"rows x 40 features, 3 parties, {args.trees} trees, depth {args.depth}\n")
    print(markdown_table([
        {"transport": "in-process (one process)", "train s": local["seconds"], "rounds": local["rounds"],
         "MB": local["bytes"] / 1e6, "overhead": "-"},
        {"transport": "Arrow Flight + mutual TLS (3 agent processes, loopback)",
         "train s": flight_run["seconds"], "rounds": flight_run["rounds"], "MB": flight_run["bytes"] / 1e6,
         "overhead": f"{100 * overhead:+.1f}%"},
    ], digits=2))


if __name__ == "__main__":
    main()
