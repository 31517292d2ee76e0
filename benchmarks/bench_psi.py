"""ECDH-PSI (X25519) throughput: M institutions of `size` string IDs each, a shared `overlap` fraction.

Every party holds the same ``overlap * size`` IDs plus ``(1 - overlap) * size`` of its own (strings
``cust-<i>``, rows shuffled), so the intersection of all M parties has ``overlap * size`` IDs. Reports setup
(normalise + hash to curve) and protocol (blind, round-robin re-blind, master intersection) time, bytes per
party, and checks the result against a plain set intersection. "core efficiency" is the single-core X25519
cost times the M * sum(n) multiplications over (protocol seconds x workers); "machine busy" the share of all
cores busy during the run (any process): together they show whether other load competed. Reference: FATE
reports 10M x 10M ECDH PSI in about 7.5 minutes on 16 cores.

    .venv/bin/python -m benchmarks.bench_psi --size 1000000 --overlap 0.5 [--parties 2] [--workers N]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
import timeit

import numpy as np
import pandas as pd
from cryptography.hazmat.backends.openssl import backend
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from benchmarks.markdown import markdown_table
from fedcore.privacy.psi import PSIParty, run_psi

MB = 1e6


def party_ids(size: int, overlap: float, index: int, seed: int = 0) -> pd.Series:
    """Party `index`'s IDs as strings in shuffled row order.

    A block shared by all parties, then its own block.
    """
    common = n_common(size, overlap)
    own = np.arange(size - common) + common + index * (size - common)
    ids = np.concatenate([np.arange(common), own])
    order = np.random.default_rng(seed + index).permutation(ids)
    return pd.Series([f"cust-{i:010d}" for i in order.tolist()], name="customer_id")


def n_common(size: int, overlap: float) -> int:
    """IDs every party holds."""
    return int(round(size * overlap))


def x25519_us_per_op(n: int = 5000) -> float:
    """Single-core cost of one blinding (from_public_bytes + exchange) in microseconds."""
    key = X25519PrivateKey.generate()
    points = [os.urandom(32) for _ in range(n)]
    run = lambda: [key.exchange(X25519PublicKey.from_public_bytes(u)) for u in points]  # noqa: E731
    return min(timeit.repeat(run, number=1, repeat=3)) / n * 1e6


def cpu_busy_seconds() -> float:
    """All processes' busy CPU time on this machine so far (from /proc/stat), to expose competing load."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return float("nan")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def machine() -> str:
    """CPU model, cores, Python, cryptography/OpenSSL and the load average, for the report."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import cryptography
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}, cryptography "
            f"{cryptography.__version__} ({backend.openssl_version_text()}), load average {load}")


def run(size: int, overlap: float, n_parties: int, workers: int | None, us_per_op: float) -> dict:
    """One PSI run; the table row."""
    ids = [party_ids(size, overlap, j) for j in range(n_parties)]
    busy0, start = cpu_busy_seconds(), time.perf_counter()
    parties = [PSIParty(f"inst{j}", ids[j]) for j in range(n_parties)]
    setup = time.perf_counter() - start
    rows, stats = run_psi(parties, workers=workers)
    total = time.perf_counter() - start
    n_cores = len(os.sched_getaffinity(0))
    busy = (cpu_busy_seconds() - busy0) / (total * n_cores)
    aligned = [ids[j].to_numpy()[rows[p.name]] for j, p in enumerate(parties)]
    n_workers = workers or len(os.sched_getaffinity(0))
    ideal = n_parties * n_parties * size * us_per_op / 1e6 / n_workers  # M multiplications per ID
    steps = stats["seconds_by_step"]
    correct = (stats["n_common"] == n_common(size, overlap)
               and all((a == aligned[0]).all() for a in aligned[1:]))
    return {"size": size, "overlap": overlap, "parties": n_parties, "workers": n_workers,
            "setup s": setup, "blind s": steps["blind"], "reblind s": steps["reblind"],
            "intersect s": steps["intersect"], "protocol s": stats["seconds"], "seconds": total,
            "core efficiency": ideal / stats["seconds"], "machine busy": busy,
            "MB sent per party": max(stats["bytes_sent"].values()) / MB,
            "MB received per party": max(stats["bytes_received"].values()) / MB,
            "IDs/s": int(n_parties * size / total), "matched": stats["n_common"], "correct": correct}


def main() -> None:
    """Time PSI at the given size, overlap and party count, and print the result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000, help="IDs per institution")
    parser.add_argument("--overlap", type=float, default=0.5, help="shared fraction of each party's IDs")
    parser.add_argument("--parties", type=int, default=2)
    parser.add_argument("--workers", type=int, default=None, help="worker processes (default: all cores)")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    us_per_op = x25519_us_per_op()
    print(f"X25519 blinding, one core: {us_per_op:.1f} us/op\n")
    row = run(args.size, args.overlap, args.parties, args.workers, us_per_op)
    print(markdown_table([row], digits=2))
    print(f"\nload average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
