"""Scheduled batches of a vertical federation's `:since`/`:until` query predicted by Dask workers (#30).

The three demo institutions keep their new customers in PostgreSQL with a signup time. The bank (label
holder, the requester) selects each scheduled batch with `:since`/`:until`; the others give every customer
up to `:until` (deployments/README.md: the batch advances at the institution that receives the
predictions, and the alignment picks the requester's rows). Two daily runs and a retry of the second, once
with the agents reading in process and once with `compute: dask` (the workers count, cut and read each
batch's blocks; the agents never read one): each run delivers only the customers who signed up in its
window (and are known to all three) into the bank's table, the retry replaces its own rows, the bank's
ledger advances, and the Dask runs deliver the in-process rows and ledger byte for byte.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from fedcore.agents.batches import LEDGER
from fedcore.compute.cluster import Cluster
from fedcore.config import parse_config
from fedcore.data.scenario import make_vertical_scenario
from fedcore.data.sql import SqlSource, read_sql
from fedcore.models.registry import ModelRegistry
from tests.federations import vertical_session_from_config
from tests.keys import master_key, master_public_key
from tests.postgres import load_table

pytestmark = pytest.mark.postgres
distributed = pytest.importorskip("distributed")
NAMES = ("bank", "ecommerce", "insurer")
SQL = {"url": {"env": "FED_DB_URL"}}
START = datetime(2026, 11, 1, tzinfo=UTC)
DAYS = [START + timedelta(days=1), START + timedelta(days=2)]
BATCH = "SELECT * FROM {name}_new WHERE signup_at > :since AND signup_at <= :until"
UP_TO = "SELECT * FROM {name}_new WHERE signup_at <= :until"
"""The passive institutions' batch: every customer they know by the run's scheduled time."""
BLOCK_ROWS = 16


def _write_rows(database: str, root: Path) -> dict[str, pd.DataFrame]:
    """Training rows as CSV files (read by the agents); new customers with a signup time in the database.

    A customer signed up once: the same time at every institution that knows them, over two days.
    """
    scenario = make_vertical_scenario(root / "scenario", n_customers=300, n_new=120, seed=3)
    new = {}
    for name, files in scenario["institutions"].items():
        pd.read_parquet(files["train"]).to_csv(root / f"{name}.csv", index=False)
        rows = pd.read_parquet(files["new"])
        categories = [c for c in rows.columns if isinstance(rows[c].dtype, pd.CategoricalDtype)]
        rows = rows.astype(dict.fromkeys(categories, "str"))
        number = rows["customer_id"].str[1:].astype(int).to_numpy()
        seconds = (number * 7919) % (2 * 86400) + 1  # in (START, DAYS[-1]], the same wherever they are
        rows["signup_at"] = pd.Timestamp(START) + pd.to_timedelta(seconds, unit="s")
        load_table(database, f"{name}_new", rows.sample(frac=1.0, random_state=5))
        new[name] = rows
    return new


def _config(root: Path, tag: str, on_dask: bool):
    """The demo federation with its batch queries; registries and the bank's table per `tag`."""
    compute = {"compute": {"dask": {"local": {"workers": 1}, "block_rows": BLOCK_ROWS}}} if on_dask else {}
    institutions = [{
        "name": name, "id_column": "customer_id", "registry": f"registry-{tag}/{name}",
        "data": {"csv": {"path": f"{name}.csv"}}, **compute,
        **({"label": "responded", "predictions": {"sql": {**SQL, "table": f"bank_scores_{tag}"}},
            "predict_data": {"sql": {**SQL, "query": BATCH.format(name=name), "since": START.isoformat()}}}
           if name == "bank" else {"predict_data": {"sql": {**SQL, "query": UP_TO.format(name=name)}}}),
    } for name in NAMES]
    raw = {"federation": "demo", "consortium_key": {"env": "UNUSED"},
           "master": {"public_key": str(master_public_key(root))}, "institutions": institutions}
    return parse_config(raw, root / "federation.yaml")


