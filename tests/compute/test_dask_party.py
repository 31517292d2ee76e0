"""A horizontal party's rows on a Dask cluster grow exactly the in-process forest (issue #29).

Blocks of 40 rows give each party several blocks per worker; every case is compared, node for node, with
the same estimator in process and the same seed.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedcore.compute.blocks import parquet_blocks
from fedcore.compute.cluster import DaskCompute, held_cluster
from fedcore.compute.dask_rows import DaskPartyRows
from fedcore.errors import ConfigError
from fedcore.horizontal import FederatedExtraTreesClassifier, FederatedExtraTreesRegressor, PPDERTClassifier
from fedcore.privacy.ldp import LabelLDP
from tests.compute.workers import losable_cluster, lose_a_worker_on_call
from tests.horizontal.common import assert_same_forest, horizontal_table, split_rows

BLOCK = 40


def _fit(model, table: pd.DataFrame, n_parties: int = 3):
    return model.fit(split_rows(table, n_parties, seed=n_parties), label="target")


def _fet(**kwargs) -> FederatedExtraTreesClassifier:
    # the DP modes draw thresholds in declared domains (here the pooled rows'); mode none ignores them
    return FederatedExtraTreesClassifier(n_estimators=3, max_depth=5, random_state=3, allow_data_ranges=True,
                                         **kwargs)


@pytest.mark.parametrize("privacy, workers", [
    ("none", "one_worker"), ("none", "three_workers"), ("gdp", "three_workers"),
    # a chosen level, drawn levels and the leaves' release, counted on the blocks
    ({"mode": "gdp", "plan": "leaves", "split_levels": 1}, "three_workers"),
    # the hello's marginal histograms per class, summed over the blocks
    ({"mode": "gdp", "plan": "marginals"}, "three_workers"),
    ("ldp", "one_worker"),  # mechanism "auto": k-RR for these 3 classes
    ({"mode": "ldp", "mechanism": "oue"}, "three_workers"),
    ({"mode": "ldp", "mechanism": "bloom"}, "three_workers"),
], ids=["none-one_worker", "none-three_workers", "gdp-three_workers", "gdp-leaves-three_workers",
        "gdp-marginals-three_workers", "ldp-auto-one_worker", "ldp-oue-three_workers",
        "ldp-bloom-three_workers"])
def test_fet_on_dask_is_the_in_process_forest(privacy, workers, request, monkeypatch) -> None:
    client = request.getfixturevalue(workers)
    table = horizontal_table(seed=1)
    expected = _fit(_fet(privacy=privacy), table)
    if privacy != "none":  # a DP party sends no extremes, so its rows on the cluster never compute them
        def no_ranges(self):
            raise AssertionError(f"privacy {privacy!r}: a party computed its nodes' min/max")
        monkeypatch.setattr(DaskPartyRows, "ranges", no_ranges)
    got = _fit(_fet(privacy=privacy, compute=client, block_rows=BLOCK), table)
    assert_same_forest(expected.model_, got.model_)
    assert got.model_.same_as(expected.model_)


def test_fet_regression_on_dask(three_workers) -> None:
    table = horizontal_table(seed=3, task="regression")
    make = lambda **kw: FederatedExtraTreesRegressor(n_estimators=3, max_depth=4, random_state=5,  # noqa: E731
                                                     tree_batch_size=2, **kw)
    assert_same_forest(_fit(make(), table, 2).model_,
                       _fit(make(compute=three_workers, block_rows=BLOCK), table, 2).model_)


@pytest.mark.parametrize(("thresholds", "workers"), [
    ("histogram", "one_worker"), ("histogram", "three_workers"), ("domain", "one_worker")])
def test_ppdert_on_dask_is_the_in_process_forest(thresholds, workers, request) -> None:
    client = request.getfixturevalue(workers)
    table = horizontal_table(seed=1)
    make = lambda **kw: PPDERTClassifier(n_estimators=2, max_depth=5, random_state=9,  # noqa: E731
                                         allow_data_ranges=True, thresholds=thresholds, **kw)
    expected = _fit(make(), table).model_
    got = _fit(make(compute=client, block_rows=BLOCK), table).model_
    assert_same_forest(expected, got)
    assert got.same_as(expected)


def test_blocks_submitted_in_any_order_give_the_same_forest(three_workers, monkeypatch) -> None:
    """LDP k-RR here: every statistic (min/max, report sums) whatever order the blocks' tasks run in."""
    made = DaskPartyRows.from_frame.__func__  # type: ignore[attr-defined]

    def shuffled(cls, *args, **kwargs):
        rows = made(cls, *args, **kwargs)
        rows.submit_order = list(np.random.default_rng(len(rows.blocks)).permutation(len(rows.blocks)))
        assert rows.submit_order != sorted(rows.submit_order)
        return rows

    monkeypatch.setattr(DaskPartyRows, "from_frame", classmethod(shuffled))
    table = horizontal_table(seed=2)
    krr = {"privacy": "ldp", "ldp": LabelLDP(mechanism="krr", report_epsilon=3.0)}
    assert_same_forest(_fit(_fet(**krr), table).model_,
                       _fit(_fet(**krr, compute=three_workers, block_rows=BLOCK), table).model_)


