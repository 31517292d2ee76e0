"""An institution on Dask whose workers read its database table in blocks in ID order (issue #30).

North's rows are stored in the database in a shuffled order. In process the agent reads them ordered by
the ID column; on Dask the agent asks the server only for the row count and one ID per block, and the
workers read their blocks (IDs between two cuts). Both give the same validation, forest, held-out
evaluation and predictions, which are also those of the same rows as a Parquet file in ID order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcore.agents.data import institution_from_config
from fedcore.compute.cluster import Cluster
from fedcore.config import parse_config
from fedcore.contracts.model import dump_contract, infer_contract
from fedcore.errors import ColumnNotFoundError, DataReadError
from fedcore.horizontal.agent import HorizontalInstitutionAgent
from fedcore.protocol.messages import Message
from tests.compute.test_agent_parquet import _north_and_new, _table
from tests.horizontal.test_session import _agents, _session
from tests.keys import master_public_key
from tests.postgres import load_table

pytestmark = pytest.mark.postgres
distributed = pytest.importorskip("distributed")
BLOCK_ROWS = 45


@pytest.fixture(scope="module")
def two_workers():
    """A client to a LocalCluster of two in-process workers."""
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                       dashboard_address=":0")
    client = distributed.Client(cluster, set_as_default=False)
    yield client
    client.close()
    cluster.close()


def _config(root: Path, contract, data: object, predict_data: object, on_dask: bool, tag: str):
    (root / "north.yaml").write_text(dump_contract(contract))
    compute = {"compute": {"dask": {"local": {"workers": 1}, "block_rows": BLOCK_ROWS}}} if on_dask else {}
    raw = {"federation": "f", "setting": "horizontal", "consortium_key": {"env": "UNUSED"},
           "master": {"public_key": str(master_public_key(root))}, "training": {"holdout": 0.25},
           "institutions": [
               {"name": "north", "data": data, "predict_data": predict_data, "id_column": "patient_id",
                "label": "class", "contract": str(root / "north.yaml"),
                "registry": str(root / f"registry-{tag}"), "predictions": str(root / f"predictions-{tag}"),
                **compute},
               {"name": "south", "data": "unused.parquet", "id_column": "patient_id", "label": "class"}]}
    return parse_config(raw, root / "federation.yaml")


def _sql(table: str) -> dict:
    return {"sql": {"url": {"env": "FED_DB_URL"}, "table": table}}


def _refuse_whole_reads(monkeypatch) -> None:
    """The agent process never reads the whole table (the threaded workers read their own blocks)."""
    def refuse(*args, **kwargs):
        raise AssertionError("the agent read the whole table")

    monkeypatch.setattr("fedcore.data.sql.read_sql", refuse)


@pytest.mark.slow  # three federations (about 20 s)
def test_workers_reading_database_blocks_answer_as_the_in_process_agent_and_the_sorted_parquet(
        database, tmp_path, monkeypatch, two_workers) -> None:
    monkeypatch.setenv("FED_DB_URL", database)
    table = _table("classification")
    contract = infer_contract(table, "waveform", id_column="patient_id", label="class")
    north, new = _north_and_new(table)
    north = north.astype({"region": "str"})  # a database holds strings, not pandas categories
    load_table(database, "north", north.sample(frac=1.0, random_state=5))  # stored in no particular order
    load_table(database, "north_new", new.astype({"region": "str"}))
    in_id_order = north.sort_values("patient_id", ignore_index=True)
    in_id_order.to_parquet(tmp_path / "north.parquet")
    new.to_parquet(tmp_path / "north_new.parquet")
    runs = {"parquet": (str(tmp_path / "north.parquet"), str(tmp_path / "north_new.parquet"), False),
            "sql": (_sql("north"), _sql("north_new"), False),
            "dask": (_sql("north"), _sql("north_new"), True)}
    results = {}
    for tag, (data_source, batch_source, on_dask) in runs.items():
        config = _config(tmp_path, contract, data_source, batch_source, on_dask, tag)
        if on_dask:
            _refuse_whole_reads(monkeypatch)
        data = institution_from_config(config, "north", cluster=Cluster(two_workers, []) if on_dask else None)
        assert data.valid and data.n_rows == len(north)
        if on_dask:
            assert len(data.frame) == 0 and data.table is not None
            assert [b.n_rows for b in data.table.blocks] == [45, 45, 45, 45, 20]
        agents = _agents(table, tmp_path / f"run-{tag}", contract)
        agents["north"] = HorizontalInstitutionAgent(data, identity=agents["north"].identity)
        session = _session(agents)
        session.agree_schema()
        session.train()
        metrics = session.evaluate()
        reply = agents["north"].handle(Message("predict_local"))
        monkeypatch.undo()
        monkeypatch.setenv("FED_DB_URL", database)
        path = Path(reply.header["path"])
        predictions = (pd.concat([pd.read_parquet(p) for p in sorted(path.iterdir())], ignore_index=True)
                       if path.is_dir() else pd.read_parquet(path))
        results[tag] = session.model, metrics, session.facts.holdout_rows, predictions
        session.close()
    (model, metrics, held, predictions) = results.pop("parquet")
    for tag, (other_model, other_metrics, other_held, other_predictions) in results.items():
        assert other_model.same_as(model), tag
        assert other_metrics == metrics and other_held == held, tag
        pd.testing.assert_frame_equal(other_predictions.sort_values("patient_id", ignore_index=True),
                                      predictions.sort_values("patient_id", ignore_index=True),
                                      check_exact=True)
    assert list(results["dask"][3]["patient_id"]) == sorted(new["patient_id"]), "predicted in ID order"


def test_a_null_or_missing_id_column_is_refused_before_any_block_is_read(database, tmp_path, monkeypatch,
                                                                        two_workers) -> None:
    monkeypatch.setenv("FED_DB_URL", database)
    table = _table("classification")
    contract = infer_contract(table, "waveform", id_column="patient_id", label="class")
    north, _ = _north_and_new(table)
    north = north.astype({"region": "str"})
    north.loc[[3, 9], "patient_id"] = None
    load_table(database, "north", north)
    load_table(database, "renamed", north.rename(columns={"patient_id": "pid"}))
    config = _config(tmp_path, contract, _sql("north"), _sql("north"), True, "nulls")
    with pytest.raises(DataReadError) as refused:
        institution_from_config(config, "north", cluster=Cluster(two_workers, []))
    assert str(refused.value) == (
        "institution 'north': 2 rows of table 'north' have no 'patient_id': the rows are read in blocks of "
        "that column's order, so it may hold no null")
    config = _config(tmp_path, contract, _sql("renamed"), _sql("renamed"), True, "renamed")
    with pytest.raises(ColumnNotFoundError) as missing:
        institution_from_config(config, "north", cluster=Cluster(two_workers, []))
    assert str(missing.value) == ("institution 'north': id_column 'patient_id' is not a column of table "
                                  "'renamed'; set institutions[0].id_column in "
                                  f"{tmp_path / 'federation.yaml'}")


def test_a_table_changed_while_it_is_read_is_refused(database, monkeypatch) -> None:
    from fedcore.data.sql import SqlSource, key_blocks, read_range

    frame = pd.DataFrame({"id": np.arange(100), "x": np.arange(100) / 7})
    load_table(database, "t", frame)
    blocks, _ = key_blocks(SqlSource(("url", database), table="t"), "test", "id", 30)
    assert [(b.after, b.upto, b.n_rows) for b in blocks] == [(None, 29, 30), (29, 59, 30), (59, 89, 30),
                                                            (89, None, 10)]
    pd.testing.assert_frame_equal(read_range(blocks[1], "test"), frame.iloc[30:60].reset_index(drop=True),
                                  check_exact=True)
    commented = SqlSource(("url", database), query="SELECT * FROM t -- every row")
    assert [b.n_rows for b in key_blocks(commented, "test", "id", 30)[0]] == [30, 30, 30, 10]
    load_table(database, "twice", pd.concat([frame, frame.iloc[[5, 6]]], ignore_index=True))
    with pytest.raises(DataReadError) as repeated:
        key_blocks(SqlSource(("url", database), table="twice"), "test", "id", 30)
    assert str(repeated.value) == ("test: 2 rows of table 'twice' repeat another row's 'id': the rows are "
                                   "read in blocks between two of its values, so each must be unique")
    import adbc_driver_postgresql.dbapi as pg

    with pg.connect(database, autocommit=True) as conn, conn.cursor() as cursor:
        cursor.execute("DELETE FROM t WHERE id = 40")
    with pytest.raises(DataReadError) as refused:
        read_range(blocks[1], "test")
    assert str(refused.value) == (
        "test: table 't' changed while it was read: a block holds 29 rows, not the 30 counted when it was "
        "opened; read from a table or snapshot that does not change during the run")
