"""Losing a worker mid-forest, shared by the horizontal and vertical worker-loss tests."""

from __future__ import annotations


def close_busiest_worker(cluster, client) -> str:
    """Close the worker holding the most futures (it must hold some); returns its name."""
    held = client.has_what()
    name, worker = max(cluster.workers.items(), key=lambda item: len(held[item[1].address]))
    assert held[worker.address], "the worker to lose holds blocks"
    cluster.sync(worker.close)
    return name
