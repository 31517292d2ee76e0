"""Blocks' results summed on the workers that hold them, then by the caller (`blocks.per_worker_sums`)."""

from __future__ import annotations

import numpy as np

from fedcore.compute.blocks import per_worker_sums, worker_homes


def _total(offset: int, *arrays: np.ndarray) -> np.ndarray:
    """Integer arrays added up, plus `offset` once per call (so the test counts the calls' grouping)."""
    return sum(arrays[1:], arrays[0].copy()) + offset


def test_one_sum_per_worker_on_that_worker(three_workers) -> None:
    client = three_workers
    workers = sorted(client.scheduler_info()["workers"])
    placed = [workers[i % 3] for i in range(7)]
    blocks = [client.submit(np.full, 4, i, dtype=np.int64, workers=[w], pure=False)
              for i, w in enumerate(placed)]
    client.gather(blocks)  # placed
    homes = worker_homes(client, blocks)
    assert homes == placed
    sums = per_worker_sums(client, blocks, homes, _total, 0)
    assert len(sums) == 3
    client.gather(sums)
    held = client.who_has(sums)
    assert sorted(held[s.key][0] for s in sums) == workers  # each worker summed its own blocks
    np.testing.assert_array_equal(_total(0, *client.gather(sums)), np.full(4, sum(range(7))))
    # the leading arguments reach every sum: three per-worker calls with offset 10
    np.testing.assert_array_equal(sum(client.gather(per_worker_sums(client, blocks, homes, _total, 10))),
                                  np.full(4, sum(range(7)) + 30))


def test_unknown_homes_make_one_sum(three_workers) -> None:
    client = three_workers
    blocks = [client.submit(np.full, 2, i, dtype=np.int64, pure=False) for i in range(5)]
    for homes in ([], [""] * 5):  # lengths that differ from the blocks' count: all unknown
        sums = per_worker_sums(client, blocks, homes, _total, 0)
        assert len(sums) == 1
        np.testing.assert_array_equal(client.gather(sums)[0], np.full(2, 10))
