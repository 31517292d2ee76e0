"""Per-level wall times of a party on Dask, logged once per tree batch: progress at the agent (issue #29).

A level's time runs from its start to the next level's start (or the batch's end): what the federation waited
for while this party's blocks worked, the master's and the other parties' share included.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from distributed import Client

log = logging.getLogger(__name__)


class LevelClock:
    """Marks each level's start; at a batch's end logs its levels' count, total and p50/p95 seconds."""

    def __init__(self, who: str) -> None:
        """For party `who`."""
        self.who = who
        self._starts: list[float] = []
        self.n_batches = 0

    def level(self) -> None:
        """A level starts (the one before it, if any, ends)."""
        self._starts.append(time.perf_counter())

    def end_batch(self, client: Client, n_blocks: int) -> None:
        """The batch ended (a new one starts, or training ended): log its levels, if it had any.

        `n_blocks`: how many blocks the party's rows are on the cluster.
        """
        if not self._starts:
            return
        seconds = np.diff([*self._starts, time.perf_counter()])
        self._starts = []
        self.n_batches += 1
        p50, p95 = np.percentile(seconds, [50, 95])
        log.info("party %r on Dask (%d worker(s), %d blocks): tree batch %d of %d levels in %.2f s; a level "
                 "p50 %.3f s, p95 %.3f s", self.who, n_workers(client), n_blocks, self.n_batches,
                 len(seconds), float(seconds.sum()), p50, p95)


def n_workers(client: Client) -> int:
    """How many workers the cluster of `client` has now (for log lines)."""
    return len(client.scheduler_info().get("workers", {}))
