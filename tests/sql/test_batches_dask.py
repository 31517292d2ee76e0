"""Scheduled batches of a `:since`/`:until` query cut into blocks and predicted by Dask workers (issue #30).

The scenario of `tests/sql/test_batches.py` twice: once with both institutions' agents reading in process,
once with `compute: dask` (a LocalCluster of in-process workers). On Dask the agent binds each run's window,
asks the server for the batch's row count and one ID per block, and the workers read and predict the
blocks; the agent never reads a batch. Every run delivers the same rows (all columns but the delivery time)
into north's table and south's dataset as in process, a failed delivery does not advance the batch, its
retry and a late retry leave one copy, and the batch ledgers end byte-identical.
"""

from __future__ import annotations

import logging
import re
import shutil
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import pytest

from fedcore.agents.batches import LEDGER
from fedcore.compute.cluster import Cluster
from fedcore.config import parse_config
from fedcore.data.sql import SqlSource, read_sql
from fedcore.errors import DataWriteError
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.models.registry import ModelRegistry
from tests.federations import horizontal_session_from_config
from tests.keys import master_key, master_public_key
from tests.postgres import load_table
from tests.sql.test_batches import BATCH, DAYS, NAMES, SQL, START, _signed_up, _write_rows

pytestmark = pytest.mark.postgres
distributed = pytest.importorskip("distributed")
BLOCK_ROWS = 8
"""A day's batch (about 27 new customers per institution) is cut into several blocks."""
PARAMS = ExtraTreesParams(n_estimators=3, max_depth=4, random_state=4)


def _config(root: Path, tag: str, on_dask: bool):
    """Both institutions with their batch query; their registries and sinks of their own per `tag`.

    On Dask the training rows are the same table's as CSV files, which the agent reads itself (what is
    tested is the batch; the workers validating 25 blocks of training rows in every run would be slow).
    """
    sinks = {"north": {"sql": {**SQL, "table": f"north_scores_{tag}"}},
             "south": {"parquet": {"path": f"scores-{tag}"}}}
    compute = {"compute": {"dask": {"local": {"workers": 1}, "block_rows": BLOCK_ROWS}}} if on_dask else {}
    institutions = [{
        "name": name, "id_column": "patient_id", "label": "class", "contract": "contract.yaml",
        "data": {"csv": {"path": f"{name}.csv"}} if on_dask else {"sql": {**SQL, "table": name}},
        "registry": f"registry-{tag}/{name}",
        "predictions": sinks[name], **compute,
        "predict_data": {"sql": {**SQL, "query": BATCH.format(name=name), "since": START.isoformat()}},
    } for name in NAMES]
    raw = {"federation": "waveform", "setting": "horizontal", "consortium_key": {"env": "UNUSED"},
           "master": {"public_key": str(master_public_key(root))}, "institutions": institutions}
    return parse_config(raw, root / "federation.yaml")


def _registered(config, root: Path) -> ModelRegistry:
    """Train in process once; store v0001 at both institutions (registry-local); the master's registry."""
    session = horizontal_session_from_config(config, PARAMS)
    session.agree_schema()
    session.train()
    registry = ModelRegistry(root / "master", signing_key=master_key(root))
    version = registry.register("waveform", {"parties": session.manifest_entries()["parties"]},
                                session.master_tables())
    session.store_at_institutions("waveform", version, registry.read_manifest("waveform", version))
    session.close()
    return ModelRegistry(root / "master", public_key=master_public_key(root))


def _run(config, master: ModelRegistry, run: str, days: int, cluster: Cluster | None) -> dict:
    """One batch-predict flow run: a new session loads v0001 and predicts the batch up to DAYS[0] + days."""
    session = horizontal_session_from_config(config, PARAMS, cluster)
    try:
        session.load_model(master, "waveform", "v0001")
        return session.predict_locally(run, DAYS[0] + timedelta(days=days))
    finally:
        session.close()


def _schedule(config, master: ModelRegistry, database: str, postgres, tag: str,
              cluster: Cluster | None) -> list[dict]:
    """The delivered runs' replies: test_batches' schedule, on the sinks of `tag`.

    Two days, a third whose delivery fails at north, its retry, a late retry of the second, a quiet day.
    """
    replies = [_run(config, master, "run-1", 0, cluster), _run(config, master, "run-2", 1, cluster)]
    name, table = database.rsplit("/", 1)[1], f"north_scores_{tag}"
    postgres.execute(f"ALTER TABLE {table} RENAME TO {table}_saved", name)
    postgres.execute(f"CREATE TABLE {table} (x int)", name)  # another table took its name
    with pytest.raises(DataWriteError, match="^institution 'north': cannot write predictions to table "):
        _run(config, master, "run-3", 2, cluster)
    postgres.execute(f"DROP TABLE {table}", name)
    postgres.execute(f"ALTER TABLE {table}_saved RENAME TO {table}", name)
    replies += [_run(config, master, "run-3", 2, cluster), _run(config, master, "run-2", 1, cluster),
                _run(config, master, "run-4", 3, cluster)]
    return replies


