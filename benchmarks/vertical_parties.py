"""The vertical runs of `bench_dask_scale --setting vertical`: one session, every party on its own cluster.

`--parties` institutions hold `--features` columns between them over the same `--rows` customers, each
table in its own row order (a seeded shuffle), written as Parquet files of `--block-rows` row groups; the
first holds the label. `in-process`: today's agents, each reading its whole table. `dask`: each agent
reads its files' metadata only and its own LocalCluster of `--workers` worker processes (memory limit
`--limit`) hashes, aligns, bins and trains (`fedcore.compute.dask_alignment`). Both run the three agents
in one process over the in-process transport; each run is its own process, so its peak RSS is its own.
"""

from __future__ import annotations

import argparse
import hashlib
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


def _agents(args: argparse.Namespace, clusters: list | None) -> dict:
    """The agents over `args.data`'s parties: in process (`clusters` None) or each on its cluster."""
    from fedcore.agents.data import InstitutionData
    from fedcore.compute.cluster import Cluster, DaskCompute
    from fedcore.compute.dask_table import open_parquet, profile
    from fedcore.vertical.agent import VerticalInstitutionAgent

    agents = {}
    for p in range(args.parties):
        name, files = f"party{p}", sorted(str(f) for f in (Path(args.data) / f"party{p}").glob("*.parquet"))
        common = {"name": name, "id_column": "id", "label": "y" if p == 0 else None,
                  "registry": Path(args.data) / "registry" / name, "predictions_dir": Path(args.data) / name}
        if clusters is None:
            data = InstitutionData(frame=pd.concat([pd.read_parquet(f) for f in files], ignore_index=True),
                                   **common)
        else:
            client = clusters[p][1]
            table = profile(client, open_parquet(files, f"institution {name!r}", args.block_rows), ["id"])
            data = InstitutionData(frame=pd.DataFrame(columns=list(table.columns)), table=table,
                                   compute=DaskCompute(block_rows=args.block_rows),
                                   cluster=Cluster(client, []), **common)
        agents[name] = VerticalInstitutionAgent(data, KEY)
    return agents


def _session_run(agents: dict, args: argparse.Namespace) -> dict:
    """Align and train; the time of each and the forest's digest (structure and every party's splits)."""
    from fedcore.transport.inprocess import InProcessTransport
    from fedcore.trees.params import ForestParams
    from fedcore.vertical.session import VerticalSession

    session = VerticalSession(InProcessTransport({n: a.handle for n, a in agents.items()}),
                              ForestParams(n_estimators=args.trees, max_depth=args.depth, random_state=1),
                              holdout_fraction=0.2, min_overlap=1)
    start = time.perf_counter()
    session.align()
    aligned = time.perf_counter()
    session.train()
    trained = time.perf_counter()
    h = hashlib.sha256()
    s = session.master.structure
    for field in ("tree", "node", "left", "right", "owner", "weight", "value"):
        h.update(np.ascontiguousarray(getattr(s, field)).tobytes())
    for name in sorted(agents):
        m = agents[name].party.model
        for field in ("feature", "threshold", "missing_left", "cat_bits"):
            h.update(np.ascontiguousarray(getattr(m, field)).tobytes())
    session.close()
    return {"align_seconds": aligned - start, "seconds": trained - aligned, "digest": h.hexdigest()[:16]}


def run_in_process(args: argparse.Namespace) -> dict:
    """Every agent reads its whole table into the process."""
    from benchmarks.bench_dask_party import _peak_rss_mib

    result = _session_run(_agents(args, None), args)
    return {**result, "agent_peak_mib": _peak_rss_mib()}


def run_on_dask(args: argparse.Namespace) -> dict:
    """Every agent on its own LocalCluster, reading its Parquet metadata only."""
    from distributed import Client, LocalCluster

    from benchmarks.bench_dask_party import _peak_rss_mib, _vm_hwm_mib

    clusters = []
    for _ in range(args.parties):
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                               dashboard_address=":0", memory_limit=args.limit or "auto",
                               env={"NUMBA_NUM_THREADS": "1"})
        clusters.append((cluster, Client(cluster)))
    try:
        result = _session_run(_agents(args, clusters), args)
        peaks = [max(client.run(_vm_hwm_mib).values()) for _, client in clusters]
    finally:
        for cluster, client in clusters:
            client.close()
            cluster.close()
    return {**result, "agent_peak_mib": _peak_rss_mib(), "workers_peak_mib": peaks}
