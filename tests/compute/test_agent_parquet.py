"""An agent on Dask with Parquet data holds only metadata, and answers as the in-process agent (issue #29).

North's table is two Parquet files of two row groups each, cut into blocks of 50 rows (one row group cut
in two). The same files, read by the in-process agent and by the agent whose workers read them, give the
same validation report, the same forest, the same held-out evaluation and the same predictions.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcore.agents.data import institution_from_config
from fedcore.agents.scoring import exact_parts, exact_value, merge_statistics
from fedcore.compute import dask_table
from fedcore.compute.blocks import Block
from fedcore.compute.cluster import Cluster
from fedcore.compute.dask_table import holdout_masks, open_parquet
from fedcore.config import parse_config
from fedcore.contracts.model import dump_contract, infer_contract
from fedcore.data.datasets import make_waveform
from fedcore.data.split import split_horizontal
from fedcore.errors import DataReadError, DataWriteError, InputError
from fedcore.horizontal.agent import HorizontalInstitutionAgent
from fedcore.horizontal.params import ExtraTreesParams
from tests.compute.federation import predict_local, refuse_readers, run_north, same_outcome
from tests.compute.workers import worker_processes
from tests.horizontal.test_session import _agents, _session
from tests.keys import master_public_key

ROWS_PER_FILE, GROUP_ROWS, BLOCK_ROWS = 100, 60, 50


def _table(task: str) -> pd.DataFrame:
    frame = make_waveform(600, random_state=3)
    if task == "classification":
        frame["class"] = frame["class"].map({0: "a", 1: "b", 2: "c"})
    else:  # a float target from the features (the label column keeps the name the helpers use)
        noise = np.random.default_rng(1).normal(0, 0.1, len(frame))
        frame["class"] = frame["x5"] * 2.0 - frame["x10"] + noise
    # a categorical column: each row group stores its own dictionary, the whole file another
    frame["region"] = pd.Categorical(np.random.default_rng(0).choice(["x", "y", "z"], len(frame)))
    frame.insert(0, "patient_id", [f"P{i:05d}" for i in range(len(frame))])
    return frame


def _write(frame: pd.DataFrame, folder: Path, plain: bool = False, statistics: bool = True) -> None:
    """`frame` as Parquet files of ROWS_PER_FILE rows, row groups of GROUP_ROWS (`plain`: no pandas meta)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    for i, start in enumerate(range(0, len(frame), ROWS_PER_FILE)):
        part = pa.Table.from_pandas(frame.iloc[start:start + ROWS_PER_FILE], preserve_index=False)
        pq.write_table(part.replace_schema_metadata(None) if plain else part, folder / f"part-{i}.parquet",
                       row_group_size=GROUP_ROWS, write_statistics=statistics)


def _config(root: Path, north: pd.DataFrame, new: pd.DataFrame, contract, on_dask: bool,
            data: str | None = None, predict_data: str | None = None, setting: str = "horizontal",
            predictions: object = None):
    """A config whose institution north reads `data` (default: its Parquet files, written once).

    `setting` vertical: north holds the label, south does not. `predictions`: north's `predictions:` entry
    (default: a folder per `on_dask`).
    """
    (root / "north.yaml").write_text(dump_contract(contract))
    data = data or str(root / "north" / "*.parquet")
    if not (root / "north").exists():
        _write(north, root / "north")
        _write(new, root / "new")
    compute = {"compute": {"dask": {"local": {"workers": 1}, "block_rows": BLOCK_ROWS}}} if on_dask else {}
    raw = {"federation": "f", "setting": setting, "consortium_key": {"env": "UNUSED"},
           "master": {"public_key": str(master_public_key(root))}, "training": {"holdout": 0.25},
           "institutions": [
               {"name": "north", "data": data,
                "predict_data": predict_data or str(root / "new" / "*.parquet"),
                "id_column": "patient_id", "label": "class", "contract": str(root / "north.yaml"),
                "registry": str(root / f"registry-{on_dask}"),
                "predictions": predictions or str(root / f"predictions-{on_dask}"), **compute},
               {"name": "south", "data": "unused.parquet", "id_column": "patient_id",
                **({"label": "class"} if setting == "horizontal" else {})}]}
    return parse_config(raw, root / "federation.yaml")


