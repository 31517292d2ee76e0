"""The `compute:` setting (where an institution's party does its row work) and connecting to Dask.

Forms, all parsed here once:

* a config's `institutions[].compute`: `{dask: {address: tcp://host:8786}}` (a running scheduler, TLS
  from Dask's own `distributed.comm.tls` settings for a `tls://` address) or
  `{dask: {local: {workers: 2, threads_per_worker: 1, memory_limit: 4GiB}}}` (a `LocalCluster` the
  agent starts); both may add `block_rows` (rows per block) and `connect_timeout_s`;
* the estimators' `compute=` and `fedforest simulate --dask`: `"local:N"`, a scheduler address, or (the
  estimators) a `distributed.Client`.

Absent (None): today's in-process party, unchanged.

One lifecycle owns every cluster: a process keeps one cluster per setting (`shared_cluster`) across its
sessions; whatever uses it holds it meanwhile (`hold_shared`: an agent server while it serves, an agent
flow run, an estimator's fit, `held_cluster`) and the last holder to let go closes it (`atexit` as a last
resort). A `distributed.Client` a caller gives is the caller's: used, never closed.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from fedcore.compute import DEFAULT_BLOCK_ROWS
from fedcore.errors import ConfigError, ParameterError

if TYPE_CHECKING:
    from distributed import Client

log = logging.getLogger(__name__)
DASK_KEYS = ("address", "local", "block_rows", "connect_timeout_s")
LOCAL_KEYS = ("workers", "threads_per_worker", "memory_limit", "processes")
ADDRESS = re.compile(r"^(tcp|tls|ucx|inproc)://\S+$")
WORKER_IDLE_BYTES = 256 * 2**20
"""A Dask worker process's resident memory with fedcore's row modules imported (pandas, pyarrow, numba):
measured 202 MiB (63 MiB fresh), taken as 256 MiB."""


@dataclass(frozen=True)
class DaskCompute:
    """A party's rows on Dask: a scheduler's `address`, or a local cluster of `workers`."""

    address: str | None = None
    workers: int = 2
    threads_per_worker: int = 1
    memory_limit: str | int | None = None
    processes: bool = True
    block_rows: int = DEFAULT_BLOCK_ROWS
    connect_timeout_s: float = 30.0

    def describe(self) -> str:
        """One line for logs and errors."""
        if self.address is not None:
            return f"the Dask scheduler at {self.address}"
        limit = f", {self.memory_limit} each" if self.memory_limit is not None else ""
        return f"a local Dask cluster of {self.workers} worker(s){limit}"


def _positive_int(value: Any, what: str, error: type[Exception]) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise error(f"{what} must be a positive integer, got {value!r}")
    return value


def parse_compute(raw: Any, where: str) -> DaskCompute | None:
    """An institution's `compute:` mapping, or None when absent; ConfigError names `where` and the fix."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or list(raw) != ["dask"] or not isinstance(raw["dask"], dict):
        raise ConfigError(f"{where}: compute must be {{dask: {{address: tcp://host:8786}}}} or "
                          f"{{dask: {{local: {{workers: 2}}}}}}, got {raw!r}")
    dask = raw["dask"]
    try:
        _known(dask, DASK_KEYS, "compute.dask")
        if ("address" in dask) == ("local" in dask):
            raise ConfigError("compute.dask needs exactly one of 'address' (a running scheduler) or 'local' "
                              "(a cluster the agent starts)")
        fields = _common_fields(dask)
        if "address" in dask:
            address = dask["address"]
            if not isinstance(address, str) or not ADDRESS.match(address):
                raise ConfigError(f"compute.dask.address must be a scheduler address such as "
                                  f"tcp://scheduler:8786 or tls://scheduler:8786, got {address!r}")
            return DaskCompute(address=address, **fields)
        return DaskCompute(**fields, **_local_fields(dask["local"] if dask["local"] is not None else {}))
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None


