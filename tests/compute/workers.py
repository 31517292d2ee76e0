"""Losing a worker mid-forest (the worker-loss tests); what a test leaves running (the lifecycle tests)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


def close_busiest_worker(cluster, client) -> str:
    """Close the worker holding the most futures (it must hold some); returns its name."""
    held = client.has_what()
    name, worker = max(cluster.workers.items(), key=lambda item: len(held[item[1].address]))
    assert held[worker.address], "the worker to lose holds blocks"
    cluster.sync(worker.close)
    return name


def lose_a_worker_on_call(monkeypatch, owner: object, method: str, call: int, cluster, client,
                          settle: bool = False) -> list[str]:
    """Patch `owner.method` so that, once its `call`-th call has returned, the busiest worker is closed.

    `owner` is a class (its method gets `self` first) or a module (its function). `settle`: the call
    returns futures, which are computed before the worker goes (so that it takes finished results the
    caller has not gathered yet). Returns the list the closed worker's name is put in (empty until then).
    """
    original = getattr(owner, method)
    calls, lost = [0], []

    def patched(*args, **kwargs):
        out = original(*args, **kwargs)
        calls[0] += 1
        if calls[0] == call and not lost:
            if settle:
                for future in out:
                    assert future.exception() is None  # waits for it, fetching nothing
            lost.append(close_busiest_worker(cluster, client))
        return out

    monkeypatch.setattr(owner, method, patched)
    return lost


@contextmanager
def losable_cluster(workers: int = 3) -> Iterator[tuple]:
    """(cluster, client) of `workers` in-process workers of the test's own, so that it may close one."""
    import distributed

    cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=False,
                                       dashboard_address=":0")
    client = distributed.Client(cluster, set_as_default=False)
    try:
        yield cluster, client
    finally:
        client.close()
        cluster.close()


def worker_processes() -> set[int]:
    """This process's children (a LocalCluster's nannies and workers), but multiprocessing's tracker."""
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())}


def open_clusters() -> list:
    """This process's Dask clusters, schedulers and workers not closed (`distributed`'s own registries)."""
    from distributed import Nanny, Scheduler, Worker
    from distributed.core import Status
    from distributed.deploy.spec import SpecCluster

    return [thing for kind in (SpecCluster, Scheduler, Nanny, Worker) for thing in list(kind._instances)
            if thing.status not in (Status.closed, Status.closing, Status.failed)]
