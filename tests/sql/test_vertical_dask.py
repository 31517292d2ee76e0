"""A vertical party on Dask whose workers read its database table in blocks in ID order (issues #29, #30).

Every institution's table is stored in PostgreSQL in a shuffled order; its workers read blocks of the ID
column's order, hash, align, bin and train. The forest and held-out evaluation are those of the
in-process agents reading the scenario's Parquet files (alignment puts the rows in the canonical order,
whatever each table's own order).
"""

from __future__ import annotations

import pandas as pd
import pytest

from fedcore.agents.data import InstitutionData
from fedcore.compute.cluster import Cluster, DaskCompute
from fedcore.compute.dask_table import open_sql, profile
from fedcore.data.scenario import make_vertical_scenario
from fedcore.data.sql import SqlSource
from fedcore.vertical.agent import VerticalInstitutionAgent
from tests.compute.test_vertical_parquet import _train
from tests.keys import master_public_key
from tests.postgres import load_table
from tests.vertical.test_session import KEY, _agents

pytestmark = pytest.mark.postgres
pytest.importorskip("distributed")
BLOCK_ROWS = 70


@pytest.mark.slow  # two federations and a database (about 15 s)
def test_vertical_agents_on_database_blocks_train_the_in_process_forest(database, tmp_path, monkeypatch,
                                                                        workers: Cluster) -> None:
    scenario = make_vertical_scenario(tmp_path / "scenario", n_customers=600, seed=3)
    expected = _train(_agents(scenario, tmp_path / "local", new_batch=False), "none")
    monkeypatch.setattr("fedcore.data.sql.read_sql", None)  # the agents never read a whole table
    agents = {}
    for name, files in scenario["institutions"].items():
        frame = pd.read_parquet(files["train"])
        categories = [c for c in frame.columns if isinstance(frame[c].dtype, pd.CategoricalDtype)]
        load_table(database, name, frame.astype(dict.fromkeys(categories, "str")).sample(
            frac=1.0, random_state=5))
        what = f"institution {name!r}"
        table = profile(workers.client, open_sql(SqlSource(("url", database), table=name), what,
                                                 scenario["id_column"], BLOCK_ROWS), [scenario["id_column"]])
        assert len(table.blocks) == -(-len(frame) // BLOCK_ROWS)
        data = InstitutionData(
            name=name, frame=pd.DataFrame(columns=list(table.columns)), id_column=scenario["id_column"],
            label=scenario["label"] if name == scenario["label_holder"] else None,
            registry=tmp_path / "registry" / name, predictions_dir=tmp_path / "predictions" / name,
            master_key=master_public_key(tmp_path), compute=DaskCompute(block_rows=BLOCK_ROWS),
            table=table, cluster=workers)
        agents[name] = VerticalInstitutionAgent(data, KEY)
    got = _train(agents, "none")
    assert got == expected
    assert all(a.party.rows.features is None for a in agents.values())


@pytest.mark.slow  # two federations and a database (about 20 s)
def test_a_database_batch_on_the_workers_delivers_the_in_process_predictions(database, tmp_path, monkeypatch,
                                                                             workers: Cluster) -> None:
    """The batch in PostgreSQL too (read in ID order): evaluation, predictions and delivery as in process.

    The `batch_hashes` answer follows the table's order, so the messages are compared from alignment on
    only through what they give: the delivered file, the master's values and the metrics.
    """
    from tests.compute.test_vertical_predict import _predict

    scenario = make_vertical_scenario(tmp_path / "scenario", n_customers=600, n_new=300, seed=3)
    expected = _predict(_agents(scenario, tmp_path / "local"), scenario)
    agents = {}
    for name, files in scenario["institutions"].items():
        tables = {}
        for kind in ("train", "new"):
            frame = pd.read_parquet(files[kind])
            categories = [c for c in frame.columns if isinstance(frame[c].dtype, pd.CategoricalDtype)]
            load_table(database, f"{name}_{kind}", frame.astype(dict.fromkeys(categories, "str")).sample(
                frac=1.0, random_state=5))
            tables[kind] = SqlSource(("url", database), table=f"{name}_{kind}")
        what = f"institution {name!r}"

        def opened(source: SqlSource, what: str = what) -> object:
            return profile(workers.client, open_sql(source, what, scenario["id_column"], BLOCK_ROWS),
                           [scenario["id_column"]])

        table = opened(tables["train"])
        data = InstitutionData(
            name=name, frame=pd.DataFrame(columns=list(table.columns)), id_column=scenario["id_column"],
            label=scenario["label"] if name == scenario["label_holder"] else None,
            registry=tmp_path / "registry" / name, predictions_dir=tmp_path / "predictions" / name,
            master_key=master_public_key(tmp_path), compute=DaskCompute(block_rows=BLOCK_ROWS),
            table=table, cluster=workers,
            open_batch=lambda source=tables["new"], opened=opened: opened(source))
        agents[name] = VerticalInstitutionAgent(data, KEY)
    monkeypatch.setattr("fedcore.data.sql.read_sql", None)  # the agents never read a whole table
    got = _predict(agents, scenario)
    pd.testing.assert_frame_equal(got[1], expected[1])
    assert [g.tobytes() for g in got[2]] == [e.tobytes() for e in expected[2]] and got[3] == expected[3]
    assert all(type(a.party._prediction).__name__ == "DaskPredictionRows" for a in agents.values())
