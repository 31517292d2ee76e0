"""Federations (horizontal, vertical) whose institutions keep their rows and predictions in PostgreSQL.

The same rows from database tables and from Parquet files give the same model (digest) and the same
predictions; a batch prediction retried under the same flow run id leaves one copy of its rows.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from fedcore.config import parse_config
from fedcore.contracts.model import dump_contract, infer_contract
from fedcore.data.datasets import make_waveform
from fedcore.data.split import split_horizontal
from fedcore.data.sql import SqlSource, read_sql
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.session import HorizontalSession
from fedcore.models.artifacts import table_sha256
from fedcore.models.registry import ModelRegistry
from tests.federations import horizontal_session_from_config, vertical_session_from_config
from tests.keys import master_key, master_public_key
from tests.postgres import load_table

pytestmark = pytest.mark.postgres
NAMES = ("north", "south", "east")
SQL = {"url": {"env": "FED_DB_URL"}}


def _write_rows(database: str, root: Path) -> None:
    """Each institution's rows and new rows, in the database and as Parquet files; one shared contract."""
    table = make_waveform(600, random_state=3)
    table["class"] = table["class"].map({0: "a", 1: "b", 2: "c"})
    table.insert(0, "patient_id", [f"P{i:05d}" for i in range(len(table))])
    contract = infer_contract(table, "waveform", "patient_id", "class")
    (root / "contract.yaml").write_text(dump_contract(contract))
    for name, part in zip(NAMES, split_horizontal(table, 3, seed=1), strict=True):
        part = part.reset_index(drop=True)
        new = part.sample(frac=0.3, random_state=2).drop(columns=["class"]).reset_index(drop=True)
        for rows, stem in ((part, name), (new, f"{name}_new")):
            load_table(database, stem, rows)
            rows.to_parquet(root / f"{stem}.parquet")


def _config(root: Path, sql: bool):
    institutions = [{
        "name": name, "id_column": "patient_id", "label": "class", "contract": "contract.yaml",
        "data": {"sql": {**SQL, "table": name}} if sql else f"{name}.parquet",
        "predict_data": ({"sql": {**SQL, "query": f"SELECT * FROM {name}_new ORDER BY patient_id"}} if sql
                         else f"{name}_new.parquet"),
        "registry": f"{'db' if sql else 'files'}/registry/{name}",
        **({"predictions": {"sql": {**SQL, "table": f"{name}_scores"}}} if sql else {}),
    } for name in NAMES]
    raw = {"federation": "waveform", "setting": "horizontal", "consortium_key": {"env": "UNUSED"},
           "master": {"public_key": str(master_public_key(root))}, "institutions": institutions}
    return parse_config(raw, root / "federation.yaml")


def _session(config) -> HorizontalSession:
    return horizontal_session_from_config(
        config, ExtraTreesParams(n_estimators=6, max_depth=6, random_state=4))


def _train_store_predict(config, root: Path, run_id: str) -> tuple[str, dict]:
    session = _session(config)
    session.agree_schema()
    session.train()
    digest = table_sha256(session.model.to_table())
    registry = ModelRegistry(root / "registry" / "master", signing_key=master_key(root.parent))
    version = registry.register("waveform", {"parties": session.manifest_entries()["parties"]},
                                session.master_tables())
    session.store_at_institutions("waveform", version, registry.read_manifest("waveform", version))
    return digest, session.predict_locally(run_id)


