"""In-process transport: parties are objects in this process; messages still cross as Arrow bytes.

Serialising every message keeps simulation honest: byte counts are real and nothing but Arrow crosses.
With `concurrent=True` the parties of one round answer side by side, each in a thread of its own, as
deployed parties answer on their own machines (`fedcore.transport.flight` sends a round's requests
concurrently too): while one party's Python decodes or scores, another's compiled kernels run with the GIL
released (the tree kernels are `nogil`). Each party computes only on its own state, so its answer is the
same bytes in any interleaving; replies, accounting and transcripts keep the request order. Off by
default: on 2 cores it saved wall time only on a heavily loaded machine (docs/benchmarks.md, session 49).
Only where numba's threading layer is thread-safe (TBB or OpenMP): its fallback `workqueue` layer aborts
the process when two threads launch parallel kernels at once, so there the parties answer in turn.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numba as nb
import numpy as np
import pyarrow as pa

from fedcore.errors import ProtocolError
from fedcore.protocol.messages import Message
from fedcore.transport.base import Transport

Handler = Callable[[Message], Message]
THREADSAFE_LAYERS = ("tbb", "omp")


@nb.njit(cache=True, parallel=True)
def _parallel_probe(values: np.ndarray) -> float:
    """A parallel kernel's launch, so that numba chooses its threading layer (`kernels_threadsafe`)."""
    total = 0.0
    for i in nb.prange(values.shape[0]):
        total += values[i]
    return total


@functools.cache
def kernels_threadsafe() -> bool:
    """Whether several threads may launch numba's parallel kernels at once (its layer is TBB or OpenMP).

    numba picks its layer at the first parallel launch (TBB, then OpenMP, then `workqueue`, unless
    `NUMBA_THREADING_LAYER` says); the probe makes that happen, so the answer is the layer in use.
    """
    _parallel_probe(np.zeros(1))
    return nb.threading_layer() in THREADSAFE_LAYERS


class InProcessTransport(Transport):
    """Delivers messages by calling each party's `handle(message) -> message` (`concurrent`: side by side)."""

    def __init__(self, handlers: dict[str, Handler], record_transcript: bool = False,
                 record_payloads: bool = False, concurrent: bool = False) -> None:
        """Deliver each party's messages to its handler in this process.

        `concurrent`: a round's parties answer in threads of their own (False, or where numba's threading
        layer is not thread-safe: one after another, in request order).
        """
        super().__init__(record_transcript=record_transcript, record_payloads=record_payloads)
        self._handlers = dict(handlers)
        self.concurrent = concurrent
        self._pool: ThreadPoolExecutor | None = None  # started at the first round of several parties

    def __getstate__(self) -> dict:
        """The transport to pickle (a fitted estimator's): without its threads, which start again."""
        state = self.__dict__.copy()
        state["_pool"] = None
        return state

    @property
    def parties(self) -> list[str]:
        """The parties' names, in handler order."""
        return list(self._handlers)

    def close(self) -> None:
        """End the round threads (`concurrent`), waiting for them; a later concurrent round starts new ones.

        The estimators close their transport when a fit or a prediction ends, so that no idle thread outlives
        it.
        """
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _answer(self, party: str, payload: pa.Buffer) -> pa.Buffer:
        """One party's encoded reply to one encoded request."""
        return self._handlers[party](Message.from_bytes(payload)).to_buffer()

    def _deliver(self, requests: dict[str, pa.Buffer]) -> dict[str, pa.Buffer]:
        unknown = [party for party in requests if party not in self._handlers]
        if unknown:  # before any party answers: a round is delivered whole or not at all
            raise ProtocolError(f"no party named {unknown[0]!r} on this transport")
        if not self.concurrent or len(requests) < 2 or not kernels_threadsafe():
            return {party: self._answer(party, payload) for party, payload in requests.items()}
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=len(self._handlers) - 1,
                                            thread_name_prefix="fedforest-inprocess")
        (first, first_payload), *rest = requests.items()
        futures: dict[str, Future[pa.Buffer]] = {
            party: self._pool.submit(self._answer, party, payload) for party, payload in rest}
        replies: dict[str, pa.Buffer] = {}
        errors: list[BaseException] = []
        try:  # the first party answers in this thread, the others in the pool's
            replies[first] = self._answer(first, first_payload)
        except Exception as exc:  # noqa: BLE001 - raised below, after every party has answered
            errors.append(exc)
        for party, future in futures.items():
            try:
                replies[party] = future.result()
            except Exception as exc:  # noqa: BLE001 - the first in request order is raised
                errors.append(exc)
        if errors:  # as one after another would: the first failing party's error, in request order
            raise errors[0]
        return replies