def _north_and_new(table: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    north = split_horizontal(table, 3, seed=1)[0].reset_index(drop=True)  # north's part, as `_agents` cuts it
    new = north.sample(frac=0.6, random_state=2).drop(columns=["class"]).reset_index(drop=True)
    return north, new


@pytest.mark.parametrize("task", ["classification", "regression"])
@pytest.mark.slow  # 11-16 s on 2 cores: an end-to-end run, in CI's slow pass (make test-slow)
def test_an_agent_whose_workers_read_its_parquet_answers_as_the_in_process_agent(tmp_path, three_workers,
                                                                                  monkeypatch, task) -> None:
    table = _table(task)
    contract = infer_contract(table, "waveform", id_column="patient_id", label="class")
    north, new = _north_and_new(table)
    results = {}
    for on_dask in (False, True):
        config = _config(tmp_path, north, new, contract, on_dask)
        if on_dask:  # the agent process never reads rows: every pandas reader fails here
            refuse_readers(monkeypatch)
        data = _load(config, three_workers, on_dask)
        monkeypatch.undo()
        assert data.valid and data.n_rows == len(north)
        if on_dask:
            assert len(data.frame) == 0 and list(data.frame.columns) == list(north.columns)
            assert data.table is not None and len(data.table.files) == 2 and len(data.table.blocks) == 6
            assert data.load_batch is None and data.open_batch is not None
        params = (ExtraTreesParams(n_estimators=12, max_depth=8, random_state=4, task=task,
                                   criterion="squared_error") if task == "regression" else None)
        results[on_dask] = run_north(data, table, tmp_path / f"run-{on_dask}", contract, params,
                                     monkeypatch if on_dask else None)
    expected, got = results.values()
    same_outcome(got, expected)
    rows = got.agents["north"].party.rows
    assert type(rows).__name__ == "DaskPartyRows" and len(rows.blocks) == 6
    reply, dask_reply, written = expected.reply, got.reply, expected.written
    folder = Path(dask_reply.header["path"])
    assert folder.is_dir() and folder.parent == tmp_path / "predictions-True"
    assert folder.name.startswith("unregistered-") and folder.suffix == ".parquet"
    parts = sorted(folder.iterdir())
    assert [p.name for p in parts] == [f"part-{i:05d}.parquet" for i in range(len(parts))] and len(parts) == 4
    pd.testing.assert_frame_equal(pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True), written)
    assert dask_reply.header["rows"] == reply.header["rows"] == len(new)
    assert list(written["patient_id"]) == list(new["patient_id"])


def _load(config, client, on_dask: bool):
    """North's data from `config`, its blocks on `client`'s workers when `on_dask`."""
    return institution_from_config(config, "north", cluster=Cluster(client, []) if on_dask else None)


@pytest.mark.parametrize("setting", ["horizontal", "vertical"])
def test_a_table_that_breaks_its_contract_gets_the_in_process_report(tmp_path, three_workers,
                                                                      setting) -> None:
    table = _table("classification")
    contract = infer_contract(table, "waveform", id_column="patient_id", label="class")
    north, new = _north_and_new(table)
    north.loc[5, "patient_id"] = north.loc[150, "patient_id"]  # the same ID in two files
    north.loc[[7, 8], "class"] = "z"
    north.loc[[9, 120], "x1"] = np.nan
    north.loc[170, "x2"] = 1e6
    north["visits"] = pd.array(np.arange(len(north)), dtype="Int64")  # an extra column, nullable integers
    north.loc[130, "visits"] = pd.NA
    north["count"] = np.arange(len(north))  # an extra int column
    reports = []
    for on_dask in (False, True):
        config = _config(tmp_path, north, new, contract, on_dask, setting=setting)
        data = _load(config, three_workers, on_dask)
        assert (data.table is not None) == on_dask
        reports.append(data.validation)
    assert not reports[0].success and len(reports[0].failures) == 5
    assert reports[1].failure_lines() == reports[0].failure_lines()
    fields = ("expectation", "column", "success", "unexpected_count", "found", "expected")
    assert ([{k: r[k] for k in fields} for r in reports[1].rows]
            == [{k: r[k] for k in fields} for r in reports[0].rows])