@pytest.mark.slow  # 11-16 s on 2 cores: an end-to-end run, in CI's slow pass (make test-slow)
def test_rows_from_postgresql_train_the_parquet_model_and_a_retried_prediction_leaves_one_copy(
        database, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FED_DB_URL", database)
    _write_rows(database, tmp_path)
    parquet_digest, from_files = _train_store_predict(_config(tmp_path, sql=False), tmp_path / "files",
                                                      "flow-run-0")
    sql_config = _config(tmp_path, sql=True)
    sql_digest, first = _train_store_predict(sql_config, tmp_path / "db", "flow-run-1")
    assert sql_digest == parquet_digest
    assert first["paths"] == {name: f"table '{name}_scores'" for name in NAMES}

    again = _session(sql_config)  # the retried flow run: a new session loads the stored version
    master = ModelRegistry(tmp_path / "db" / "registry" / "master", public_key=master_public_key(tmp_path))
    assert again.load_model(master, "waveform", "latest") == "v0001"
    assert again.predict_locally("flow-run-1")["counts"] == first["counts"]
    for name in NAMES:
        scores = read_sql(SqlSource(("url", database), query=f"SELECT * FROM {name}_scores ORDER BY "
                                                               "patient_id"), "test")
        expected = pd.read_parquet(from_files["paths"][name]).sort_values("patient_id", ignore_index=True)
        assert len(scores) == first["counts"][name], "the retry replaced its rows, no second copy"
        assert set(scores["run_id"]) == {"flow-run-1"} and set(scores["version"]) == {"v0001"}
        pd.testing.assert_frame_equal(scores[list(expected.columns)], expected, check_exact=True)


def _vertical_rows(database: str, root: Path) -> None:
    """The vertical demo's institutions' rows in the database and as Parquet files of the same rows.

    Their categorical columns as text: a database holds strings, not pandas categories.
    """
    from fedcore.data.scenario import make_vertical_scenario

    scenario = make_vertical_scenario(root / "scenario", n_customers=400, seed=3)
    for name, files in scenario["institutions"].items():
        for kind in ("train", "new"):
            rows = pd.read_parquet(files[kind])
            categories = [c for c in rows.columns if isinstance(rows[c].dtype, pd.CategoricalDtype)]
            rows = rows.astype(dict.fromkeys(categories, "str"))
            load_table(database, f"{name}_{kind}", rows)
            rows.to_parquet(root / f"{name}_{kind}.parquet")


def _vertical_config(root: Path, sql: bool):
    kind = "db" if sql else "files"
    institutions = [{
        "name": name, "id_column": "customer_id", "registry": f"{kind}/registry/{name}",
        **({"label": "responded"} if name == "bank" else {}),
        "data": {"sql": {**SQL, "table": f"{name}_train"}} if sql else f"{name}_train.parquet",
        "predict_data": {"sql": {**SQL, "table": f"{name}_new"}} if sql else f"{name}_new.parquet",
        **({"predictions": {"sql": {**SQL, "table": "bank_scores"}}} if sql and name == "bank" else {}),
    } for name in ("bank", "ecommerce", "insurer")]
    raw = {"federation": "demo", "consortium_key": {"env": "UNUSED"},
           "master": {"public_key": str(master_public_key(root))}, "institutions": institutions}
    return parse_config(raw, root / "federation.yaml")


def test_a_vertical_federation_from_postgresql_trains_the_parquet_model_and_delivers_once(
        database, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FED_DB_URL", database)
    _vertical_rows(database, tmp_path)
    digests, delivered = [], []
    for sql in (False, True):
        session = vertical_session_from_config(_vertical_config(tmp_path, sql))
        session.align()
        session.train()
        parties = session.manifest_entries()["parties"]
        master_digest = table_sha256(session.master_tables()["master"])
        digests.append([p["table_sha256"] for p in parties] + [master_digest])
        root = tmp_path / ("db" if sql else "files")
        registry = ModelRegistry(root / "registry" / "master", signing_key=master_key(tmp_path))
        version = registry.register("demo", {"parties": parties}, session.master_tables())
        session.store_at_institutions("demo", version, registry.read_manifest("demo", version))
        delivered.append(session.batch_predict("bank", run_id="flow-run-7"))
    assert digests[1] == digests[0] and all(len(d) == 64 for d in digests[0]) and len(digests[0]) == 4
    assert delivered[1]["path"] == "table 'bank_scores'"

    again = vertical_session_from_config(_vertical_config(tmp_path, sql=True))  # the retried flow run
    master = ModelRegistry(tmp_path / "db" / "registry" / "master", public_key=master_public_key(tmp_path))
    again.load_model(master, "demo", "latest")
    assert again.batch_predict("bank", run_id="flow-run-7")["rows"] == delivered[1]["rows"]
    scores = read_sql(SqlSource(("url", database), query="SELECT * FROM bank_scores ORDER BY customer_id"),
                      "test")
    expected = pd.read_parquet(delivered[0]["path"]).sort_values("customer_id", ignore_index=True)
    assert len(scores) == delivered[1]["rows"] and set(scores["run_id"]) == {"flow-run-7"}
    pd.testing.assert_frame_equal(scores[list(expected.columns)], expected, check_exact=True)
