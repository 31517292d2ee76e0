"""The vertical runs of `bench_dask_scale --setting vertical`: one session, every party in its own process.

`--parties` institutions hold `--features` columns between them over the same `--rows` customers, each
table in its own row order (a seeded shuffle), written as Parquet files of `--block-rows` row groups; the
first holds the label. Every institution's agent is its own process served over Arrow Flight with mutual
TLS (so each peak RSS is that agent's own, `VmHWM`), the master the calling process. `in-process`: today's
agents, each reading its whole table. `dask`: each agent reads its files' metadata only and its own
LocalCluster of `--workers` worker processes (memory limit `--limit`) hashes, aligns, bins and trains
(`fedcore.compute.dask_alignment`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

KEY = b"benchmark consortium key 0123456789"


def write_parties(folder: Path, rows: int, features: int, parties: int, row_group: int) -> None:
    """Each party's columns of a synthetic classification table, in its own row order, as Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, features))
    y = np.where(x @ rng.normal(size=features) + rng.normal(size=rows) > 0, "yes", "no")
    ids = np.array([f"C{i:09d}" for i in range(rows)], dtype=object)
    for p, columns in enumerate(np.array_split(np.arange(features), parties)):
        order = np.random.default_rng(100 + p).permutation(rows)
        table = {"id": ids[order], **{f"f{j}": x[order, j] for j in columns}}
        if p == 0:
            table["y"] = y[order]
        (folder / f"party{p}").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(table), folder / f"party{p}" / "part-0.parquet", row_group_size=row_group)


def _agent(args: argparse.Namespace, p: int, client):
    """Party `p`'s agent over `args.data`: in process (`client` None) or on `client`'s cluster."""
    from fedcore.agents.data import InstitutionData
    from fedcore.compute.cluster import Cluster, DaskCompute
    from fedcore.compute.dask_table import open_parquet, profile
    from fedcore.vertical.agent import VerticalInstitutionAgent

    name, files = f"party{p}", sorted(str(f) for f in (Path(args.data) / f"party{p}").glob("*.parquet"))
    common = {"name": name, "id_column": "id", "label": "y" if p == 0 else None,
              "registry": Path(args.data) / "registry" / name, "predictions_dir": Path(args.data) / name}
    if client is None:
        data = InstitutionData(frame=pd.concat([pd.read_parquet(f) for f in files], ignore_index=True),
                               **common)
    else:
        table = profile(client, open_parquet(files, f"institution {name!r}", args.block_rows), ["id"])
        data = InstitutionData(frame=pd.DataFrame(columns=list(table.columns)), table=table,
                               compute=DaskCompute(block_rows=args.block_rows), cluster=Cluster(client, []),
                               **common)
    return VerticalInstitutionAgent(data, KEY)


def _model_digest(agent) -> str:
    """A digest of the party's own part of the forest (every split it holds)."""
    h = hashlib.sha256()
    m = agent.party.model
    for field in ("feature", "threshold", "missing_left", "cat_bits"):
        h.update(np.ascontiguousarray(getattr(m, field)).tobytes())
    return h.hexdigest()


def serve_party(args: argparse.Namespace, p: int, on_dask: bool, certs: str, queue, done) -> None:
    """Child process: party `p`'s agent over Flight until `done`; then its digest and peak RSS on `queue`."""
    from benchmarks.bench_dask_party import _vm_hwm_mib
    from fedcore.transport.allocator import limit_malloc_arenas
    from fedcore.transport.flight import AgentServer

    os.setsid()  # its own process group: the harness can kill it with its cluster's workers (`_stop`)
    limit_malloc_arenas()  # as an agent process does first (flows/agent.py), before any thread starts
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("fedcore.compute.level_clock").setLevel(logging.INFO)  # each tree batch's levels
    cluster = client = None
    if on_dask:
        from distributed import Client, LocalCluster

        from fedcore.compute.cluster import agent_dask_config

        agent_dask_config()  # as an agent's own cluster (`fedcore.compute.cluster._connect`)
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                               dashboard_address=":0", memory_limit=args.limit or "auto",
                               env={"NUMBA_NUM_THREADS": "1"})
        client = Client(cluster)
        pids = client.run(os.getpid)
    name, c = f"party{p}", Path(certs)
    stages = None
    if getattr(args, "profile", False):
        from benchmarks.agent_profile import StageProfile

        stages = StageProfile()
        stages.mark("cluster started" if on_dask else "started")
    timeline = None
    if getattr(args, "timeline", None):
        from benchmarks.timeline import Timeline

        timeline = Timeline(client)
    agent = _agent(args, p, client)
    server = AgentServer(agent, tls_cert=c / f"{name}.pem", tls_key=c / f"{name}.key", ca_cert=c / "ca.pem")
    if stages is not None:
        stages.mark("table opened" if on_dask else "table loaded")
        stages.wrap(server)
    if timeline is not None:
        timeline.wrap(server)
    queue.put(("port", name, server.port))
    threading.Thread(target=server.serve, daemon=True).start()
    done.wait()
    if timeline is not None:
        timeline.write(Path(args.timeline) / f"{name}.json")
    peak = _vm_hwm_mib() if stages is None else stages.peak_mib()  # a profile resets VmHWM per stage
    result = {"digest": _model_digest(agent), "agent_peak_mib": peak, "workers_peak_mib": [],
              "restarted": None, "stages": stages.rows if stages is not None else None}
    if client is not None:  # a worker over L is restarted by its nanny: a new pid
        result.update(workers_peak_mib=sorted(client.run(_vm_hwm_mib).values()),
                      restarted=client.run(os.getpid) != pids)
    queue.put(("result", name, result))
    server.shutdown()
    if client is not None:
        client.close()
        cluster.close()