def _registered(config, root: Path) -> ModelRegistry:
    """Train in process once; store v0001 at every institution (registry-local); the master's registry."""
    session = vertical_session_from_config(config)
    session.align()
    session.train()
    registry = ModelRegistry(root / "master", signing_key=master_key(root))
    version = registry.register("demo", {"parties": session.manifest_entries()["parties"]},
                                session.master_tables())
    session.store_at_institutions("demo", version, registry.read_manifest("demo", version))
    return ModelRegistry(root / "master", public_key=master_public_key(root))


def _schedule(config, master: ModelRegistry, cluster: Cluster | None) -> list[dict]:
    """Two daily runs and a retry of the second, each a new session that loads v0001."""
    replies = []
    for run, until in (("run-1", DAYS[0]), ("run-2", DAYS[1]), ("run-2", DAYS[1])):
        session = vertical_session_from_config(config, cluster)
        session.load_model(master, "demo", "v0001")
        replies.append(session.batch_predict("bank", run_id=run, until=until))
    return replies


@pytest.mark.slow  # eight vertical sessions and a database (about 30 s)
def test_workers_predict_each_scheduled_vertical_batch_as_the_in_process_agents(
        database, tmp_path, monkeypatch, workers) -> None:
    monkeypatch.setenv("FED_DB_URL", database)
    new = _write_rows(database, tmp_path)
    master = _registered(_config(tmp_path, "local", False), tmp_path)
    shutil.copytree(tmp_path / "registry-local", tmp_path / "registry-dask")  # the same stored version
    expected = _schedule(_config(tmp_path, "local", False), master, None)

    whole_read = read_sql

    def refuse_batch_reads(source: SqlSource, *args, **kwargs):  # on Dask the agents read no batch
        if source.parameters:
            raise AssertionError("an agent read a batch itself")
        return whole_read(source, *args, **kwargs)

    monkeypatch.setattr("fedcore.data.sql.read_sql", refuse_batch_reads)
    on_dask = _schedule(_config(tmp_path, "dask", True), master, workers)
    monkeypatch.setattr("fedcore.data.sql.read_sql", whole_read)

    everywhere = set.intersection(*(set(rows["customer_id"]) for rows in new.values()))
    signup = new["bank"].set_index("customer_id")["signup_at"]
    windows = {"run-1": (START, DAYS[0]), "run-2": (DAYS[0], DAYS[1])}
    for tag, replies in (("local", expected), ("dask", on_dask)):
        assert [r["rows"] for r in replies] == [r["rows"] for r in expected]
        scores = read_sql(SqlSource(("url", database), table=f"bank_scores_{tag}"), "test")
        by_run = scores.groupby("run_id")["customer_id"].apply(sorted).to_dict()
        assert by_run == {run: sorted(c for c in everywhere if since < signup[c] <= until)
                          for run, (since, until) in windows.items()}, "each customer once, retry replaced"
        assert [r["rows"] for r in replies] == [len(by_run["run-1"]), len(by_run["run-2"]),
                                                len(by_run["run-2"])]
    columns = ["run_id", "customer_id"]
    delivered = [read_sql(SqlSource(("url", database), table=f"bank_scores_{tag}"), "test").drop(
        columns="predicted_at").sort_values(columns, ignore_index=True) for tag in ("local", "dask")]
    pd.testing.assert_frame_equal(delivered[1], delivered[0], check_exact=True)
    ledger = (tmp_path / "registry-dask/bank" / LEDGER).read_bytes()
    assert ledger == (tmp_path / "registry-local/bank" / LEDGER).read_bytes()
    assert DAYS[1].isoformat(timespec="microseconds").encode() in ledger, "the bank's batch advanced"
    assert not any((tmp_path / f"registry-{tag}/{name}" / LEDGER).exists()
                   for tag in ("local", "dask") for name in NAMES[1:]), "others read up to :until"