def _known(mapping: dict, keys: tuple[str, ...], what: str) -> None:
    unknown = sorted(set(mapping) - set(keys))
    if unknown:
        raise ConfigError(f"unknown {what} setting(s) {unknown}; valid: {list(keys)}")


def _common_fields(dask: dict) -> dict[str, Any]:
    """`block_rows` and `connect_timeout_s`, checked."""
    fields: dict[str, Any] = {}
    if "block_rows" in dask:
        fields["block_rows"] = _positive_int(dask["block_rows"], "compute.dask.block_rows", ConfigError)
    if "connect_timeout_s" in dask:
        timeout = dask["connect_timeout_s"]
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigError(f"compute.dask.connect_timeout_s must be a positive number, got {timeout!r}")
        fields["connect_timeout_s"] = float(timeout)
    return fields


def _local_fields(local: Any) -> dict[str, Any]:
    """`compute.dask.local`'s fields, checked."""
    if not isinstance(local, dict):
        raise ConfigError(f"compute.dask.local must be a mapping of {list(LOCAL_KEYS)}, got {local!r}")
    _known(local, LOCAL_KEYS, "compute.dask.local")
    fields: dict[str, Any] = {}
    for name in ("workers", "threads_per_worker"):
        if name in local:
            fields[name] = _positive_int(local[name], f"compute.dask.local.{name}", ConfigError)
    if "memory_limit" in local:
        fields["memory_limit"] = _memory_limit(local["memory_limit"])
    if "processes" in local:
        if not isinstance(local["processes"], bool):
            raise ConfigError("compute.dask.local.processes must be true or false, got "
                              f"{local['processes']!r}")
        fields["processes"] = local["processes"]
    return fields


def smallest_memory_limit() -> int:
    """The smallest worker `memory_limit` that works, in bytes (MiB-rounded up).

    Dask pauses a worker once it holds `distributed.worker.memory.pause` of its limit (0.8 by default) and
    waits for memory that never comes back (a run at 400 MiB hung 14 minutes). The rule: the idle worker
    (`WORKER_IDLE_BYTES`) may take at most half of that threshold, the other half is a block's work:
    2 x 256 MiB / 0.8 = 640 MiB.
    """
    mib = 2**20
    return -(-int(2 * WORKER_IDLE_BYTES / _pause_fraction()) // mib) * mib


def _pause_fraction() -> float:
    """Dask's `distributed.worker.memory.pause` (a share of the limit; False, never: 1.0)."""
    import dask

    return float(dask.config.get("distributed.worker.memory.pause", 0.8) or 1.0)


def _memory_limit(value: Any) -> str | int:
    """A worker's memory limit: bytes, or a size Dask reads ("4GiB", "512MB"); under what works: refused."""
    from dask.utils import parse_bytes

    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"compute.dask.local.memory_limit must be a size such as 4GiB, got {value!r}")
    try:
        limit = parse_bytes(value)
        if limit <= 0:
            raise ValueError
    except (ValueError, TypeError):
        raise ConfigError(f"compute.dask.local.memory_limit must be a size such as 4GiB, got {value!r}") \
            from None
    smallest = smallest_memory_limit()
    if limit < smallest:
        mib = 2**20
        raise ConfigError(f"compute.dask.local.memory_limit {value!r} is below the smallest that works, "
                          f"{smallest // mib}MiB: an idle worker takes about {WORKER_IDLE_BYTES // mib} MiB "
                          f"and Dask pauses a worker at {_pause_fraction():.0%} of its limit, so its tasks "
                          f"would wait forever; set memory_limit: {smallest // mib}MiB or more")
    return value


