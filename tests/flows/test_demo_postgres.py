"""`fedforest demo --source postgres`: the demo pipeline with its tables and predictions in PostgreSQL.

Without a database it says in one line how to start one; with the test server, the institutions' tables
are loaded there, `retrain` reads them and the bank's predictions land in its table, none in the workspace.
"""

from __future__ import annotations

import re

import pytest

from fedcore.cli import main
from fedcore.data.sql import SqlSource, read_sql
from flows.demos.postgres import DB_ENV, NO_DATABASE


def test_without_a_database_the_demo_says_how_to_start_one(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.delenv(DB_ENV, raising=False)
    assert main(["demo", "--source", "postgres", "--work", str(tmp_path / "demo")]) == 1
    assert capsys.readouterr().err == f"fedforest: error: {NO_DATABASE}\n"
    assert not (tmp_path / "demo").exists(), "refused before anything is written"
    assert main(["demo", "--source", "postgres", "--setting", "horizontal", "--database-url", "postgresql://x",
                 "--work", str(tmp_path / "demo")]) == 1
    assert capsys.readouterr().err == ("fedforest: error: fedforest demo --source postgres runs the vertical "
                                       "demo: leave out --setting horizontal\n")
    assert not (tmp_path / "demo").exists()


@pytest.mark.slow
@pytest.mark.postgres
def test_the_demo_runs_its_pipeline_on_postgresql(database, tmp_path, monkeypatch, capsys) -> None:
    import flows.demos.vertical as demo

    monkeypatch.delenv(DB_ENV, raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    monkeypatch.setattr(demo, "DEMO_PARAMS", {**demo.DEMO_PARAMS, "n_estimators": 6, "max_depth": 5})
    work = tmp_path / "demo"
    assert main(["demo", "--source", "postgres", "--database-url", database, "--work", str(work),
                 "--customers", "1200"]) == 0
    out = capsys.readouterr().out
    predicted = re.search(r"new batch: +(\d+) customers predicted, written only at bank: table "
                          r"'bank_predictions'", out)
    assert predicted is not None, out
    scores = read_sql(SqlSource(("url", database), table="bank_predictions"), "test")
    assert len(scores) == int(predicted[1]) > 0 and scores["customer_id"].is_unique
    assert set(scores["version"]) == {"v0001"} and scores["run_id"].nunique() == 1
    for name in ("bank", "ecommerce", "insurer"):
        rows = read_sql(SqlSource(("url", database), table=f"{name}_train"), "test")
        assert len(rows) > 0
    config = (work / "federation.yaml").read_text()
    assert config.count(f"env: {DB_ENV}") == 9 and database not in config, "the connection string stays out"
    assert not (work / "predictions").exists()
