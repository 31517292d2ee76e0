"""Scheduled prediction batches selected by a query's `:since`/`:until`, against a real PostgreSQL server.

Two horizontal institutions keep new customers in a table with a signup time; each scheduled run (its
`until`) predicts only the customers since the last batch the institution delivered, into a database table
(north) or a Parquet dataset partitioned by model and version (south). A failed delivery does not advance
the batch, so its retry delivers those customers once; a retried run reads the rows of its own schedule
and replaces its own predictions, even when they changed in between. Another model predicting with the
same query has batches of its own.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest

from fedcore.agents.batches import LEDGER
from fedcore.config import parse_config
from fedcore.contracts.model import dump_contract, infer_contract
from fedcore.data.datasets import make_waveform
from fedcore.data.split import split_horizontal
from fedcore.data.sql import SqlSource, read_sql
from fedcore.errors import ConfigError, DataWriteError, ProtocolError
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.session import HorizontalSession
from fedcore.models.registry import ModelRegistry
from tests.federations import horizontal_session_from_config
from tests.keys import master_key, master_public_key
from tests.postgres import load_table

NAMES = ("north", "south")
SQL = {"url": {"env": "FED_DB_URL"}}
START = datetime(2026, 11, 1, tzinfo=UTC)
DAYS = [START + timedelta(days=d) for d in (1, 2, 3)]
"""The scheduled times of three daily runs: each predicts the customers who signed up the day before."""
BATCH = "SELECT * FROM {name}_new WHERE signup_at > :since AND signup_at <= :until ORDER BY patient_id"


def _write_rows(database: str, root: Path) -> dict[str, pd.DataFrame]:
    """Training tables, and new customers with a signup time over three days; one shared contract."""
    table = make_waveform(400, random_state=3)[["x5", "x7", "x11", "x15", "class"]]  # few columns: quick
    table["class"] = table["class"].map({0: "a", 1: "b", 2: "c"})
    table.insert(0, "patient_id", [f"P{i:05d}" for i in range(len(table))])
    contract = infer_contract(table, "waveform", "patient_id", "class")
    (root / "contract.yaml").write_text(dump_contract(contract))
    news = {}
    for name, part in zip(NAMES, split_horizontal(table, 2, seed=1), strict=True):
        load_table(database, name, part.reset_index(drop=True))
        new = part.sample(frac=0.4, random_state=2).drop(columns=["class"]).reset_index(drop=True)
        seconds = np.random.default_rng(5).integers(1, 3 * 86400, len(new))  # (START, DAYS[-1]]
        new["signup_at"] = pd.Timestamp(START) + pd.to_timedelta(seconds, unit="s")
        load_table(database, f"{name}_new", new)
        news[name] = new
    return news


def _config(root: Path, query: str = BATCH):
    sinks = {"north": {"sql": {**SQL, "table": "north_scores"}}, "south": {"parquet": {"path": "scores"}}}
    institutions = [{
        "name": name, "id_column": "patient_id", "label": "class", "contract": "contract.yaml",
        "data": {"sql": {**SQL, "table": name}}, "registry": f"registry/{name}", "predictions": sinks[name],
        "predict_data": {"sql": {**SQL, "query": query.format(name=name), "since": START.isoformat()}},
    } for name in NAMES]
    raw = {"federation": "waveform", "setting": "horizontal", "consortium_key": {"env": "UNUSED"},
           "master": {"public_key": str(master_public_key(root))}, "institutions": institutions}
    return parse_config(raw, root / "federation.yaml")


def _session(config) -> HorizontalSession:
    return horizontal_session_from_config(
        config, ExtraTreesParams(n_estimators=3, max_depth=4, random_state=4))


def _registered(config, root: Path, models: tuple[str, ...] = ("waveform",)) -> ModelRegistry:
    """Train once; store it as v0001 of each of `models` everywhere; the master's registry (runs load it)."""
    session = _session(config)
    session.agree_schema()
    session.train()
    registry = ModelRegistry(root / "registry" / "master", signing_key=master_key(root))
    for model in models:
        version = registry.register(model, {"parties": session.manifest_entries()["parties"]},
                                    session.master_tables())
        session.store_at_institutions(model, version, registry.read_manifest(model, version))
    return ModelRegistry(root / "registry" / "master", public_key=master_public_key(root))


def _scheduled_run(config, master: ModelRegistry, run: str, until: datetime, model: str = "waveform") -> dict:
    """One batch-predict flow run: a new session loads the version and predicts the batch up to `until`."""
    session = _session(config)
    session.load_model(master, model, "v0001")
    return session.predict_locally(run, until)


