"""A Parquet dataset folder or URL read by the Dask workers, file by file, as in process (issue #30).

North's table is a Hive-partitioned dataset (`site=<name>/tier=<n>/`, one tier `__HIVE_DEFAULT_PARTITION__`,
so the int partition column holds nulls), with a hidden folder and a `_SUCCESS` marker the readers skip.
The agent lists it and reads its files' metadata; each worker opens its own file and appends the partition
values. The folder and the same dataset as a file:// URL give the in-process agent's forest, evaluation and
predictions exactly, on one worker and on three, in both settings.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcore.compute.cluster import Cluster, DaskCompute
from fedcore.compute.dask_table import ParquetTable, open_dataset, profile, read_table_block, submit_blocks
from fedcore.contracts.model import infer_contract
from fedcore.data.io import read_dataset
from fedcore.errors import DataReadError
from fedcore.horizontal.params import ExtraTreesParams
from tests.compute.federation import refuse_readers, run_north, same_outcome
from tests.compute.test_agent_parquet import _config, _load, _north_and_new, _table
from tests.compute.test_vertical_predict import _predict
from tests.compute.test_vertical_predict import scenario as scenario  # noqa: F401  # the module fixture
from tests.vertical.test_session import _agents as vertical_agents

GROUP_ROWS, BLOCK_ROWS = 20, 15
VERTICAL_GROUP_ROWS, VERTICAL_BLOCK_ROWS = 60, 45
"""The vertical federation's row groups and blocks: blocks still cut inside row groups and files, but a third
as many Dask tasks per level as blocks of 15 (600 rows per institution: 47 s of CPU at 15, issue #34)."""


def _with_partitions(frame: pd.DataFrame, seed: int, prefix: str = "") -> pd.DataFrame:
    """`frame` with a string `<prefix>site` and a float `<prefix>tier` (a third missing) to partition by."""
    rng = np.random.default_rng(seed)
    frame = frame.copy()
    frame[f"{prefix}site"] = rng.choice(["lyon", "bern"], len(frame))
    frame[f"{prefix}tier"] = np.where(rng.random(len(frame)) < 0.3, np.nan, rng.integers(1, 3, len(frame)))
    return frame


def _write_hive(frame: pd.DataFrame, root: Path, prefix: str = "", group_rows: int = GROUP_ROWS) -> None:
    """`frame` as a dataset partitioned by `_with_partitions`' columns (missing: the Hive default)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    by = [f"{prefix}site", f"{prefix}tier"]
    for (site, tier), rows in frame.groupby(by, sort=True, dropna=False):
        value = "__HIVE_DEFAULT_PARTITION__" if pd.isna(tier) else int(tier)
        folder = root / f"{by[0]}={site}" / f"{by[1]}={value}"
        folder.mkdir(parents=True)
        table = pa.Table.from_pandas(rows.drop(columns=by), preserve_index=False)
        pq.write_table(table, folder / "part-0.parquet", row_group_size=group_rows)
    (root / ".writing").mkdir()  # a writer's unfinished file and a done marker: never read
    (root / ".writing" / "part-0.parquet").write_bytes(b"not parquet")
    (root / "_SUCCESS").write_text("")


def _locations(folder: Path) -> dict[str, str]:
    return {"folder": str(folder), "url": folder.as_uri()}


def _gathered(client, table: ParquetTable) -> pd.DataFrame:
    """Every block's rows as its worker reads them, in block order (to compare; the agent never does)."""
    return pd.concat(client.gather(submit_blocks(client, read_table_block, table)), ignore_index=True)


@pytest.mark.slow  # a whole horizontal federation on Dask twice, 68 s on two quiet cores: in test-slow
@pytest.mark.parametrize("location, workers", [("folder", "one_worker"), ("url", "three_workers")])
def test_a_horizontal_agent_on_a_dataset_folder_or_url_answers_as_the_in_process_agent(
        tmp_path, location, workers, request, monkeypatch) -> None:
    client = request.getfixturevalue(workers)
    table = _with_partitions(_table("classification"), seed=5)
    north, new = _north_and_new(table)
    _write_hive(north, tmp_path / "north-lake")
    _write_hive(new, tmp_path / "new-lake")
    whole = read_dataset(str(tmp_path / "north-lake"))
    assert whole["tier"].isna().any() and whole["tier"].dtype == np.float64 and len(whole) == len(north)
    contract = infer_contract(table, "waveform", id_column="patient_id", label="class")
    results = {}
    for on_dask in (False, True):
        root = tmp_path / f"dask-{on_dask}"
        root.mkdir()
        where = location if on_dask else "folder"
        config = _config(root, north, new, contract, on_dask, data=_locations(tmp_path / "north-lake")[where],
                         predict_data=_locations(tmp_path / "new-lake")[where])
        if on_dask:
            refuse_readers(monkeypatch)  # read_files, which reads a dataset whole in process, among them
        data = _load(config, client, on_dask)
        monkeypatch.undo()
        assert data.valid and data.n_rows == len(north)
        if on_dask:
            assert len(data.frame) == 0 and list(data.frame.columns) == list(whole.columns)
            assert len(data.table.files) == 6 and len(data.table.blocks) > len(data.table.files)
            assert data.table.casts == {"tier": "float64"}  # nulls counted from the partition values
            pd.testing.assert_frame_equal(_gathered(client, data.table), whole, check_exact=True)
        else:
            pd.testing.assert_frame_equal(data.frame, whole, check_exact=True)
        params = ExtraTreesParams(n_estimators=4, max_depth=6, random_state=4)
        results[on_dask] = run_north(data, table, root / "run", contract, params,
                                     monkeypatch if on_dask else None)
        assert {"site", "tier"} <= set(results[on_dask].columns)
    same_outcome(results[True], results[False])
    written = results[False].written
    assert len(written) == len(new)


@pytest.mark.parametrize("location, workers", [
    ("folder", "one_worker"),
    pytest.param("url", "three_workers", marks=pytest.mark.slow),  # end to end again, 25-36 s: in test-slow
])
def test_vertical_agents_on_dataset_folders_or_urls_answer_as_in_process(scenario, tmp_path,  # noqa: F811
                                                                         location, workers, request,
                                                                         monkeypatch) -> None:
    """Every institution's training table and new batch is a partitioned dataset (prediction included)."""
    client = request.getfixturevalue(workers)
    lakes = {}
    for index, (name, files) in enumerate(scenario["institutions"].items()):
        for part in ("train", "new"):
            folder = tmp_path / "lake" / name / part
            _write_hive(_with_partitions(pd.read_parquet(files[part]), index, f"{name}_"), folder, f"{name}_",
                        VERTICAL_GROUP_ROWS)
            lakes[name, part] = _locations(folder)[location]
    local = vertical_agents(scenario, tmp_path / "local")
    for name, agent in local.items():  # the in-process agents read the same datasets whole
        agent.data.frame = read_dataset(lakes[name, "train"])
        agent.data.load_batch = lambda where=lakes[name, "new"]: read_dataset(where)
    expected = _predict(local, scenario)
    agents = vertical_agents(scenario, tmp_path / "dask", new_batch=False)
    for name, agent in agents.items():
        what = f"institution {name!r}"
        table = profile(client, open_dataset(lakes[name, "train"], what, VERTICAL_BLOCK_ROWS),
                        [scenario["id_column"]])
        pd.testing.assert_frame_equal(_gathered(client, table), local[name].data.frame, check_exact=True)
        agent.data.frame = pd.DataFrame(columns=list(table.columns))
        agent.data.table, agent.data.cluster = table, Cluster(client, [])
        agent.data.compute = DaskCompute(block_rows=VERTICAL_BLOCK_ROWS)
        agent.data.open_batch = lambda where=lakes[name, "new"], what=what: profile(
            client, open_dataset(where, f"{what} prediction data", VERTICAL_BLOCK_ROWS),
            [scenario["id_column"]])
        assert {f"{name}_site", f"{name}_tier"} <= set(table.columns)
        # several blocks per file, some starting inside a row group: what the block size must still give
        assert len(table.blocks) > len({b.path for b in table.blocks})
        assert any(b.group_start > 0 for b in table.blocks)
    got = _predict(agents, scenario, monkeypatch)
    assert got[0] == expected[0]
    pd.testing.assert_frame_equal(got[1], expected[1], check_exact=True)
    for g, e in zip(got[2], expected[2], strict=True):
        assert g.tobytes() == e.tobytes()
    assert got[3] == expected[3]
    for agent in agents.values():
        assert type(agent.party.rows).__name__ == "DaskVerticalRows"


def test_dataset_blocks_travel_to_worker_processes_and_read_the_same_rows(tmp_path) -> None:
    """A block carries its file system and typed partition values through pickling (process workers)."""
    import pickle

    from fedcore.compute.blocks import read_block

    frame = _with_partitions(_table("classification").iloc[:120], seed=2)
    _write_hive(frame, tmp_path / "lake")
    loose = frame.iloc[:4].drop(columns=["site", "tier"])  # outside the partition folders: nulls there
    loose.to_parquet(tmp_path / "lake" / "a-loose.parquet", index=False)
    table = open_dataset((tmp_path / "lake").as_uri(), "institution 'north'", BLOCK_ROWS)
    paths = [b.path for b in table.blocks]
    assert paths == sorted(paths) and len(set(paths)) == 7 and not any(".writing" in p for p in paths)
    assert [(name, value.as_py()) for name, value in table.blocks[0].partition] == [("site", None),
                                                                                    ("tier", None)]
    assert any(b.group_start == BLOCK_ROWS for b in table.blocks)  # row groups of 20 cut at 15 rows
    for block in table.blocks:
        travelled = pickle.loads(pickle.dumps(block))
        assert travelled.partition == block.partition and travelled.filesystem.equals(block.filesystem)
        pd.testing.assert_frame_equal(read_block(travelled, list(table.columns)),
                                      read_block(block, list(table.columns)), check_exact=True)
    parts = pd.concat([read_block(b, list(table.columns)) for b in table.blocks], ignore_index=True)
    pd.testing.assert_frame_equal(parts, read_dataset(str(tmp_path / "lake")), check_dtype=False,
                                  check_exact=True)  # before the whole table's casts (`profile`)


def test_a_folder_without_partitions_has_no_partition_columns(tmp_path) -> None:
    """A dataset without partitions gets none (pyarrow gives its partitioning the whole schema)."""
    from fedcore.compute.blocks import parquet_blocks, read_block

    (tmp_path / "flat").mkdir()
    frame = _table("classification").iloc[:30]
    frame.to_parquet(tmp_path / "flat" / "part-0.parquet", index=False)
    blocks = parquet_blocks(tmp_path / "flat", BLOCK_ROWS)
    assert [b.partition for b in blocks] == [(), ()]
    pd.testing.assert_frame_equal(pd.concat([read_block(b, list(frame.columns)) for b in blocks],
                                            ignore_index=True), read_dataset(str(tmp_path / "flat")))


def test_dataset_files_of_different_schemas_are_refused_on_dask(tmp_path) -> None:
    for region, x in (("a", [1.0]), ("b", [1])):
        folder = tmp_path / "lake" / f"region={region}"
        folder.mkdir(parents=True)
        pd.DataFrame({"id": [region], "x": x}).to_parquet(folder / "p.parquet", index=False)
    with pytest.raises(DataReadError) as refused:
        open_dataset(str(tmp_path / "lake"), "institution 'north'")
    first, other = (str(tmp_path / "lake" / f"region={r}" / "p.parquet") for r in "ab")
    assert str(refused.value) == (f"institution 'north': on a Dask cluster every Parquet file must have the "
                                  f"schema of {first!r}; {other!r} has another (columns or types): rewrite "
                                  "it with the same columns and types, or remove compute: dask")
