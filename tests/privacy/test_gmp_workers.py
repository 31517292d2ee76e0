"""Worker processes for Paillier arithmetic.

The same results as in this process, in order, and clear errors when a worker fails or is gone.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.errors import ProtocolError
from fedcore.privacy.gmp_workers import GmpWorkers, balanced_chunks, encrypt_over_workers
from fedcore.privacy.packing import SlotLayout, encrypted_bin_sums, weight_powers
from fedcore.privacy.paillier import generate_keypair


@pytest.fixture(scope="module")
def key():
    return generate_keypair(1024, insecure_for_tests=True)


def test_bin_sums_in_workers_equal_those_computed_here(key) -> None:
    rng = np.random.default_rng(5)
    n = 200
    layout = SlotLayout.for_values(np.ones((n, 1), dtype=object), 4 * n, key.public)
    ciphertexts = key.encrypt(layout.encode(rng.integers(0, 2, (n, 1))))
    jobs = [(rng.permutation(n)[:size], rng.integers(1, 6, size), rng.integers(0, 30, size).astype(np.uint8))
            for size in (150, 3, 80, 40, 120)]
    here = [encrypted_bin_sums(key.public, weight_powers(key.public, ciphertexts), *job) for job in jobs]
    pool = GmpWorkers(2)
    try:
        pool.all("load_labels", key.public.to_json(), ciphertexts)
        chunks = balanced_chunks([len(job[0]) for job in jobs], 2)
        answers = pool.each("bin_sums", [([jobs[i] for i in chunk],) for chunk in chunks])
    finally:
        pool.close()
    there = {i: result for chunk, answer in zip(chunks, answers, strict=True)
             for i, result in zip(chunk.tolist(), answer, strict=True)}
    for i, (codes, sums, totals) in enumerate(here):
        np.testing.assert_array_equal(there[i][0], codes)
        assert there[i][1] == sums and there[i][2] == totals


def test_encryption_in_workers_decrypts_and_checks_plaintexts(key) -> None:
    values = list(range(300))
    assert key.decrypt(encrypt_over_workers(key, values, workers=2)) == values
    with pytest.raises(Exception, match=r"plaintext must lie in \[0, n\)"):
        encrypt_over_workers(key, [*values, -1], workers=2)


def test_balanced_chunks_split_cost_evenly_and_keep_every_index() -> None:
    chunks = balanced_chunks([10, 1, 9, 2, 8, 3], 2)
    assert sorted(np.concatenate(chunks).tolist()) == list(range(6))
    costs = [sum([10, 1, 9, 2, 8, 3][i] for i in chunk) for chunk in chunks]
    assert abs(costs[0] - costs[1]) <= 1 and all(np.all(np.diff(c) > 0) for c in chunks)


def test_a_failing_or_dead_worker_is_a_clear_error(key) -> None:
    pool = GmpWorkers(2)
    try:
        with pytest.raises(ProtocolError,
                           match=r"an encryption worker failed during 'bin_sums': KeyError: 'public'"):
            pool.all("bin_sums", [])  # no labels loaded
        pool.processes[1].kill()
        pool.processes[1].wait()
        with pytest.raises(ProtocolError,
                           match=r"an encryption worker process \(pid \d+\) (is gone|exited during "
                                 r"'load_labels')"):
            pool.all("load_labels", int(key.public.n), [])
    finally:
        pool.close()
    assert all(process.poll() is not None for process in pool.processes)


def test_workers_stop_when_the_pool_is_collected() -> None:
    import gc

    pool = GmpWorkers(1)
    process = pool.processes[0]
    del pool
    gc.collect()
    assert process.wait(timeout=10) is not None


def test_no_more_workers_start_than_the_memory_budget_holds(key, monkeypatch, caplog) -> None:
    import logging
    import sys

    from fedcore.privacy import gmp_workers
    from fedcore.privacy.packing import weight_powers_bytes

    monkeypatch.setattr(gmp_workers.os, "cpu_count", lambda: 4)
    powers = weight_powers(key.public, key.encrypt(list(range(10))))
    held = sum(sys.getsizeof(c) + 8 for row in powers for c in row)
    assert held <= weight_powers_bytes(key.public.ciphertext_bytes, 10) <= 1.6 * held  # an upper bound
    each = weight_powers_bytes(key.public.ciphertext_bytes, 100_000)
    assert gmp_workers.default_worker_count(100_000, each, 10 * each) == 4  # room for all: one per core
    assert gmp_workers.default_worker_count(100_000) == 4  # no budget given: one per core
    assert gmp_workers.default_worker_count(100, each, 10 * each) == 0  # too few rows for workers to pay
    with caplog.at_level(logging.INFO, logger="fedcore.privacy.gmp_workers"):
        assert gmp_workers.default_worker_count(100_000, each, 3 * each) == 3
    assert "3 of 4 worker processes: each keeps" in caplog.text
    assert gmp_workers.default_worker_count(100_000, each, each) == 0  # one copy: it stays in this process
