"""An agent whose Dask scheduler goes away mid-forest says so, and trains again once it is back (issue #29).

A lost cluster is no bug of the party's code: the session fails with ComputeUnavailable (a PartyUnavailable,
which the retraining flow resumes from) naming the scheduler, and the agent's next session connects again.
"""

from __future__ import annotations

import logging
import socket

import pytest

from fedcore.compute.cluster import DaskCompute, hold_shared
from fedcore.compute.dask_rows import DaskPartyRows
from fedcore.errors import ComputeUnavailable
from tests.compute.test_agent_on_dask import patients
from tests.horizontal.test_session import _agents, _session

distributed = pytest.importorskip("distributed")


def _scheduler(port: int):
    """A cluster of two in-process workers whose scheduler listens on `port` (so that it can come back)."""
    return distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                    dashboard_address=":0", scheduler_port=port)


@pytest.mark.timeout(180)
def test_a_scheduler_lost_mid_forest_is_compute_unavailable_and_the_next_session_trains(
        tmp_path, monkeypatch, caplog) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    table = patients(600)
    expected = _session(_agents(table, tmp_path / "in-process"))
    expected.agree_schema()
    expected.train()

    agents = _agents(table, tmp_path / "dask")
    north = agents["north"]
    north.data.compute = DaskCompute(address=address, connect_timeout_s=2, block_rows=50)
    release = hold_shared(north.data.compute)  # as the agent's server holds it while it serves
    cluster = _scheduler(port)
    original, calls = DaskPartyRows.start_level, [0]

    def start_level_then_lose_the_scheduler(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        calls[0] += 1
        if calls[0] == 3:
            cluster.close()
        return out

    monkeypatch.setattr(DaskPartyRows, "start_level", start_level_then_lose_the_scheduler)
    session = _session(agents)
    session.agree_schema()
    with caplog.at_level(logging.ERROR), pytest.raises(ComputeUnavailable) as error:
        session.train()
    session.close()
    assert str(error.value).startswith("party 'north' lost its compute cluster while answering ")
    assert str(error.value).endswith(f": the cluster cancelled its tasks, on the Dask scheduler at "
                                     f"{address} (its client disconnected); resume once it answers "
                                     "again"), str(error.value)
    assert "a bug in its own code" not in caplog.text

    monkeypatch.undo()
    cluster = _scheduler(port)  # the cluster is back: the agent's next session connects again and trains
    try:
        again = _session(agents)
        again.agree_schema()
        again.train()
        assert again.model.same_as(expected.model)
        again.close()
    finally:
        release()
        cluster.close()
    expected.close()
