"""Worker processes for homomorphic-encryption arithmetic.

A passive party's bin sums and the label holder's encryption (`encrypt_over_workers`).

gmpy2 keeps the GIL for multiplications (the bulk of both), so threads run them on one core. These are
`python -m fedcore.privacy.gmp_worker` processes the project starts itself, talking over pipes: no
multiprocessing start method re-imports the caller's `__main__` (a script, a notebook, a Prefect flow).
Each worker keeps its state (the label ciphertexts' powers, or the key and its tables) between requests.
A worker exits when its stdin closes: when `close` is called, the pool is collected, or the parent dies.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fedcore.errors import ProtocolError
from fedcore.privacy.gmp_worker import read_frame, write_frame
from fedcore.trees.budget import MIB

if TYPE_CHECKING:
    from fedcore.privacy.homomorphic import AdditivePrivateKey

log = logging.getLogger(__name__)

MIN_ROWS = 5_000
"""Below this many label rows, workers cost more to start and feed than they save."""


def default_worker_count(rows: int, bytes_each: int = 0, budget: int | None = None) -> int:
    """Workers for `rows` label rows: one per core on a multi-core machine for large tables, else none.

    With `bytes_each` (what one worker keeps: a passive party's label powers) and `budget`, no more workers
    start than the budget holds, and fewer than two means none: the work stays in this process, which
    holds one copy.
    """
    cores = os.cpu_count() or 1
    if cores < 2 or rows < MIN_ROWS:
        return 0
    if bytes_each > 0 and budget is not None:
        fit = min(cores, budget // bytes_each)
        if fit < cores:
            log.info("%d of %d worker processes: each keeps %.0f MiB of label ciphertexts, and %.0f MiB are "
                     "planned for them", fit if fit > 1 else 0, cores, bytes_each / MIB, budget / MIB)
        cores = fit
    return cores if cores > 1 else 0


def encrypt_over_workers(key: AdditivePrivateKey, plaintexts: Sequence[int],
                         workers: int | None = None) -> list:
    """`key.encrypt(plaintexts)`, split over `workers` processes (default: one per core for large batches).

    Each worker builds its own fixed-base tables from the key; plaintexts are checked here first.
    """
    count = default_worker_count(len(plaintexts)) if workers is None else workers
    if count <= 1:
        return key.encrypt(plaintexts)  # checks them itself
    checked = key.checked_plaintexts(plaintexts)
    pool = GmpWorkers(count)
    try:
        pool.all("load_key", key.worker_fields())
        bounds = np.linspace(0, len(checked), count + 1).astype(int)
        parts = pool.each("encrypt", [(checked[a:b],) for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
    finally:
        pool.close()
    return [c for part in parts for c in part]


class GmpWorkers:
    """`count` worker processes; requests go to all of them or one chunk each, answers come back in order."""

    def __init__(self, count: int) -> None:
        """Start `count` worker processes, stopped when this pool is garbage-collected."""
        if count < 1:
            raise ValueError(f"a worker pool needs at least one worker, got {count}")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.processes = [subprocess.Popen([sys.executable, "-m", "fedcore.privacy.gmp_worker"],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
                          for _ in range(count)]
        self._finalizer = weakref.finalize(self, _stop, self.processes)

    @property
    def count(self) -> int:
        """How many workers there are."""
        return len(self.processes)

    def each(self, operation: str, arguments: Sequence[tuple]) -> list[Any]:
        """Worker i runs `operation(*arguments[i])` (at most one request per worker); the answers in order."""
        if len(arguments) > self.count:
            raise ValueError(f"{len(arguments)} requests for {self.count} workers")
        busy = self.processes[:len(arguments)]
        for process, args in zip(busy, arguments, strict=True):  # all write first: the workers run at once
            self._send(process, (operation, tuple(args)))
        return [self._receive(process, operation) for process in busy]

    def all(self, operation: str, *arguments: Any) -> list[Any]:
        """Every worker runs `operation(*arguments)` (loading shared state)."""
        return self.each(operation, [arguments] * self.count)

    def close(self) -> None:
        """Stop the workers (they exit when their stdin closes)."""
        self._finalizer()

    def _send(self, process: subprocess.Popen, request: tuple) -> None:
        assert process.stdin is not None, "the workers start with stdin and stdout pipes"
        try:
            write_frame(process.stdin, request)
        except (BrokenPipeError, OSError) as error:
            raise ProtocolError(f"an encryption worker process (pid {process.pid}) is "
                                f"gone: {error}") from error

    def _receive(self, process: subprocess.Popen, operation: str) -> Any:
        assert process.stdout is not None, "the workers start with stdin and stdout pipes"
        answer = read_frame(process.stdout)
        if answer is None:
            raise ProtocolError(f"an encryption worker process (pid {process.pid}) exited during "
                                f"{operation!r} (code {process.poll()})")
        status, value = answer
        if status != "ok":
            raise ProtocolError(f"an encryption worker failed during {operation!r}: {value}")
        return value


def _stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        for stream in (process.stdin, process.stdout):
            assert stream is not None, "the workers start with stdin and stdout pipes"
            try:
                stream.close()
            except OSError:
                pass
    for process in processes:
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def balanced_chunks(costs: Sequence[int], count: int) -> list[np.ndarray]:
    """Indices of `costs` split into `count` groups of near-equal total cost.

    Largest first, each to the least loaded group; each group in ascending order.
    """
    loads = [0] * count
    groups: list[list[int]] = [[] for _ in range(count)]
    for index in np.argsort(-np.asarray(costs, dtype=np.int64), kind="stable").tolist():
        lightest = loads.index(min(loads))
        groups[lightest].append(index)
        loads[lightest] += int(costs[index])
    return [np.array(sorted(group), dtype=np.int64) for group in groups]