def _delivered(database: str, root: Path) -> dict[str, pd.DataFrame]:
    """Each institution's delivered predictions: its table, its dataset (model and version partitions)."""
    north = read_sql(SqlSource(("url", database), table="north_scores"), "test")
    south = ds.dataset(root / "scores", format="parquet", partitioning="hive").to_table().to_pandas()
    return {"north": north, "south": south}


def _signed_up(new: pd.DataFrame, since: datetime, until: datetime) -> list[str]:
    mask = (new["signup_at"] > since) & (new["signup_at"] <= until)
    return sorted(new.loc[mask, "patient_id"])


@pytest.mark.postgres
@pytest.mark.slow  # 11-16 s on 2 cores: an end-to-end run, in CI's slow pass (make test-slow)
def test_scheduled_runs_predict_only_the_new_customers_once_even_after_a_failed_delivery(
        database, postgres, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FED_DB_URL", database)
    news = _write_rows(database, tmp_path)
    config = _config(tmp_path)
    master = _registered(config, tmp_path, ("waveform", "upsell"))
    first = _scheduled_run(config, master, "run-1", DAYS[0])
    second = _scheduled_run(config, master, "run-2", DAYS[1])
    delivered = _delivered(database, tmp_path)
    for name in NAMES:
        by_run = delivered[name].groupby("run_id")["patient_id"].apply(sorted).to_dict()
        assert by_run == {"run-1": _signed_up(news[name], START, DAYS[0]),
                          "run-2": _signed_up(news[name], DAYS[0], DAYS[1])}
        assert first["counts"][name] == len(by_run["run-1"])
        assert second["counts"][name] == len(by_run["run-2"])
    assert set(delivered["south"]["model"]) == {"waveform"}
    assert set(delivered["south"]["version"]) == {"v0001"}
    assert [p.name for p in (tmp_path / "scores").iterdir()] == ["model=waveform"]

    # the third run fails at north's table (another table took its name): north's batch does not advance
    name = database.rsplit("/", 1)[1]
    postgres.execute("ALTER TABLE north_scores RENAME TO north_saved", name)
    postgres.execute("CREATE TABLE north_scores (x int)", name)
    with pytest.raises(DataWriteError, match="^institution 'north': cannot write predictions to table "):
        _scheduled_run(config, master, "run-3", DAYS[2])
    ledger = tmp_path / "registry" / "north" / LEDGER
    assert DAYS[2].isoformat(timespec="microseconds") not in ledger.read_text()
    postgres.execute("DROP TABLE north_scores", name)
    postgres.execute("ALTER TABLE north_saved RENAME TO north_scores", name)
    third = _scheduled_run(config, master, "run-3", DAYS[2])  # Prefect's retry: same run, same schedule
    again = _scheduled_run(config, master, "run-2", DAYS[1])  # and a late retry of the second run
    assert again["counts"] == second["counts"], "a retried run reads the rows of its own schedule"
    delivered = _delivered(database, tmp_path)
    for name in NAMES:
        by_run = delivered[name].groupby("run_id")["patient_id"].apply(sorted).to_dict()
        assert by_run == {"run-1": _signed_up(news[name], START, DAYS[0]),
                          "run-2": _signed_up(news[name], DAYS[0], DAYS[1]),
                          "run-3": _signed_up(news[name], DAYS[1], DAYS[2])}, "each customer once"
        assert third["counts"][name] == len(by_run["run-3"]) > 0
    assert len(list((tmp_path / "scores").rglob("*.parquet"))) == 3, "one file per run, retries replaced"
    quiet = _scheduled_run(config, master, "run-4", DAYS[2] + timedelta(days=1))  # nobody signed up
    assert quiet["counts"] == {"north": 0, "south": 0}
    assert {name: len(rows) for name, rows in _delivered(database, tmp_path).items()} == {
        name: sum(run["counts"][name] for run in (first, second, third)) for name in NAMES}
    assert not list((tmp_path / "scores").glob(".tmp-*")), "no temporary folder left"
    # another model predicting with the same query keeps batches of its own: its first from sql.since
    upsell = _scheduled_run(config, master, "run-5", DAYS[1], model="upsell")
    assert upsell["counts"] == {name: len(_signed_up(news[name], START, DAYS[1])) for name in NAMES}


@pytest.mark.postgres
@pytest.mark.slow  # an end-to-end run like the one above
def test_a_retried_run_whose_batch_changed_leaves_exactly_its_new_rows_once(
        database, postgres, tmp_path, monkeypatch) -> None:
    """Between a run's delivery and its retry, a customer of its batch left and a late one arrived.

    The retry (same run id, same schedule) reads the changed batch: each sink then holds exactly the rows
    a fresh run over the changed batch delivers (the same digest), once, and the other run's rows stay.
    """
    monkeypatch.setenv("FED_DB_URL", database)
    news = _write_rows(database, tmp_path)
    config = _config(tmp_path)
    master = _registered(config, tmp_path)
    _scheduled_run(config, master, "run-1", DAYS[0])
    _scheduled_run(config, master, "run-2", DAYS[1])
    first = {name: set(rows.loc[rows["run_id"] == "run-2", "batch_sha256"])
             for name, rows in _delivered(database, tmp_path).items()}
    batch, db = {}, database.rsplit("/", 1)[1]
    for name in NAMES:
        window = _signed_up(news[name], DAYS[0], DAYS[1])
        late = _signed_up(news[name], DAYS[1], DAYS[2])[0]
        postgres.execute(f"DELETE FROM {name}_new WHERE patient_id = '{window[0]}'", db)
        postgres.execute(f"UPDATE {name}_new SET signup_at = '{DAYS[1].isoformat()}' WHERE patient_id = "
                         f"'{late}'", db)
        batch[name] = sorted({*window[1:], late})
    again = _scheduled_run(config, master, "run-2", DAYS[1])  # Prefect's retry: same run, same schedule
    fresh = _scheduled_run(config, master, "run-9", DAYS[1])  # a new run over the same changed batch
    assert again["counts"] == fresh["counts"] == {name: len(batch[name]) for name in NAMES}
    for name, rows in _delivered(database, tmp_path).items():
        by_run = rows.groupby("run_id")["patient_id"].apply(sorted).to_dict()
        assert by_run == {"run-1": _signed_up(news[name], START, DAYS[0]), "run-2": batch[name],
                          "run-9": batch[name]}, "the retry's new rows, once"
        digests = rows.groupby("run_id")["batch_sha256"].apply(set).to_dict()
        assert digests["run-2"] == digests["run-9"] and digests["run-2"].isdisjoint(first[name])
    assert len(list((tmp_path / "scores").rglob("*.parquet"))) == 3, "one file per run"


def test_an_unknown_placeholder_is_one_line_naming_it(tmp_path) -> None:
    query = "SELECT * FROM {name}_new WHERE signup_at > :since AND region = :region"
    with pytest.raises(ConfigError) as refused:
        _config(tmp_path, query)
    assert str(refused.value) == (
        f"{tmp_path / 'federation.yaml'}: institution 'north': predict_data: sql.query has an unknown "
        "placeholder :region; known: :since, :until")


def test_placeholders_are_only_outside_quotes_and_casts_and_bound_in_order(tmp_path) -> None:
    query = ("SELECT x::float8, ':label' AS \":name\" FROM {name}_new WHERE t <= :until AND t > :since "
             "AND u <= :until")
    source = _config(tmp_path, query).institution("north").predict_data
    assert isinstance(source, SqlSource) and source.parameters == ("until", "since")
    assert source.select() == ("SELECT x::float8, ':label' AS \":name\" FROM north_new WHERE t <= $1 AND "
                               "t > $2 AND u <= $1")
    assert source.bound({"since": START, "until": DAYS[0]}) == (DAYS[0], START)
    typed = SqlSource(("url", "postgresql://db"), query="SELECT :x")  # `simulate --query`: runs as written
    assert typed.select() == "SELECT :x"


def test_training_data_takes_no_placeholder_and_since_needs_its_default(tmp_path) -> None:
    raw = {"federation": "f", "setting": "horizontal", "consortium_key": {"env": "UNUSED"},
           "institutions": [{"name": "north", "id_column": "id", "label": "y",
                             "data": {"sql": {**SQL, "query": "SELECT * FROM t WHERE t > :since"}}}]}
    with pytest.raises(ConfigError, match=r"data: sql.query has an unknown placeholder :since; known: none "):
        parse_config(raw, tmp_path / "federation.yaml")
    raw["institutions"][0].update(data="t.parquet", predict_data={"sql": {**SQL, "query": "SELECT :since"}})
    with pytest.raises(ConfigError) as refused:
        parse_config(raw, tmp_path / "federation.yaml")
    assert str(refused.value).endswith("predict_data: sql.query uses :since, so set sql.since, the start of "
                                       "the first batch (e.g. since: '2026-01-01T00:00:00Z')")


def test_a_master_sending_no_timestamp_as_until_is_refused(tmp_path) -> None:
    from fedcore.agents.batches import requested_until

    assert requested_until("north", {"until": "2026-11-02T00:00:00+01:00"}) == datetime(2026, 11, 1, 23,
                                                                                         tzinfo=UTC)
    for value in ("2026-11-02T00:00:00", "'; DROP TABLE x; --", 17):
        with pytest.raises(ProtocolError, match="^institution 'north': until .* is not a timestamp with a "
                                                r"time zone \(ISO 8601\)$"):
            requested_until("north", {"until": value})
