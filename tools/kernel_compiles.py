"""A pytest plugin recording each numba compilation (kernel, signature, seconds) and the test causing it.

A kernel compiled during the suite is one the warm-up (`python -m fedcore.warmup`) did not reach, or a new
signature of one (another dtype or array layout). Run the suite with it, then read the report:

    PYTHONPATH=tools .venv/bin/python -m pytest -p kernel_compiles -m "not slow" -n 2 --dist loadfile
    python tools/kernel_compiles.py            # the kernels compiled, slowest first, with their tests

Each pytest process writes `$KERNEL_COMPILES_DIR/<pid>.json` (default `kernel_compiles/` in the working
directory). Compiles in processes the tests start (agents, Dask workers) are not seen. Only numba's own
compile events count: a kernel loaded from the cache raises none.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import fedcore  # noqa: F401  # first: it sets NUMBA_CACHE_DIR, which numba reads once

OUT = Path(os.environ.get("KERNEL_COMPILES_DIR", "kernel_compiles"))
_current = ["<collection>"]
_records: list[dict[str, Any]] = []


def _listener() -> Any:
    """A numba event listener that appends one record per finished compilation."""
    from numba.core.event import Listener

    class Compiles(Listener):
        def __init__(self) -> None:
            self.started: dict[int, float] = {}

        def on_start(self, event: Any) -> None:
            self.started[id(event.data["dispatcher"])] = time.perf_counter()

        def on_end(self, event: Any) -> None:
            dispatcher = event.data["dispatcher"]
            started = self.started.pop(id(dispatcher), time.perf_counter())
            function = getattr(dispatcher, "py_func", None)
            name = f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', dispatcher)}"
            _records.append({"test": _current[0], "seconds": time.perf_counter() - started, "kernel": name,
                             "signature": str(event.data.get("args"))})

    return Compiles()


def pytest_configure(config: Any) -> None:
    """Listen to numba's compile events for the whole run."""
    from numba.core import event

    event.register("numba:compile", _listener())


def pytest_runtest_setup(item: Any) -> None:
    """Charge what compiles from here on to this test."""
    _current[0] = item.nodeid


def pytest_unconfigure(config: Any) -> None:
    """Write this process's records."""
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{os.getpid()}.json").write_text(json.dumps(_records))


def report(folder: Path = OUT) -> None:
    """Every recorded compilation of a fedcore kernel, slowest first: seconds, kernel, test, signature."""
    records = [r for path in sorted(folder.glob("*.json")) for r in json.loads(path.read_text())]
    kernels: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for record in records:
        if record["kernel"].startswith("fedcore."):
            kernels[record["kernel"], record["signature"]].append(record)
    by_time = sorted(kernels.items(), key=lambda kv: -sum(r["seconds"] for r in kv[1]))
    for (kernel, signature), seen in by_time:
        print(f"{sum(r['seconds'] for r in seen):6.1f} s  {kernel}  {seen[0]['test']}  {signature[:160]}")


if __name__ == "__main__":
    report(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