def compute_from_spec(spec: Any, block_rows: int | None = None) -> DaskCompute | Client | None:
    """The estimators' `compute=` and simulate's `--dask`: None, "local:N", an address, or a Client."""
    if spec is None:
        return None
    if isinstance(spec, DaskCompute):
        return spec
    fields: dict[str, Any] = {}
    if block_rows is not None:
        fields["block_rows"] = _positive_int(block_rows, "block_rows", ParameterError)
    if isinstance(spec, str):
        match = re.fullmatch(r"local:(\d+)", spec)
        if match and int(match.group(1)) >= 1:
            return DaskCompute(workers=int(match.group(1)), **fields)
        if ADDRESS.match(spec):
            return DaskCompute(address=spec, **fields)
    else:
        try:
            from distributed import Client
        except ImportError:  # pragma: no cover - dask is a dependency
            Client = None  # type: ignore[assignment,misc]  # noqa: N806
        if Client is not None and isinstance(spec, Client):
            return spec
    raise ParameterError(f"compute must be None, 'local:N' (N workers on this machine), a Dask scheduler "
                         f"address such as 'tcp://scheduler:8786', or a distributed.Client; got {spec!r}")


class Cluster:
    """A connected Dask client, and the local cluster it started (closed with it), as a context manager."""

    def __init__(self, client: Client, owned: list) -> None:
        """`owned`: what `close` shuts down (the client and cluster this object started)."""
        self.client = client
        self._owned = owned

    def close(self) -> None:
        """Close what this object started; a Client given by the caller stays open."""
        for thing in self._owned:
            thing.close()
        self._owned = []

    def __enter__(self) -> Cluster:
        """The cluster, closed on leaving the block."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close what this object started."""
        self.close()


AGENT_TCP_TIMEOUT = "300s"
"""How long a connection to or inside the party's cluster may go unacknowledged before Dask calls it dead,
where Dask's default (30 s) is unchanged. An agent busy with a large message, on a loaded host, can leave its
event loop unread for longer than 30 s; the kernel then times out its client's connection to the scheduler
(`TimeoutError: [Errno 110]`, as the 8,750,000-row vertical run did under load, issue #29), and the session
is lost. A process that really died is still found by Dask's heartbeats."""
DASK_DEFAULT_TCP_TIMEOUT = "30s"

AGENT_DASK_CONFIG: dict[str, tuple[Any, Any]] = {
    "distributed.comm.timeouts.tcp": (DASK_DEFAULT_TCP_TIMEOUT, AGENT_TCP_TIMEOUT),
    "distributed.admin.tick.interval": ("20ms", "1s"),
    "distributed.worker.profile.enabled": (True, False),
    "distributed.admin.system-monitor.interval": ("500ms", "2s"),
    "distributed.scheduler.work-stealing": (True, False),
}
"""Per Dask setting, (Dask's default, the agent's): the TCP timeout above, and a quieter cluster. Every
process of an idle LocalCluster of 2 workers wakes up to check its event loop every 20 ms, sample its
threads' stacks every 10 ms (workers) and poll psutil every 500 ms, all for diagnostics: 0.085 CPU seconds
a second in all (agent with its scheduler and dashboard, nannies and workers), 0.024 with these
(docs/benchmarks.md, issue #29), which a party pays through a whole session. The event loop's blocked-time
warning still comes (`distributed.admin.tick.limit`), later; the workers' statistical profile (a dashboard
page) is off. Work stealing is off: a block's tasks run where its codes and partition are (their
dependencies place them), and a stolen task moved a whole block (a 250,000-row frame for a `bin` task) to a
worker that looked idle while the other party's workers had the cores; a lost worker's tasks are still
placed anew by the scheduler."""


def agent_dask_config() -> None:
    """This process's Dask settings to AGENT_DASK_CONFIG's, each one unless it was configured.

    Process-wide, before the cluster's first connection: the client's, the scheduler's, and the local
    workers' (their nannies pass the configuration on). A value other than Dask's default is left alone. A
    remote cluster's scheduler and workers keep their own configuration (deployments/README.md).
    """
    import dask
    import distributed  # noqa: F401  (its defaults join dask.config on import)

    chosen = {key: ours for key, (default, ours) in AGENT_DASK_CONFIG.items()
              if dask.config.get(key) == default}
    if chosen:
        dask.config.set(chosen)