def _stop(children: list, grace: float) -> None:
    """Let each agent process end within `grace` seconds, then kill its process group (its Dask workers too).

    A failed run does not wait: its agents may still be busy in a level, and would hold the cores for minutes.
    """
    for child in children:
        child.join(timeout=grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone when all ended
            os.killpg(child.pid, signal.SIGKILL)
        child.join(timeout=10)


def _session_run(args: argparse.Namespace, on_dask: bool) -> dict:
    """Align and train with every agent in its own process; times, the forest's digest, each one's peaks."""
    import tempfile

    from fedcore.transport.flight import FlightTransport
    from fedcore.transport.tls import init_ca, issue_certificate
    from fedcore.trees.params import ForestParams
    from fedcore.vertical.session import VerticalSession

    names = [f"party{p}" for p in range(args.parties)]
    with tempfile.TemporaryDirectory() as certs:
        init_ca(certs)
        issue_certificate(certs, "master", certs, role="master")
        for name in names:
            issue_certificate(certs, name, certs)
        context = multiprocessing.get_context("spawn")
        queue, done = context.Queue(), context.Event()
        children = [context.Process(target=serve_party, args=(args, p, on_dask, certs, queue, done))
                    for p in range(args.parties)]
        for child in children:
            child.start()
        finished = False
        try:
            ports = {name: port for _, name, port in (queue.get(timeout=3600) for _ in names)}
            transport = FlightTransport({n: f"grpc+tls://127.0.0.1:{ports[n]}" for n in names},
                                        tls_cert=Path(certs) / "master.pem",
                                        tls_key=Path(certs) / "master.key", ca_cert=Path(certs) / "ca.pem")
            transport.wait_ready(60)
            session = VerticalSession(transport, ForestParams(n_estimators=args.trees, max_depth=args.depth,
                                                              random_state=1),
                                      holdout_fraction=0.2, min_overlap=1,
                                      alignment=getattr(args, "alignment", "hash"))
            start = time.perf_counter()
            session.align()
            aligned = time.perf_counter()
            session.train()
            trained = time.perf_counter()
            structure = session.master.structure
            session.close()
            done.set()
            results = {name: result for _, name, result in (queue.get(timeout=600) for _ in names)}
            finished = True
        finally:
            done.set()
            _stop(children, grace=120 if finished else 0)
    h = hashlib.sha256()
    for field in ("tree", "node", "left", "right", "owner", "weight", "value"):
        h.update(np.ascontiguousarray(getattr(structure, field)).tobytes())
    for name in names:
        h.update(results[name]["digest"].encode())
    agents = [results[name]["agent_peak_mib"] for name in names]
    return {"align_seconds": aligned - start, "seconds": trained - aligned, "digest": h.hexdigest()[:16],
            "agents_peak_mib": agents, "agent_peak_mib": max(agents),
            "workers_peak_mib": [results[name]["workers_peak_mib"] for name in names],
            "restarted": [r for name in names if (r := results[name]["restarted"]) is not None],
            "stages": {name: results[name]["stages"] for name in names}}


def run_in_process(args: argparse.Namespace) -> dict:
    """Every agent reads its whole table into its process."""
    return _session_run(args, on_dask=False)


def run_on_dask(args: argparse.Namespace) -> dict:
    """Every agent on its own LocalCluster, reading its Parquet metadata only."""
    return _session_run(args, on_dask=True)
