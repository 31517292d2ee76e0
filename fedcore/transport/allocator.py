"""An agent process's C allocator: two glibc malloc arenas, so memory freed by one thread serves the next.

An agent runs many threads (gRPC's, its Dask client's and in-process scheduler's, the party's own). glibc
gives each new thread its own malloc arena, up to 8 per core, and memory freed into one arena is not reused
by a thread allocating from another, so an agent's resident memory grew with the rows it had handled, in
buffers it had already let go. Measured on a vertical session at 8,750,000 rows a party (issue #29, see
docs/benchmarks.md): agents peaked at 1,044 to 1,273 MiB with glibc's default, and with two arenas at 739 to
882 MiB in one run and 958 to 1,001 MiB in another, under more load. `MALLOC_ARENA_MAX` in the environment,
when set, is left to decide.

The cap binds threads that allocate for the first time after it: an agent sets it before its cluster and
server start (the agent flow first thing, `AgentServer` again for agents served otherwise).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

log = logging.getLogger(__name__)
M_ARENA_MAX = -8
"""glibc's `mallopt` parameter for the most arenas (malloc.h)."""
AGENT_ARENAS = 2


def limit_malloc_arenas(arenas: int = AGENT_ARENAS) -> bool:
    """Cap this process's glibc malloc arenas at `arenas` from now on; False where it cannot or should not.

    Not on other C libraries or systems, and not when `MALLOC_ARENA_MAX` is set (its value already applies).
    Arenas that threads already have stay; new threads share the capped set.
    """
    if os.environ.get("MALLOC_ARENA_MAX") or not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    if mallopt is None or mallopt(M_ARENA_MAX, arenas) != 1:
        return False
    log.debug("malloc arenas capped at %d for this agent process", arenas)
    return True