def _delivered(database: str, root: Path, tag: str) -> dict[str, pd.DataFrame]:
    """Each institution's delivered rows in run and ID order, without the delivery time."""
    north = read_sql(SqlSource(("url", database), table=f"north_scores_{tag}"), "test")
    south = ds.dataset(root / f"scores-{tag}", format="parquet", partitioning="hive").to_table().to_pandas()
    return {name: rows.drop(columns="predicted_at").sort_values(["run_id", "patient_id"], ignore_index=True)
            for name, rows in (("north", north), ("south", south))}


@pytest.mark.slow  # twelve prediction sessions (about 40 s)
def test_workers_predict_each_scheduled_batch_block_by_block_as_the_in_process_agent(
        database, postgres, tmp_path, monkeypatch, workers, caplog) -> None:
    monkeypatch.setenv("FED_DB_URL", database)
    news = _write_rows(database, tmp_path)
    local = _config(tmp_path, "local", False)
    master = _registered(local, tmp_path)
    shutil.copytree(tmp_path / "registry-local", tmp_path / "registry-dask")  # the same stored version
    for name in NAMES:
        rows = read_sql(SqlSource(("url", database), table=name), "test")
        rows.to_csv(tmp_path / f"{name}.csv", index=False)
    expected = _schedule(local, master, database, postgres, "local", None)

    whole_read = read_sql

    def refuse_batch_reads(source: SqlSource, *args, **kwargs):  # the agent reads training rows only
        if source.parameters:
            raise AssertionError("the agent read a batch itself")
        return whole_read(source, *args, **kwargs)

    monkeypatch.setattr("fedcore.data.sql.read_sql", refuse_batch_reads)
    with caplog.at_level(logging.INFO, logger="fedcore.horizontal.agent"):
        on_dask = _schedule(_config(tmp_path, "dask", True), master, database, postgres, "dask", workers)
    parts = [int(m[1]) for m in re.finditer(r"the Dask workers predicted \d+ rows in (\d+) parts",
                                             caplog.text)]
    assert len(parts) == 2 * 5 and max(parts) > 2, "five delivered runs of both, in several blocks"

    assert [r["counts"] for r in on_dask] == [r["counts"] for r in expected]
    assert [r["counts"] for r in on_dask][-1] == {"north": 0, "south": 0}, "nobody signed up on day four"
    rows, delivered = _delivered(database, tmp_path, "local"), _delivered(database, tmp_path, "dask")
    for name in NAMES:
        pd.testing.assert_frame_equal(delivered[name], rows[name], check_exact=True)
        by_run = delivered[name].groupby("run_id")["patient_id"].apply(list).to_dict()
        assert by_run == {f"run-{i + 1}": _signed_up(news[name], START if i == 0 else DAYS[i - 1], DAYS[i])
                          for i in range(3)}, "each customer once"
    local_files = sorted(p.relative_to(tmp_path / "scores-local")
                         for p in (tmp_path / "scores-local").rglob("*.parquet"))
    assert sorted(p.relative_to(tmp_path / "scores-dask")
                  for p in (tmp_path / "scores-dask").rglob("*.parquet")) == local_files
    assert len(local_files) == 3, "one file per run, retries replaced"
    for name in NAMES:
        ledger = (tmp_path / f"registry-dask/{name}" / LEDGER).read_bytes()
        assert ledger == (tmp_path / f"registry-local/{name}" / LEDGER).read_bytes()
        assert DAYS[2].isoformat(timespec="microseconds").encode() in ledger


def test_a_bound_window_is_cut_into_blocks_of_its_own_rows(database) -> None:
    """The count, the cuts and each block's read all bind the run's window: only its rows, in ID order."""
    from fedcore.compute.dask_table import open_sql
    from fedcore.data.sql import read_range

    frame = pd.DataFrame({"id": range(30), "t": pd.date_range(START, periods=30, freq="h", tz="UTC")})
    load_table(database, "new_rows", frame.sample(frac=1.0, random_state=1))
    source = SqlSource(("url", database), query="SELECT * FROM new_rows WHERE t > :since AND t <= :until",
                       parameters=("since", "until"))
    window = {"since": START, "until": START + timedelta(hours=20)}
    table = open_sql(source, "test", "id", BLOCK_ROWS, values=window)
    assert [b.n_rows for b in table.blocks] == [8, 8, 4], "rows 1 to 20 of the window"
    read = pd.concat([read_range(b.sql, "test") for b in table.blocks], ignore_index=True)
    pd.testing.assert_frame_equal(read, frame.iloc[1:21].reset_index(drop=True), check_exact=True)
