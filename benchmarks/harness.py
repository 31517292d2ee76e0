"""What the benchmark scripts share: interleaved A/B runs, and the machine line every result states.

On a shared machine a ratio is only meaningful between runs made side by side, so a pair's two runs
alternate (a b a b ...) and each result carries the load average it was measured under.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from collections.abc import Callable, Sequence
from typing import TypeVar

A = TypeVar("A")
B = TypeVar("B")


def interleaved(a: Callable[[], A], b: Callable[[], B], repeats: int,
                before: Callable[[], None] = lambda: None) -> list[tuple[A, B]]:
    """`repeats` pairs of runs of `a` and `b` in turn (a b a b ...), `before` each run: the pairs."""
    pairs = []
    for _ in range(repeats):
        before()
        first = a()
        before()
        pairs.append((first, b()))
    return pairs


def child_json(command: Sequence[str], *, quiet: bool = False) -> dict:
    """Run `command` in a child process; the JSON object it printed on its last line of standard output.

    A child has its own peak memory and a fresh interpreter. `quiet` hides its standard error and Python
    warnings (Dask's shuffle warnings); a failed child raises CalledProcessError (with its standard error
    when quiet).
    """
    env = {**os.environ, "PYTHONWARNINGS": "ignore"} if quiet else None
    done = subprocess.run(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE if quiet else None,
                          text=True, check=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def machine_line() -> str:
    """The cores and load average, as printed under a benchmark's table."""
    return f"Machine: {os.cpu_count()} cores; load average {tuple(round(x, 2) for x in os.getloadavg())}"


def add_forest_arguments(parser: argparse.ArgumentParser, *, rows: int | list[int], features: int, trees: int,
                         depth: int, workers: int, block_rows: int) -> None:
    """The Dask benchmarks' data and forest options, at the script's defaults (`rows` a list: several)."""
    many = isinstance(rows, list)
    parser.add_argument("--rows", type=int, nargs="+" if many else None, default=rows)
    parser.add_argument("--features", type=int, default=features)
    parser.add_argument("--trees", type=int, default=trees)
    parser.add_argument("--depth", type=int, default=depth)
    parser.add_argument("--workers", type=int, default=workers)
    parser.add_argument("--block-rows", type=int, default=block_rows)
