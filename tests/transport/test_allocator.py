"""An agent process caps its glibc malloc arenas, so threads share freed memory (issue #29)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")

_ARENAS_AFTER_THREADS = textwrap.dedent("""
    import ctypes, ctypes.util, re, sys, tempfile, threading
    from fedcore.transport.allocator import limit_malloc_arenas

    capped = limit_malloc_arenas(2) if sys.argv[1] == "capped" else None
    start = threading.Barrier(8)
    kept = []

    def allocate():
        start.wait()  # all eight threads alive at once, each making its first allocations
        kept.append([bytearray(1000) for _ in range(200)])

    threads = [threading.Thread(target=allocate) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.fopen.restype = ctypes.c_void_p
    with tempfile.NamedTemporaryFile(suffix=".xml") as report:
        stream = libc.fopen(report.name.encode(), b"w")
        libc.malloc_info(0, ctypes.c_void_p(stream))
        libc.fclose(ctypes.c_void_p(stream))
        arenas = len(re.findall(r"<heap nr=", open(report.name).read()))
    print(capped, arenas)
""")


def _arenas(mode: str, arena_max: str | None = None) -> tuple[str, int]:
    """(whether the cap was set, the arenas after eight threads allocated) in a fresh interpreter."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    if arena_max is not None:
        env["MALLOC_ARENA_MAX"] = arena_max
    done = subprocess.run([sys.executable, "-c", _ARENAS_AFTER_THREADS, mode], capture_output=True, text=True,
                          check=True, env=env, timeout=60)
    capped, arenas = done.stdout.split()
    return capped, int(arenas)


def test_threads_share_two_arenas_once_capped() -> None:
    capped, arenas = _arenas("default")
    assert capped == "None" and arenas > 2  # glibc: one arena a new thread, up to 8 a core
    assert _arenas("capped") == ("True", 2)


def test_an_explicit_malloc_arena_max_is_left_to_decide() -> None:
    assert _arenas("capped", arena_max="4") == ("False", 4)
