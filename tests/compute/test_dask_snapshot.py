"""A training snapshot built on Dask workers equals the in-process one (issue #33, dask_drift).

Blocks of rows, however cut, on one or two workers: the same bins and counts as the whole table in one
process, the deciles from the same position-keyed sample; and a vertical version trained on Parquet blocks
the agents never read reports a shifted batch's drift as the in-process version does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcore import drift
from fedcore.compute.dask_drift import block_snapshot, encoded_snapshot
from fedcore.compute.dask_rows import DaskPartyRows
from fedcore.drift import QUANTILES, training_snapshot
from fedcore.horizontal.schema import CATEGORICAL, NUMERIC, ColumnSpec, HorizontalSchema
from tests.compute.test_vertical_parquet import _parquet_agents
from tests.compute.test_vertical_predict import _with_parquet_batch
from tests.test_drift import _table
from tests.vertical.test_session import _agents, _stored

CUTS = ([0, 3000], [0, 1, 1500, 3000], [0, 700, 701, 2000, 2999, 3000])


@pytest.mark.parametrize("workers", ["one_worker", "two_workers"])
def test_blocks_on_the_workers_give_the_in_process_snapshot(workers, request, monkeypatch) -> None:
    client = request.getfixturevalue(workers)
    monkeypatch.setattr(drift, "SAMPLE_ROWS", 700)  # 3000 rows: the deciles from a sample of about 700
    frame = _table(3000, 21)
    expected = training_snapshot(frame)
    exact = np.quantile(frame["income"].dropna(), QUANTILES)
    assert expected["features"]["income"]["edges"] != np.unique(exact).tolist()  # the sample's, not all rows'
    for cuts in CUTS:
        frames = [client.scatter(frame.iloc[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
        sizes = np.diff(cuts).tolist()
        assert block_snapshot(client, frames, sizes, list(frame.columns)) == expected
    monkeypatch.undo()  # 3000 rows under the usual SAMPLE_ROWS: every row, the exact deciles
    assert training_snapshot(frame)["features"]["income"]["edges"] == np.unique(exact).tolist()


@pytest.mark.parametrize("workers", ["one_worker", "two_workers"])
def test_a_horizontal_partys_encoded_blocks_give_the_in_process_snapshot(workers, request,
                                                                        monkeypatch) -> None:
    client = request.getfixturevalue(workers)
    monkeypatch.setattr(drift, "SAMPLE_ROWS", 700)
    frame = _table(3000, 22).assign(label=lambda f: (f["orders"] > 3).astype(int))
    frame["channel"] = frame["channel"].astype(str)
    schema = HorizontalSchema((ColumnSpec("income", NUMERIC), ColumnSpec("orders", NUMERIC),
                               ColumnSpec("channel", CATEGORICAL, ("app", "store", "web"))),
                              "label", "classification", (0, 1))
    expected = training_snapshot(schema.decode(schema.encode(frame)))  # the in-process agent's
    assert set(expected["features"]["channel"]["categories"]) == {"app", "store", "web"}
    rows = DaskPartyRows.from_frame("north", frame, schema, client, block_rows=700)
    assert len(rows.blocks) == 5
    assert encoded_snapshot(client, rows.data, [b.n_rows for b in rows.blocks], schema) == expected


@pytest.fixture(scope="module")
def shifted_scenario(tmp_path_factory) -> dict:
    """A vertical scenario whose e-commerce batch has baskets three times larger, every row on one channel."""
    from fedcore.data.scenario import make_vertical_scenario

    root = tmp_path_factory.mktemp("scenario")
    scenario = make_vertical_scenario(root, n_customers=600, n_new=300, seed=3)
    files = scenario["institutions"]["ecommerce"]
    batch = pd.read_parquet(files["new"])
    batch["avg_basket"] = batch["avg_basket"] * 3
    batch["preferred_channel"] = pd.Categorical([batch["preferred_channel"].cat.categories[0]] * len(batch),
                                                categories=batch["preferred_channel"].cat.categories)
    files["new"] = str(root / "shifted.parquet")
    batch.to_parquet(files["new"])
    return scenario


def _stored_and_predicted(agents: dict, scenario: dict, root: Path) -> dict:
    """Train, store at every institution, batch predict: the drift the master was told."""
    session, _, _ = _stored(agents, root, 3, 0.25)
    return session.predict(scenario["label_holder"]).drift


@pytest.mark.slow
def test_a_version_trained_on_the_workers_reports_the_in_process_drift(shifted_scenario, tmp_path,
                                                                      two_workers) -> None:
    local = _agents(shifted_scenario, tmp_path / "local")
    expected = _stored_and_predicted(local, shifted_scenario, tmp_path / "local")
    assert {"avg_basket", "preferred_channel"} <= set(expected["ecommerce"])  # 450 training rows: some noise
    root = tmp_path / "dask"
    agents = _with_parquet_batch(_parquet_agents(shifted_scenario, root, two_workers), shifted_scenario, root,
                                 two_workers)
    assert _stored_and_predicted(agents, shifted_scenario, root) == expected
    for name, agent in agents.items():  # on the workers: each snapshot is the in-process one, in its registry
        assert agent.party.rows.features is None
        assert agent.snapshot == local[name].snapshot and agent.snapshot is not None
        assert agent.reports["drift"] == local[name].reports["drift"]


@pytest.mark.slow
def test_a_horizontal_version_trained_on_the_workers_reports_the_in_process_drift(tmp_path,
                                                                                  three_workers) -> None:
    """North trains and predicts on its workers (Parquet they read): its snapshot and drift as in process."""
    from fedcore.contracts.model import infer_contract
    from fedcore.horizontal.agent import HorizontalInstitutionAgent
    from fedcore.horizontal.params import ExtraTreesParams
    from tests.compute.test_agent_parquet import _config, _load, _north_and_new
    from tests.compute.test_agent_parquet import _table as waveform
    from tests.compute.test_agent_sink import _trained_and_stored
    from tests.horizontal.test_session import _agents as horizontal_agents
    from tests.horizontal.test_session import _session

    table = waveform("classification")
    contract = infer_contract(table, "waveform", id_column="patient_id", label="class")
    north, new = _north_and_new(table)
    new = new.assign(x1=new["x1"] + 3.0)  # one feature shifted
    seen = {}
    for on_dask in (False, True):
        root = tmp_path / ("dask" if on_dask else "local")
        root.mkdir()
        data = _load(_config(root, north, new, contract, on_dask), three_workers, on_dask)
        assert (data.table is not None) == on_dask  # on Dask: the workers read its rows and its batch
        agents = horizontal_agents(table, root, contract)
        agents["north"] = HorizontalInstitutionAgent(data, identity=agents["north"].identity)
        session = _session(agents)
        session.params = ExtraTreesParams(n_estimators=4, max_depth=5, random_state=4)
        _trained_and_stored(session, root)
        drift = session.predict_locally("run")["drift"]
        seen[on_dask] = drift, agents["north"].snapshot, agents["north"].reports["drift"]
        session.close()
    assert seen[True][1] is not None and seen[True] == seen[False]
    assert "x1" in seen[True][0]["north"]


@pytest.mark.parametrize("stored_as", ["timestamps", "ISO date strings"])
@pytest.mark.slow  # 11-16 s on 2 cores: an end-to-end run, in CI's slow pass (make test-slow)
def test_date_columns_are_days_in_both_snapshots(tmp_path, two_workers, stored_as) -> None:
    """A date column, loaded as an agent loads it, is binned as days since 1970 in process and on Dask.

    The agent's loader turns dates into numbers before anything sees them (`fedcore.data.columns`), and a
    worker's block reader does the same: the snapshot's deciles are days on both sides, not one category
    per day on one side.
    """
    from fedcore.compute.dask_table import read_table_block
    from fedcore.contracts.model import infer_contract
    from tests.compute.test_agent_parquet import _config, _load, _north_and_new
    from tests.compute.test_agent_parquet import _table as waveform

    table = waveform("classification")
    days = np.random.default_rng(4).integers(0, 900, len(table)).astype("timedelta64[D]")
    seen = pd.Series(np.datetime64("2024-01-01") + days)
    table["first_seen"] = seen if stored_as == "timestamps" else seen.dt.strftime("%Y-%m-%d")
    contract = infer_contract(table, "waveform", id_column="patient_id", label="class")
    north, new = _north_and_new(table)
    snapshots = []
    for on_dask in (False, True):
        data = _load(_config(tmp_path, north, new, contract, on_dask, setting="vertical"), two_workers,
                     on_dask)
        features = [c for c in north.columns if c not in ("patient_id", "class")]
        if not on_dask:
            snapshots.append(training_snapshot(data.frame[features]))
            continue
        frames = [two_workers.submit(read_table_block, block, data.table, features, pure=False)
                  for block in data.table.blocks]
        snapshots.append(block_snapshot(two_workers, frames, [b.n_rows for b in data.table.blocks], features))
    first_seen = snapshots[0]["features"]["first_seen"]
    assert first_seen["kind"] == "numeric"  # days: 2024-01-01 is day 19,723
    assert 19_723 <= first_seen["edges"][0] < first_seen["edges"][-1] < 19_723 + 900
    assert snapshots[1] == snapshots[0]