def _worker_environment(compute: DaskCompute) -> dict[str, Any]:
    """A local worker process's numba threads: its Dask threads, unless NUMBA_NUM_THREADS is set here.

    As Dask's nannies do for OpenMP, MKL and OpenBLAS (1 thread): without it every worker process ran its
    parallel kernels on all the host's cores, 4 processes of 2 threads each on 2 cores (the benchmarks
    always gave their workers 1, issue #29). In-process workers (threads) share this process's numba.
    """
    if not compute.processes or "NUMBA_NUM_THREADS" in os.environ:
        return {}
    return {"env": {"NUMBA_NUM_THREADS": str(compute.threads_per_worker)}}


def _connect(compute: DaskCompute) -> Cluster:
    """A client to `compute`'s cluster: a scheduler reached within its timeout, or a new LocalCluster.

    Only `shared_cluster` calls it, so that every cluster has the one lifecycle. A scheduler that does not
    answer is one ConfigError naming its address and the timeout.
    """
    from distributed import Client, LocalCluster

    agent_dask_config()
    if compute.address is not None:
        try:
            client = Client(compute.address, timeout=compute.connect_timeout_s, set_as_default=False)
        except (OSError, TimeoutError):
            raise ConfigError(f"cannot reach the Dask scheduler at {compute.address} within "
                              f"{compute.connect_timeout_s:g} s: check compute.dask.address (or --dask) and "
                              "that the scheduler runs") from None
        return Cluster(client, [client])
    cluster = LocalCluster(n_workers=compute.workers, threads_per_worker=compute.threads_per_worker,
                           memory_limit=compute.memory_limit or "auto", processes=compute.processes,
                           dashboard_address=":0", **_worker_environment(compute))
    client = Client(cluster, set_as_default=False)
    return Cluster(client, [client, cluster])


_SHARED: dict[DaskCompute, Cluster] = {}
"""The clusters this process connected to (or started), one per `compute:` setting, kept across sessions."""
_HOLDERS: dict[DaskCompute, int] = {}
_LOCK = threading.Lock()


def shared_cluster(compute: DaskCompute) -> Cluster:
    """This process's cluster for `compute`: connected (or started) on first use, the same one after.

    An agent's sessions (and its data loads) share it rather than start a cluster each.
    """
    with _LOCK:
        kept = _SHARED.get(compute)
        if kept is not None and kept.client.status in ("closing", "closed"):  # it lost its scheduler for good
            log.warning("the client to %s was closed (its scheduler lost); connecting again",
                        compute.describe())
            kept.close()
            kept = None
        if kept is None:
            kept = _SHARED[compute] = _connect(compute)
            log.info("data-local work on %s, kept for this process's sessions", compute.describe())
        return kept


def hold_shared(compute: DaskCompute) -> Callable[..., None]:
    """Keep `compute`'s shared cluster until the returned call (an agent server: until it shuts down).

    The last holder's call closes it: a local cluster stops with its workers; a remote scheduler's client
    closes and the cluster runs on. Called with `keep=True`, it lets go without closing: the cluster stays
    the process's for its next holder (`loading_cluster`). Calling it twice releases once.
    """
    with _LOCK:
        _HOLDERS[compute] = _HOLDERS.get(compute, 0) + 1
    released = threading.Event()

    def release(keep: bool = False) -> None:
        with _LOCK:
            if released.is_set():
                return
            released.set()
            left = _HOLDERS.pop(compute, 0) - 1  # 0 held after `close_shared_clusters`
            if left > 0:
                _HOLDERS[compute] = left
                return
            cluster = None if keep else _SHARED.pop(compute, None)
        if cluster is not None:
            cluster.close()

    return release


@contextmanager
def held_cluster(compute: DaskCompute | Client | None) -> Iterator[Cluster | None]:
    """`compute`'s cluster held for a block of work (an estimator's fit, an agent flow run), then let go.

    The process's shared cluster (`shared_cluster`), held (`hold_shared`) until the block ends or fails:
    one it started then closes, unless something else of the process (an agent server) still holds it.
    A Client the caller gave is used as it is and stays open; None (in process) holds nothing.
    """
    if not isinstance(compute, DaskCompute):
        yield None if compute is None else Cluster(compute, [])
        return
    release = hold_shared(compute)
    try:
        yield shared_cluster(compute)
    finally:
        release()


