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
distributed = pytest.importorskip("distributed")
BLOCK_ROWS = 70


@pytest.mark.slow  # two federations and a database (about 15 s)
def test_vertical_agents_on_database_blocks_train_the_in_process_forest(database, tmp_path,
                                                                        monkeypatch) -> None:
    scenario = make_vertical_scenario(tmp_path / "scenario", n_customers=600, seed=3)
    expected = _train(_agents(scenario, tmp_path / "local", new_batch=False), "none")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                       dashboard_address=":0")
    client = distributed.Client(cluster, set_as_default=False)
    monkeypatch.setattr("fedcore.data.sql.read_sql", None)  # the agents never read a whole table
    try:
        agents = {}
        for name, files in scenario["institutions"].items():
            frame = pd.read_parquet(files["train"])
            categories = [c for c in frame.columns if isinstance(frame[c].dtype, pd.CategoricalDtype)]
            load_table(database, name, frame.astype(dict.fromkeys(categories, "str")).sample(
                frac=1.0, random_state=5))
            what = f"institution {name!r}"
            table = profile(client, open_sql(SqlSource(("url", database), table=name), what,
                                             scenario["id_column"], BLOCK_ROWS), [scenario["id_column"]])
            assert len(table.blocks) == -(-len(frame) // BLOCK_ROWS)
            data = InstitutionData(
                name=name, frame=pd.DataFrame(columns=list(table.columns)), id_column=scenario["id_column"],
                label=scenario["label"] if name == scenario["label_holder"] else None,
                registry=tmp_path / "registry" / name, predictions_dir=tmp_path / "predictions" / name,
                master_key=master_public_key(tmp_path), compute=DaskCompute(block_rows=BLOCK_ROWS),
                table=table, cluster=Cluster(client, []))
            agents[name] = VerticalInstitutionAgent(data, KEY)
        got = _train(agents, "none")
    finally:
        client.close()
        cluster.close()
    assert got == expected
    assert all(a.party.rows.features is None for a in agents.values())