def _write_dataset(frame: pd.DataFrame, folder) -> None:
    """The frame as three Parquet files (sorted names in row order) of several row groups each."""
    folder.mkdir()
    for index, part in enumerate(np.array_split(np.arange(len(frame)), 3)):
        table = pa.Table.from_pandas(frame.iloc[part], preserve_index=False)
        pq.write_table(table, folder / f"part-{index:02d}.parquet", row_group_size=25)


class _FromParquet(FederatedExtraTreesClassifier):
    """FET whose parties' workers read their rows from a Parquet dataset (written from the frames first)."""

    folder = None

    def _rows(self, name, frame, schema):
        _write_dataset(frame, self.folder / name)
        return {"frame": None, "rows": DaskPartyRows.from_parquet(name, self.folder / name, schema,
                                                                  self._cluster.client, 30)}


def test_a_parquet_dataset_read_by_the_workers_gives_the_in_memory_forest(three_workers, tmp_path) -> None:
    table = horizontal_table(seed=4)
    model = _FromParquet(n_estimators=3, max_depth=5, random_state=3, compute=three_workers)
    model.folder = tmp_path
    got = _fit(model, table)
    blocks = parquet_blocks(tmp_path / "party2")  # the third party: 300 rows, 3 files of 4 row groups
    assert [(b.path.rsplit("/", 1)[1], b.row_group, b.n_rows) for b in blocks[:5]] == [
        ("part-00.parquet", 0, 25), ("part-00.parquet", 1, 25), ("part-00.parquet", 2, 25),
        ("part-00.parquet", 3, 25), ("part-01.parquet", 0, 25)]
    assert_same_forest(_fit(_fet(), table).model_, got.model_)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("inline, privacy", [(True, "none"), (False, "none"),
                                             pytest.param(True, "ldp", marks=pytest.mark.slow)],
                         ids=["arrays in the tasks", "arrays scattered", "ldp: permanent responses rebuilt"])
def test_a_worker_lost_mid_forest_still_gives_the_same_forest(tmp_path, monkeypatch, inline, privacy) -> None:
    from fedcore.compute import dask_rows

    if not inline:  # every level's arrays scattered to the workers instead of travelling in the tasks
        monkeypatch.setattr(dask_rows, "INLINE_BYTES", 0)

    table = horizontal_table(seed=5)
    with losable_cluster() as (cluster, client):
        # past the first levels: the partitions have a lineage to replay
        lost = lose_a_worker_on_call(monkeypatch, DaskPartyRows, "start_level", 8, cluster, client)
        model = _FromParquet(n_estimators=3, max_depth=5, random_state=3, compute=client, privacy=privacy,
                             allow_data_ranges=True)
        model.folder = tmp_path
        got = _fit(model, table)
        assert lost and len(client.scheduler_info()["workers"]) == 2
    assert_same_forest(_fit(_fet(privacy=privacy), table).model_, got.model_)


def test_an_unreachable_scheduler_is_one_error_naming_its_address() -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    compute = DaskCompute(address=address, connect_timeout_s=0.5)
    with pytest.raises(ConfigError) as error, held_cluster(compute):
        pass
    assert str(error.value) == (f"cannot reach the Dask scheduler at {address} within 0.5 s: check "
                                "compute.dask.address (or --dask) and that the scheduler runs")


def test_simulate_on_dask_reports_the_single_party_run_identical(three_workers) -> None:
    from fedcore.simulation import simulate_horizontal

    result = simulate_horizontal(horizontal_table(seed=6), "target", parties=3, trees=3, max_depth=4,
                                 local_only=False, compute=three_workers)
    assert result["single_party_identical"] is True and "in_process_identical" not in result


def test_simulate_ldp_on_dask_is_the_same_federation_in_process(three_workers, tmp_path, capsys) -> None:
    """No single-party run has the parties' noise: the Dask run is compared with the federation in process."""
    from fedcore.cli import main
    from fedcore.commands.simulate import format_result

    path = tmp_path / "table.csv"
    horizontal_table(seed=6).to_csv(path, index=False)
    address = three_workers.scheduler.address
    assert main(["simulate", "--data", str(path), "--label", "target", "--setting", "horizontal",
                 "--privacy", "ldp", "--parties", "3", "--trees", "3", "--max-depth", "4", "--dask", address,
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["privacy"] == "ldp" and result["compute"] == address
    assert result["single_party_identical"] is None and result["in_process_identical"] is True
    assert "on Dask, identical to the same federation in process: yes" in format_result(result)