@contextmanager
def loading_cluster(compute: DaskCompute | None) -> Iterator[Callable[[], Cluster]]:
    """For loading an institution's data: a call that gives `compute`'s shared cluster, held from then on.

    If the load fails, the cluster is let go as `held_cluster` lets go (one the load started closes);
    loaded, it stays the process's for whoever then uses the data (an agent server, a flow run holds it).
    """
    releases: list[Callable[..., None]] = []

    def cluster() -> Cluster:
        assert compute is not None, "only an institution with compute: dask has a cluster"
        if not releases:
            releases.append(hold_shared(compute))
        return shared_cluster(compute)

    try:
        yield cluster
    except BaseException:
        for release in releases:
            release()
        raise
    for release in releases:
        release(keep=True)


def cluster_loss(error: BaseException) -> str | None:
    """What went wrong with this process's Dask cluster, if `error` (or what caused it) says it went away.

    The client's connection to its scheduler closed or timed out (its futures are then cancelled, and the
    client closed once it cannot reconnect within its timeout), the scheduler restarted or lost the
    tasks' inputs, a connection to the cluster failed inside Dask, or tasks killed every worker that ran
    them (`KilledWorker`, most often a worker over its memory limit). fedcore never cancels its own futures,
    so a cancelled one means the cluster. None for any other error, and always when this process never
    imported Dask.
    """
    if "distributed" not in sys.modules:
        return None
    from distributed.client import FutureCancelledError, FuturesCancelledError
    from distributed.comm.core import CommClosedError
    from distributed.scheduler import KilledWorker

    for cause in _causes(error):
        if isinstance(cause, KilledWorker):
            what = (f"Dask gave up on a task after the workers running it died {cause.allowed_failures + 1} "
                    "times (KilledWorker; most often a worker over its memory limit: see the workers' logs)")
        elif isinstance(cause, CommClosedError):
            what = "the connection to its scheduler closed (CommClosedError)"
        elif isinstance(cause, (FutureCancelledError, FuturesCancelledError)):
            reasons = ({cause.reason} if isinstance(cause, FutureCancelledError)
                       else {group.reason for group in cause.error_groups}) - {"unknown"}
            what = "the cluster cancelled its tasks" + (f" ({', '.join(sorted(reasons))})" if reasons else "")
        elif isinstance(cause, OSError) and _raised_in_dask(cause):  # TimeoutError is an OSError
            what = f"a connection to the cluster failed ({type(cause).__name__})"
        else:
            continue
        return f"{what}, on {_clusters_in_use()}"
    return None


def _causes(error: BaseException) -> Iterator[BaseException]:
    """`error`, then what it was raised from or during, innermost last (each once)."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        yield cause
        cause = cause.__cause__ or cause.__context__


def _raised_in_dask(error: BaseException) -> bool:
    """Whether `error` was raised by Dask's own code (its innermost frame is in the distributed package)."""
    stack = traceback.extract_tb(error.__traceback__)
    return bool(stack) and "distributed" in PurePath(stack[-1].filename).parts


def _clusters_in_use() -> str:
    """This process's shared clusters, each with its client's state when it is no longer connected."""
    with _LOCK:
        described = [compute.describe() + ("" if kept.client.status == "running"
                                           else " (its client disconnected)")
                     for compute, kept in _SHARED.items()]
    return " and ".join(described) or "the Dask cluster given to it"


def close_shared_clusters() -> None:
    """Close every shared cluster of this process (at interpreter exit, whatever still holds them)."""
    with _LOCK:
        clusters = list(_SHARED.values())
        _SHARED.clear()
        _HOLDERS.clear()
    for cluster in clusters:
        cluster.close()


atexit.register(close_shared_clusters)  # a last resort: agent servers close theirs when they stop