@pytest.mark.parametrize("statistics", [True, False], ids=["from the statistics", "counted by the workers"])
def test_an_integer_column_with_a_null_in_one_block_has_the_whole_tables_dtype(
        tmp_path, three_workers, monkeypatch, statistics) -> None:
    table = _table("classification")
    north, new = _north_and_new(table)
    north["visits"] = np.arange(len(north))
    contract = infer_contract(north, "waveform", id_column="patient_id", label="class")  # visits: int
    north["visits"] = pd.array(north["visits"], dtype="Int64")
    north.loc[10, "visits"] = pd.NA  # Arrow int64 with one null, no pandas metadata: read as float64 in
    _write(north, tmp_path / "north", plain=True, statistics=statistics)  # the first file, int64 in the
    # second (float64 together)
    _write(new, tmp_path / "new")
    settled = []  # what the statistics settled (None: the workers counted)
    monkeypatch.setattr(dask_table, "_metadata_nulls", lambda *args, nulls=dask_table._metadata_nulls:
                        settled.append(nulls(*args)) or settled[-1])
    reports = []
    for on_dask in (False, True):
        config = _config(tmp_path, north, new, contract, on_dask)
        data = _load(config, three_workers, on_dask)
        reports.append(data.validation)
        if on_dask:
            assert data.table.casts == {"visits": "float64"}
            assert settled == ([{"visits": 1}] if statistics else [None])
    visits = [r for r in reports[0].rows if r["column"] == "visits"]
    assert [r["found"] for r in visits] == ["", "1 null value", "found dtype float64",
                                            "not checked: the column has the wrong dtype"]
    assert reports[1].rows == reports[0].rows


def test_infinities_are_refused_in_the_in_process_words(tmp_path, three_workers) -> None:
    table = _table("classification")
    contract = infer_contract(table, "waveform", id_column="patient_id", label="class")
    north, new = _north_and_new(table)
    north.loc[[3, 160], "x4"] = [np.inf, -np.inf]  # one in each file
    errors = []
    for on_dask in (False, True):
        config = _config(tmp_path, north, new, contract, on_dask)
        with pytest.raises(InputError) as refused:
            _load(config, three_workers, on_dask)
        errors.append(str(refused.value))
    assert errors[1] == errors[0] == ("institution 'north' column 'x4' holds 2 infinite values (inf or "
                                      "-inf): replace them with missing values, which every engine handles, "
                                      "or with finite numbers")


def test_parquet_files_of_different_schemas_are_refused_on_dask(tmp_path) -> None:
    pd.DataFrame({"id": ["a"], "x": [1.0]}).to_parquet(tmp_path / "a.parquet")
    pd.DataFrame({"id": ["b"], "x": [1]}).to_parquet(tmp_path / "b.parquet")
    files = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    with pytest.raises(DataReadError) as refused:
        open_parquet(files, "institution 'north'")
    assert str(refused.value) == (f"institution 'north': on a Dask cluster every Parquet file must have the "
                                  f"schema of '{files[0]}'; '{files[1]}' has another (columns or types): "
                                  "rewrite it with the same columns and types, or remove compute: dask")


def test_the_holdout_stream_is_the_same_drawn_at_once_or_block_by_block() -> None:
    blocks = [Block(i, 0, n) for i, n in enumerate([7, 1, 64, 33, 0, 250])]
    whole = np.random.default_rng(np.random.SeedSequence(5, spawn_key=(9,))).random(355) < 0.3
    pieces = holdout_masks(np.random.default_rng(np.random.SeedSequence(5, spawn_key=(9,))), blocks, 0.3)
    drawn = np.concatenate([np.unpackbits(p, count=b.n_rows).astype(bool) for p, b in zip(pieces, blocks,
                                                                                              strict=True)])
    assert np.array_equal(drawn, whole) and 0 < whole.sum() < 355


