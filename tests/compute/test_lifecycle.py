"""Every cluster has one lifecycle (`fedcore.compute.cluster`): a fit or load that ends or fails leaves none.

An estimator's `compute=` cluster and the one an agent's data load starts are the process's shared cluster,
held while in use; checked on the real worker processes and on `distributed`'s own registries (issue #29).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from fedcore.agents.data import institution_from_config
from fedcore.compute.cluster import DaskCompute, hold_shared, shared_cluster
from fedcore.config import parse_config
from fedcore.errors import ColumnNotFoundError, DataReadError
from fedcore.horizontal import FederatedExtraTreesClassifier
from fedcore.simulated_fit import SimulatedFederation
from fedcore.vertical.estimators import FederatedForestClassifier
from tests.compute.test_agent_parquet import _north_and_new, _table, _write
from tests.compute.workers import losable_cluster, open_clusters, worker_processes
from tests.horizontal.common import horizontal_table, split_rows

LOCAL = {"dask": {"local": {"workers": 1, "processes": False}, "block_rows": 50}}


def _horizontal() -> tuple[FederatedExtraTreesClassifier, list[pd.DataFrame]]:
    return (FederatedExtraTreesClassifier(n_estimators=2, max_depth=3, random_state=3),
            split_rows(horizontal_table(seed=5), 2, seed=2))


def _vertical() -> tuple[FederatedForestClassifier, list[pd.DataFrame]]:
    from fedcore.data.split import split_vertical
    from tests.conftest import mixed_table

    return (FederatedForestClassifier(n_estimators=2, max_depth=3, random_state=3),
            split_vertical(mixed_table(seed=1), 2, label="target", seed=7, label_party=0))


def _while_fitting(monkeypatch, probe, fails: bool = False) -> list:
    """What `probe()` gives while a fit runs its master (its rows on the cluster); `fails`: it then raises."""
    seen: list = []
    fit = SimulatedFederation._fit_master

    def fit_master(self, master, budget):
        seen.append(probe())
        if fails:
            raise RuntimeError("the fit fails")
        return fit(self, master, budget)

    monkeypatch.setattr(SimulatedFederation, "_fit_master", fit_master)
    return seen


@pytest.mark.timeout(120)
@pytest.mark.parametrize("setting, fails", [pytest.param("horizontal", False, marks=pytest.mark.slow),
                                            ("vertical", True)])
def test_a_fit_on_a_local_cluster_leaves_no_worker_behind(setting, fails, monkeypatch) -> None:
    """`compute="local:1"` starts a worker process for the fit; it is gone when the fit ends or raises."""
    model, parties = _horizontal() if setting == "horizontal" else _vertical()
    children = worker_processes()
    assert not open_clusters()
    seen = _while_fitting(monkeypatch, lambda: worker_processes() - children, fails)
    model.set_params(compute="local:1", block_rows=40)
    if fails:
        with pytest.raises(RuntimeError, match="^the fit fails$"):
            model.fit(parties, label="target")
    else:
        model.fit(parties, label="target")
    assert len(seen) == 1 and seen[0]  # a worker process ran the fit
    assert not worker_processes() - children
    assert not open_clusters()


def test_a_fit_shares_the_cluster_the_process_holds_and_leaves_a_given_client_open(monkeypatch) -> None:
    """A fit on the setting an agent server of the process holds runs on that cluster and leaves it open."""
    from distributed.deploy.spec import SpecCluster

    compute = DaskCompute(workers=1, processes=False)
    release = hold_shared(compute)  # as an agent server holds it while it serves
    cluster = shared_cluster(compute)
    seen = _while_fitting(monkeypatch, lambda: [c for c in open_clusters() if isinstance(c, SpecCluster)])
    model, parties = _horizontal()
    model.set_params(compute=compute).fit(parties, label="target")
    assert len(seen[0]) == 1 and seen[0][0].scheduler_address == cluster.client.scheduler.address
    assert cluster.client.status == "running" and shared_cluster(compute) is cluster
    release()
    assert cluster.client.status == "closed"
    with losable_cluster(1) as (_, client):
        model.set_params(compute=client).fit(parties, label="target")
        assert client.status == "running"  # the caller's client is the caller's


def _config(root: Path, label: str = "class"):
    """Institution north, the label holder of a vertical federation, its workers reading its Parquet."""
    if not (root / "north").exists():
        _write(_north_and_new(_table("classification"))[0], root / "north")
    raw = {"federation": "f", "setting": "vertical", "consortium_key": {"env": "UNUSED"},
           "institutions": [
               {"name": "north", "data": str(root / "north" / "*.parquet"), "id_column": "patient_id",
                "label": label, "compute": LOCAL},
               {"name": "south", "data": "unused.parquet", "id_column": "patient_id"}]}
    return parse_config(raw, root / "federation.yaml")


@pytest.mark.parametrize("fault", ["a file that is not Parquet", "a misspelt label"])
def test_a_load_that_fails_lets_go_of_the_cluster_it_started(tmp_path, fault) -> None:
    config = _config(tmp_path)
    if fault == "a file that is not Parquet":
        broken = tmp_path / "north" / "part-3.parquet"
        broken.write_bytes(b"not a parquet file")
        error, message = DataReadError, f"cannot read {str(broken)!r}: ArrowInvalid: "
    else:
        config = _config(tmp_path, label="klass")
        error, message = ColumnNotFoundError, "institution 'north': label 'klass' is not a column of its "
    assert not open_clusters()
    with pytest.raises(error) as refused:
        institution_from_config(config, "north")
    assert str(refused.value).startswith(message)
    assert not open_clusters()


def test_a_loaded_table_keeps_the_cluster_for_whoever_serves_it(tmp_path) -> None:
    """Loaded, the cluster stays the process's; the holder that lets go last (an agent server) closes it."""
    config = _config(tmp_path)
    data = institution_from_config(config, "north")
    assert data.cluster is not None and data.cluster.client.status == "running"
    assert shared_cluster(config.institution("north").compute) is data.cluster
    hold_shared(config.institution("north").compute)()
    assert data.cluster.client.status == "closed" and not open_clusters()


def test_a_fit_on_a_scheduler_closes_its_client_and_the_cluster_runs_on() -> None:
    from distributed import Client

    with losable_cluster(1) as (running, mine):
        model, parties = _horizontal()
        model.set_params(compute=running.scheduler_address).fit(parties, label="target")
        assert [c for c in list(Client._instances) if c.status != "closed"] == [mine]  # the fit's is closed
        assert len(mine.scheduler_info()["workers"]) == 1
