"""An institution's agent whose own config puts its party on Dask trains the in-process model (issue #29)."""

from __future__ import annotations

import pytest

from fedcore.compute.cluster import DaskCompute, hold_shared
from fedcore.data.datasets import make_waveform
from fedcore.privacy.settings import parse_privacy
from tests.horizontal.test_session import _agents, _session


def patients(n_rows: int):
    """A waveform table of `n_rows` patients: string classes and a patient_id column."""
    table = make_waveform(n_rows, random_state=3)
    table["class"] = table["class"].map({0: "a", 1: "b", 2: "c"})
    table.insert(0, "patient_id", [f"P{i:05d}" for i in range(len(table))])
    return table


@pytest.mark.parametrize("algorithm, privacy", [("extra-trees", None), ("ppd-ert", None),
                                                ("extra-trees", "ldp")])
def test_an_agent_with_compute_dask_trains_the_same_model(tmp_path, algorithm, privacy) -> None:
    table = patients(600)
    models = []
    for on_dask in (False, True):
        agents = _agents(table, tmp_path / str(on_dask))
        if privacy is not None:
            for agent in agents.values():
                agent.data.privacy = parse_privacy(privacy, algorithm)
        if on_dask:  # the north institution's own config: its party on a local cluster of two workers
            north = agents["north"]
            north.data.compute = DaskCompute(workers=2, processes=False, block_rows=50)
            release = hold_shared(north.data.compute)  # as the agent's server holds it while it serves
        session = _session(agents, algorithm, privacy=privacy)
        session.agree_schema()
        if privacy == "ldp":  # each party's noise seed (drawn per session), the same in both runs
            for index, agent in enumerate(agents.values()):
                agent.party.noise_seed = 100 + index
        session.train()
        models.append(session.model)
        if on_dask:
            assert type(north.party.rows).__name__ == "DaskPartyRows" and len(north.party.rows.blocks) > 2
            release()
        session.close()
    assert models[1].same_as(models[0])


def test_an_agent_whose_scheduler_cannot_be_reached_says_so_at_setup(tmp_path) -> None:
    import socket

    from fedcore.errors import ConfigError

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    table = patients(200)
    agents = _agents(table, tmp_path)
    agents["north"].data.compute = DaskCompute(address=address, connect_timeout_s=0.5)
    with pytest.raises(ConfigError) as error:
        _session(agents).agree_schema()
    assert str(error.value) == (f"cannot reach the Dask scheduler at {address} within 0.5 s: check "
                                "compute.dask.address (or --dask) and that the scheduler runs")