def test_regression_sums_are_exact_whatever_the_blocks() -> None:
    rng = np.random.default_rng(4)
    values = np.concatenate([rng.normal(0, 1e8, 500), rng.normal(0, 1e-8, 500), [1e300, -1e300, 5e-324]])
    rng.shuffle(values)
    for cuts in ([], [1], [10, 500, 501], list(range(50, 1003, 50))):
        parts = [{"sums": exact_parts(piece[:, None])} for piece in np.split(values, cuts)]
        total = exact_value(merge_statistics(parts)["sums"][0])
        assert total == math.fsum(values)  # the correctly rounded sum, for every cut
    assert exact_value(exact_parts(np.zeros((0, 1)))[0]) == 0.0
    with pytest.raises(InputError, match=re.escape("held-out statistics: a value is not finite")):
        exact_parts(np.array([[np.nan]]))


def test_csv_data_stays_in_the_agent_process_and_says_so(tmp_path, three_workers, caplog) -> None:
    table = _table("classification")
    contract = infer_contract(table, "waveform", id_column="patient_id", label="class")
    north, new = _north_and_new(table)
    (tmp_path / "csv").mkdir()
    north.to_csv(tmp_path / "csv" / "north.csv", index=False)
    config = _config(tmp_path, north, new, contract, on_dask=True, data=str(tmp_path / "csv" / "*.csv"))
    with caplog.at_level("INFO", logger="fedcore.agents.data"):
        data = _load(config, three_workers, on_dask=True)
    assert data.table is None and len(data.frame) == len(north) and data.open_batch is not None
    assert (f"institution 'north': '{tmp_path}/csv/*.csv' is not all Parquet, so the agent reads it in its "
            "own process (compute: dask reads Parquet and databases on the workers)") in caplog.messages


def test_an_agent_server_keeps_one_cluster_across_sessions_and_closes_it_when_it_stops(tmp_path) -> None:
    """Two sessions of a served agent share the LocalCluster it started; stopping leaves no worker behind."""
    import threading

    from fedcore.agents.serve import build_institution_server, serve_until_session_closed
    from fedcore.protocol.messages import Message
    from fedcore.transport.flight import FlightTransport
    from fedcore.transport.tls import init_ca, issue_certificate

    pki = tmp_path / "pki"
    init_ca(pki)
    for name, role in (("master", "master"), ("north", "institution")):
        issue_certificate(pki, name, pki, role=role)
    _write(_north_and_new(_table("classification"))[0], tmp_path / "north")
    local = {"dask": {"local": {"workers": 1}, "block_rows": BLOCK_ROWS}}  # a worker process (a nanny's)
    raw = {"federation": "f", "setting": "horizontal", "consortium_key": {"env": "UNUSED"},
           "tls": {"ca": str(pki / "ca.pem")},
           "institutions": [
               {"name": "north", "data": str(tmp_path / "north" / "*.parquet"), "id_column": "patient_id",
                "label": "class", "compute": local, "endpoint": "grpc+tls://127.0.0.1:0",
                "cert": str(pki / "north.pem"), "key": str(pki / "north.key")},
               {"name": "south", "data": "unused.parquet", "id_column": "patient_id", "label": "class"}]}
    config = parse_config(raw, tmp_path / "federation.yaml")
    children, threads = worker_processes(), set(threading.enumerate())
    server = build_institution_server(config, "north")
    serving = threading.Thread(target=serve_until_session_closed, args=(server, 60))
    serving.start()
    clusters = []
    with FlightTransport({"north": f"grpc+tls://127.0.0.1:{server.port}"}, tls_cert=pki / "master.pem",
                         tls_key=pki / "master.key", ca_cert=pki / "ca.pem") as transport:
        transport.wait_ready(timeout_s=10)
        for _ in range(2):  # two sessions: each reloads the data (a session start)
            transport.exchange({"north": Message("validation_report")})
            clusters.append(server.party.data.cluster)
        started = worker_processes() - children
        transport.exchange({"north": Message("close")})
    serving.join(timeout=30)
    assert not serving.is_alive() and server.party.sessions == 2
    assert clusters[0] is clusters[1] and started  # one cluster, with its worker process
    assert clusters[0].client.status == "closed"
    assert not worker_processes() - children  # its worker processes are gone
    assert not [t.name for t in threading.enumerate() if t not in threads and t.is_alive()]


