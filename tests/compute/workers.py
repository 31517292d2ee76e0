"""Losing a worker mid-forest, shared by the horizontal and vertical worker-loss tests."""

from __future__ import annotations


def close_busiest_worker(cluster, client) -> str:
    """Close the worker holding the most futures (it must hold some); returns its name."""
    held = client.has_what()
    name, worker = max(cluster.workers.items(), key=lambda item: len(held[item[1].address]))
    assert held[worker.address], "the worker to lose holds blocks"
    cluster.sync(worker.close)
    return name


def lose_a_worker_on_call(monkeypatch, owner: type, method: str, call: int, cluster, client) -> list[str]:
    """Patch `owner.method` so that, once its `call`-th call has returned, the busiest worker is closed.

    Returns the list the closed worker's name is put in (empty until then).
    """
    original = getattr(owner, method)
    calls, lost = [0], []

    def patched(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        calls[0] += 1
        if calls[0] == call and not lost:
            lost.append(close_busiest_worker(cluster, client))
        return out

    monkeypatch.setattr(owner, method, patched)
    return lost
