"""A horizontal institution on Dask delivers its workers' predictions into its sink (issue #30).

North's new rows are read and predicted by its Dask workers, a Parquet part per block, in the agent's
hidden temporary folder; the agent streams the parts into north's PostgreSQL table or Parquet dataset with
the in-process delivery code, then removes the folder. The delivered rows equal the in-process agent's
(digest and dataset file name included; all columns but `predicted_at`); a failed first attempt of the flow
run leaves nothing, its retries leave exactly one copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import pytest

from fedcore.agents.data import InstitutionData
from fedcore.contracts.model import infer_contract
from fedcore.data.sql import SqlSource, read_sql
from fedcore.errors import DataWriteError
from fedcore.horizontal.agent import HorizontalInstitutionAgent
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.session import HorizontalSession
from fedcore.models.registry import ModelRegistry
from tests.compute.test_agent_parquet import _config, _load, _north_and_new, _table
from tests.horizontal.test_session import _agents, _session
from tests.keys import master_key, master_public_key

RUN = "flow-run-1"


def _session_for(root: Path, table: pd.DataFrame, contract, north: InstitutionData) -> HorizontalSession:
    """A session of `north` (its data loaded from its config once: validation is slow) and the others."""
    agents = _agents(table, root, contract)
    agents["north"] = HorizontalInstitutionAgent(north, identity=agents["north"].identity)
    session = _session(agents)
    session.params = ExtraTreesParams(n_estimators=4, max_depth=5, random_state=4)
    return session


def _trained_and_stored(session: HorizontalSession, root: Path) -> ModelRegistry:
    """Train and store v0001 everywhere; the master's registry that the later runs load it from."""
    session.agree_schema()
    session.train()
    registry = ModelRegistry(root / "master", signing_key=master_key(root))
    version = registry.register("waveform", {"parties": session.manifest_entries()["parties"]},
                                session.master_tables())
    session.store_at_institutions("waveform", version, registry.read_manifest("waveform", version))
    return ModelRegistry(root / "master", public_key=master_public_key(root))


def _sink(database: str | None, root: Path, tag: str) -> tuple[dict, Callable[[], pd.DataFrame]]:
    """North's `predictions:` entry, and a reader of what was delivered there (in ID order)."""
    if database is not None:
        query = f"SELECT * FROM scores_{tag} ORDER BY patient_id"
        return ({"sql": {"url": {"env": "FED_DB_URL"}, "table": f"scores_{tag}"}},
                lambda: read_sql(SqlSource(("url", database), query=query), "test"))

    def dataset() -> pd.DataFrame:
        rows = ds.dataset(root / f"scores-{tag}", format="parquet", partitioning="hive").to_table()
        return rows.to_pandas().sort_values("patient_id", ignore_index=True)

    return {"parquet": {"path": str(root / f"scores-{tag}")}}, dataset


@pytest.mark.parametrize("sink", [pytest.param("sql", marks=pytest.mark.postgres),
                                  pytest.param("parquet", marks=pytest.mark.slow)])
def test_workers_predictions_are_delivered_once_as_the_in_process_agent_delivers_them(
        request, tmp_path, three_workers, monkeypatch, sink) -> None:
    database = postgres = None
    if sink == "sql":
        database, postgres = request.getfixturevalue("database"), request.getfixturevalue("postgres")
        monkeypatch.setenv("FED_DB_URL", database)
    table = _table("classification")
    contract = infer_contract(table, "waveform", id_column="patient_id", label="class")
    north, new = _north_and_new(table)
    (local_sink, local_rows), (dask_sink, dask_rows) = (_sink(database, tmp_path, tag)
                                                        for tag in ("local", "dask"))
    local = _load(_config(tmp_path, north, new, contract, False, predictions=local_sink), None, False)
    on_dask = _load(_config(tmp_path, north, new, contract, True, predictions=dask_sink), three_workers, True)
    on_dask = dataclasses.replace(on_dask, registry=local.registry)  # the same institution, now on Dask
    assert on_dask.open_batch is not None and local.load_batch is not None

    session = _session_for(tmp_path, table, contract, local)
    master = _trained_and_stored(session, tmp_path)
    expected = session.predict_locally(RUN)
    session.close()

    def attempt() -> dict:  # an attempt of the flow run: a new session loads the stored version
        session = _session_for(tmp_path, table, contract, on_dask)
        session.load_model(master, "waveform", "v0001")
        try:
            return session.predict_locally(RUN)
        finally:
            session.close()

    partition = tmp_path / "scores-dask" / "model=waveform" / "version=v0001"
    if postgres is not None:  # the first attempt fails at the sink: another table took its name
        postgres.execute("CREATE TABLE scores_dask (x int)", database.rsplit("/", 1)[1])
    else:  # a file where the partition's folder goes
        partition.parent.mkdir(parents=True)
        partition.write_text("not a folder")
    with pytest.raises(DataWriteError, match="^institution 'north': cannot write predictions to "):
        attempt()
    temporary = tmp_path / "predictions" / "north"  # the workers' parts wait here for delivery
    assert list(temporary.iterdir()) == [], "no temporary folder left"
    if postgres is not None:
        name = database.rsplit("/", 1)[1]
        assert postgres.execute("SELECT count(*) FROM scores_dask", name) == [(0,)], "nothing written"
        postgres.execute("DROP TABLE scores_dask", name)
    else:
        assert [p.name for p in (tmp_path / "scores-dask").rglob("*")] == ["model=waveform", "version=v0001"]
        partition.unlink()
    results = [attempt(), attempt()]  # Prefect's retries keep the run's id
    assert list(temporary.iterdir()) == [], "no temporary folder left"

    rows, delivered = local_rows(), dask_rows()
    assert len(delivered) == len(new) and set(delivered["run_id"]) == {RUN}, "the retries left one copy"
    assert sorted(delivered["patient_id"]) == sorted(new["patient_id"])
    assert delivered["batch_sha256"].nunique() == 1
    pd.testing.assert_frame_equal(delivered.drop(columns="predicted_at"), rows.drop(columns="predicted_at"),
                                  check_exact=True)
    assert [r["counts"]["north"] for r in results] == [expected["counts"]["north"]] * 2 == [len(new)] * 2
    if postgres is not None:
        assert [r["paths"]["north"] for r in results] == ["table 'scores_dask'"] * 2
    else:  # the same file name: a digest of the model and the run id
        (file,) = (tmp_path / "scores-dask").rglob("*.parquet")
        assert [r["paths"]["north"] for r in results] == [str(file)] * 2
        assert file.relative_to(tmp_path / "scores-dask") == Path(expected["paths"]["north"]).relative_to(
            tmp_path / "scores-local")