def test_a_vertical_agent_on_dask_reads_its_parquet_metadata_only(tmp_path, three_workers,
                                                                  monkeypatch) -> None:
    """A vertical party's workers read its Parquet table (`tests/compute/test_vertical_parquet.py`).

    And its new batches (`tests/compute/test_vertical_predict.py`): the agent only opens them.
    """
    north = _north_and_new(_table("classification"))[0]
    _write(north, tmp_path / "north")
    local = {"dask": {"local": {"workers": 1}, "block_rows": BLOCK_ROWS}}
    raw = {"federation": "f", "setting": "vertical", "consortium_key": {"env": "UNUSED"},
           "institutions": [
               {"name": "north", "data": str(tmp_path / "north" / "*.parquet"), "id_column": "patient_id",
                "label": "class", "compute": local,
                "predict_data": str(tmp_path / "not-yet" / "*.parquet")},  # a batch that arrives later
               {"name": "south", "data": "unused.parquet", "id_column": "patient_id"}]}
    config = parse_config(raw, tmp_path / "federation.yaml")
    refuse_readers(monkeypatch)
    data = _load(config, three_workers, on_dask=True)
    monkeypatch.undo()
    assert data.table is not None and data.open_batch is not None and data.load_batch is None
    assert data.n_rows == len(north) and len(data.table.blocks) == 6
    assert len(data.frame) == 0 and list(data.frame.columns) == list(north.columns)


def test_a_parquet_batch_that_has_not_arrived_yet_does_not_stop_the_agent_loading(tmp_path,
                                                                                  three_workers) -> None:
    table = _table("classification")
    contract = infer_contract(table, "waveform", id_column="patient_id", label="class")
    north, new = _north_and_new(table)
    config = _config(tmp_path, north, new, contract, on_dask=True,
                     predict_data=str(tmp_path / "later" / "*.parquet"))
    data = _load(config, three_workers, on_dask=True)
    assert data.table is not None and data.open_batch is not None
    with pytest.raises(DataReadError, match=re.escape(
            f"institution 'north' prediction data: no file matches '{tmp_path}/later/*.parquet'")):
        data.open_batch()


def test_prediction_parts_the_agent_does_not_see_are_refused_and_leave_no_folder(tmp_path, three_workers
                                                                                 ) -> None:
    """A worker writing where the agent does not look (block 1's part gone from its view): no dataset."""
    from distributed import WorkerPlugin

    table = _table("classification")
    contract = infer_contract(table, "waveform", id_column="patient_id", label="class")
    north, new = _north_and_new(table)
    config = _config(tmp_path, north, new, contract, on_dask=True)
    agents = _agents(table, tmp_path / "run", contract)
    agents["north"] = HorizontalInstitutionAgent(_load(config, three_workers, on_dask=True),
                                                 identity=agents["north"].identity)
    session = _session(agents)
    session.params = ExtraTreesParams(n_estimators=2, max_depth=3, random_state=4)  # any model will do
    session.agree_schema()
    session.train()
    predictions = tmp_path / "predictions-True"

    class OtherDisk(WorkerPlugin):
        name = "other-disk"

        def transition(self, key, start, finish, **kwargs) -> None:
            if finish == "memory" and "_predict_block" in str(key):
                for part in predictions.glob("*/part-00001.parquet"):
                    part.unlink()

    three_workers.register_plugin(OtherDisk())
    try:
        with pytest.raises(DataWriteError) as refused:
            agents["north"].handle(predict_local())
    finally:
        three_workers.unregister_worker_plugin("other-disk")
        session.close()
    folder = re.escape(str(predictions)) + r"/\.unregistered-[^/']+\.parquet\.tmp"
    assert re.fullmatch(re.escape("institution 'north': the Dask workers wrote 3 of 4 prediction parts into ")
                        + f"'{folder}'" + re.escape(" as this agent sees it: the workers must see the "
                                                    "institution's predictions folder at the same path (a "
                                                    "shared file system)"), str(refused.value))
    assert list(predictions.iterdir()) == []  # neither the parts nor a renamed folder


