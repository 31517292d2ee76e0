"""The retrain and batch-predict flows with the bank's rows, new batch and predictions in PostgreSQL.

Local agents over Flight with mutual TLS under a Prefect test server: the flow run's id reaches the bank's
scores table, one copy of each run's rows.
"""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from fedcore.data.sql import SqlSource, read_sql
from tests.federations import small_federation
from tests.postgres import load_table

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
SQL = {"url": {"env": "BANK_DB_URL"}}


def test_retrain_and_batch_predict_read_and_write_the_banks_database(database, tmp_path, monkeypatch) -> None:
    from flows.batch_predict import batch_predict
    from flows.retrain import retrain

    monkeypatch.setenv("BANK_DB_URL", database)
    config_path, scenario = small_federation(tmp_path / "work", 600, seed=4,
                                             params={"n_estimators": 4, "max_depth": 4})
    for kind in ("train", "new"):
        rows = pd.read_parquet(scenario["institutions"]["bank"][kind])
        categories = [c for c in rows.columns if isinstance(rows[c].dtype, pd.CategoricalDtype)]
        load_table(database, f"bank_{kind}", rows.astype(dict.fromkeys(categories, "str")))
    raw = yaml.safe_load(config_path.read_text())
    bank = next(i for i in raw["institutions"] if i["name"] == "bank")
    bank.update(data={"sql": {**SQL, "table": "bank_train"}},
                predict_data={"sql": {**SQL, "table": "bank_new"}},
                predictions={"sql": {**SQL, "table": "bank_scores"}})
    config_path.write_text(yaml.safe_dump(raw))

    trained = retrain(str(config_path), agents="local", return_state=True)
    result = trained.result()
    assert result["prediction"]["paths"] == {"bank": "table 'bank_scores'"}
    predicted = batch_predict(str(config_path), agents="local", return_state=True)
    assert predicted.result()["prediction"]["paths"] == {"bank": "table 'bank_scores'"}
    scores = read_sql(SqlSource(("url", database), table="bank_scores"), "test")
    runs = {str(trained.state_details.flow_run_id): result["prediction"]["rows"],
            str(predicted.state_details.flow_run_id): predicted.result()["prediction"]["rows"]}
    assert scores.groupby("run_id").size().to_dict() == runs
    assert set(scores["version"]) == {"v0001"} and not (tmp_path / "work" / "predictions" / "bank").exists()
