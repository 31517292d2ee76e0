"""The retrain and batch-predict flows with the bank's rows, new batch and predictions in PostgreSQL.

Local agents over Flight with mutual TLS under a Prefect test server: the flow run's id reaches the bank's
scores table, one copy of each run's rows; the bank's batch query selects its customers by signup time up
to the flow's `until` (default: the run's scheduled time).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fedcore.data.sql import SqlSource, read_sql
from tests.federations import Federation, copy_of, small_federation
from tests.postgres import load_table

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
SQL = {"url": {"env": "BANK_DB_URL"}}


def _bank_in_postgres(database: str, tmp_path, monkeypatch, twin: Path | None = None) -> tuple:
    """A small federation whose bank's rows, batch and scores are PostgreSQL tables.

    Returns the config's path and the customers of the batch who signed up in June. With `twin`, a copy of
    the federation as it was before, its bank reading the same rows from Parquet (the same consortium key,
    so the same aligned order), is left in that folder.
    """
    monkeypatch.setenv("BANK_DB_URL", database)
    config_path, scenario = small_federation(tmp_path / "work", 600, seed=4,
                                             params={"n_estimators": 4, "max_depth": 4})
    if twin is not None:
        copy_of(Federation(tmp_path / "work", config_path, scenario), twin)
    for kind in ("train", "new"):
        rows = pd.read_parquet(scenario["institutions"]["bank"][kind])
        categories = [c for c in rows.columns if isinstance(rows[c].dtype, pd.CategoricalDtype)]
        rows = rows.astype(dict.fromkeys(categories, "str"))
        if kind == "new":  # every other customer signed up in June, the others in November
            rows["signup_at"] = [pd.Timestamp(f"2026-{6 if i % 2 else 11}-15", tz="UTC")
                                 for i in range(len(rows))]
            june = set(rows.loc[rows["signup_at"].dt.month == 6, "customer_id"])
        load_table(database, f"bank_{kind}", rows)
    raw = yaml.safe_load(config_path.read_text())
    bank = next(i for i in raw["institutions"] if i["name"] == "bank")
    bank.update(data={"sql": {**SQL, "table": "bank_train"}},
                predict_data={"sql": {**SQL, "since": "2026-01-01T00:00:00Z", "query": (
                    "SELECT * FROM bank_new WHERE signup_at > :since AND signup_at <= :until")}},
                predictions={"sql": {**SQL, "table": "bank_scores"}})
    config_path.write_text(yaml.safe_dump(raw))
    return config_path, june


def test_retrain_and_batch_predict_read_and_write_the_banks_database(database, tmp_path, monkeypatch) -> None:
    from flows.batch_predict import batch_predict
    from flows.retrain import retrain

    config_path, june = _bank_in_postgres(database, tmp_path, monkeypatch, twin=tmp_path / "twin")
    trained = retrain(str(config_path), agents="local", return_state=True)
    result = trained.result()
    assert result["prediction"]["paths"] == {"bank": "table 'bank_scores'"}
    # the batch up to July: nothing of it was delivered before July, so it starts at sql.since
    predicted = batch_predict(str(config_path), agents="local", until=datetime(2026, 7, 1, tzinfo=UTC),
                              return_state=True)
    assert predicted.result()["prediction"]["paths"] == {"bank": "table 'bank_scores'"}
    scores = read_sql(SqlSource(("url", database), table="bank_scores"), "test")
    runs = {str(trained.state_details.flow_run_id): result["prediction"]["rows"],
            str(predicted.state_details.flow_run_id): predicted.result()["prediction"]["rows"]}
    assert scores.groupby("run_id").size().to_dict() == runs
    retrained = set(scores.loc[scores["run_id"] == str(trained.state_details.flow_run_id), "customer_id"])
    assert set(scores.loc[scores["run_id"] == str(predicted.state_details.flow_run_id), "customer_id"]) == (
        retrained & june) and retrained - june, "retrain predicted up to its schedule (now), predict to July"
    assert set(scores["version"]) == {"v0001"} and not (tmp_path / "work" / "predictions" / "bank").exists()

    # the same rows from Parquet (the federation before its bank moved to PostgreSQL) train the same model
    retrain(str(tmp_path / "twin" / "federation.yaml"), agents="local", predict=False)
    assert _model_digests(tmp_path / "twin") == _model_digests(tmp_path / "work")


def _model_digests(work) -> dict[str, str]:
    """The signed SHA-256 of each party's model table in the master's v0001 manifest of `work`."""
    from fedcore.models.registry import ModelRegistry

    registry = ModelRegistry(work / "registry" / "master", public_key=work / "keys" / "master.key.pub")
    manifest = registry.read_manifest("retail-response", "v0001")
    return {party["name"]: party["table_sha256"] for party in manifest["parties"]}


def test_a_retried_batch_predict_run_leaves_exactly_its_new_rows_once(postgres, database, tmp_path,
                                                                     monkeypatch) -> None:
    """A run that fails after the bank delivered is retried by Prefect, its batch changed in between.

    The outcome line raises once, after a June customer of the batch moved to November and a November one
    to June; the retry is the same flow run, which predicts the changed batch, and the sink replaces the
    run's rows instead of keeping the first attempt's beside them: exactly the new batch, once.
    """
    import flows.batch_predict as module
    from flows.retrain import retrain

    config_path, june = _bank_in_postgres(database, tmp_path, monkeypatch)
    retrain(str(config_path), agents="local")
    sink = SqlSource(("url", database), table="bank_scores")
    aligned = set(read_sql(sink, "test")["customer_id"])  # the retrain's batch: every new row up to now
    june &= aligned  # the customers the others also hold, whom a batch predicts
    gone, late = min(june), min(aligned - june)
    attempts: list[pd.DataFrame] = []
    outcome = module.predict_outcome

    def fails_once(*args, **kwargs):
        if not attempts:
            attempts.append(read_sql(sink, "test"))
            name = database.rsplit("/", 1)[1]
            for customer, month in ((gone, 11), (late, 6)):
                postgres.execute(f"UPDATE bank_new SET signup_at = '2026-{month:02d}-15T00:00:00Z' WHERE "
                                 f"customer_id = '{customer}'", name)
            raise RuntimeError("the run is lost after the bank delivered its predictions")
        return outcome(*args, **kwargs)

    monkeypatch.setattr(module, "predict_outcome", fails_once)
    state = module.batch_predict.with_options(retries=1)(
        str(config_path), agents="local", until=datetime(2026, 7, 1, tzinfo=UTC), return_state=True)
    assert attempts and state.is_completed()
    run = str(state.state_details.flow_run_id)
    first = attempts[0].loc[attempts[0]["run_id"] == run, "customer_id"]
    assert sorted(first) == sorted(june), "the first attempt delivered the batch as it was"
    delivered = read_sql(sink, "test").loc[lambda rows: rows["run_id"] == run, "customer_id"]
    assert sorted(delivered) == sorted(june - {gone} | {late})
    assert len(delivered) == state.result()["prediction"]["rows"]