def test_dates_read_by_the_workers_train_and_predict_as_the_in_process_agents(tmp_path,
                                                                              three_workers) -> None:
    from fedcore.data.columns import convert_dates

    table = _table("classification")[["patient_id", "x5", "x6", "x7", "region", "class"]]
    days = pd.Timestamp("2016-01-01") + pd.to_timedelta(np.arange(len(table)) * 7 % 3000, unit="D")
    table["opened"] = [None if i % 13 == 0 else d.date() for i, d in enumerate(days)]  # a Parquet date
    table["seen"] = (days + pd.Timedelta(hours=9)).tz_localize("Europe/Berlin")  # a timestamp with a zone
    contract = infer_contract(table, "waveform", id_column="patient_id", label="class")
    north, new = _north_and_new(table)
    others = convert_dates(table, dates=contract.date_columns)[0]  # south and east: simulate's numbers
    results = {}
    for on_dask in (False, True):
        data = _load(_config(tmp_path, north, new, contract, on_dask), three_workers, on_dask)
        assert data.valid and data.dates == ("opened", "seen")
        assert (data.table.dates if on_dask else data.frame["opened"].dtype) == (("opened", "seen") if on_dask
                                                                                else np.float64)
        results[on_dask] = run_north(data, others, tmp_path / f"run-{on_dask}", contract)
    same_outcome(results[True], results[False])


def test_a_table_whose_dates_break_its_contract_gets_the_in_process_report(tmp_path, three_workers) -> None:
    table = _table("classification")[["patient_id", "x5", "class"]]
    days = pd.Timestamp("2016-01-01") + pd.to_timedelta(np.arange(len(table)) % 2000, unit="D")
    table["opened"] = [d.date() for d in days]  # a Parquet date
    table["due"] = [d.date().isoformat() for d in days]  # ISO strings in Parquet
    contract = infer_contract(table, "waveform", id_column="patient_id", label="class")
    north, new = _north_and_new(table)
    north.loc[[10, 160], "opened"] = [pd.Timestamp("2031-05-06").date(), pd.Timestamp("2001-01-01").date()]
    north.loc[[20, 130, 170], "due"] = ["2021-02-30", "soon", "2021-02-03T10:00"]
    reports = []
    for on_dask in (False, True):
        data = _load(_config(tmp_path, north, new, contract, on_dask), three_workers, on_dask)
        assert data.dates == ("opened", "due") and (data.table is None or data.table.dates == ())
        reports.append(data.validation)
    assert reports[0].failure_lines() == [
        "institution 'north', column 'opened': expect_column_values_to_be_between(min '2016-01-01', max "
        "'2017-12-31') failed: 2 unexpected values",
        "institution 'north', column 'due': expect_column_values_to_be_in_type_list(dtype date) failed: 3 "
        "values that are not a valid date"]
    fields = ("expectation", "column", "success", "unexpected_count", "found", "expected")
    assert ([{k: r[k] for k in fields} for r in reports[1].rows]
            == [{k: r[k] for k in fields} for r in reports[0].rows])


def test_without_a_contract_the_workers_find_the_date_columns_the_whole_table_holds(tmp_path,
                                                                                   three_workers) -> None:
    """Blocks report their evidence; the columns converted are `guess_date_columns` of the whole table."""
    from fedcore.compute.dask_table import guess_block_dates, profile
    from fedcore.data.columns import guess_date_columns

    table = _table("classification")[["patient_id", "x5", "region", "class"]]
    days = pd.Timestamp("2016-01-01") + pd.to_timedelta(np.arange(len(table)) % 900, unit="D")
    table["opened"] = [None if i % 7 == 0 else d.date() for i, d in enumerate(days)]  # a Parquet date
    table["due"] = [d.date().isoformat() for d in days]  # ISO strings
    table["note"] = table["due"]
    table.loc[590, "note"] = "soon"  # ISO strings but one, in the last file only
    table["seen"] = days.tz_localize("UTC")  # a timestamp
    _write(table, tmp_path / "dated")
    opened = profile(three_workers, open_parquet(sorted(str(p) for p in (tmp_path / "dated").iterdir()),
                                                 "test", BLOCK_ROWS))
    whole = pd.read_parquet(tmp_path / "dated")
    keep = ["patient_id", "class"]
    assert guess_date_columns(whole, keep) == ["opened", "due", "seen"]
    assert guess_block_dates(three_workers, opened, keep) == ("opened", "due", "seen")
