"""What the Prefect UI shows of a run.

The final messages (pure functions) and the agent's log lines forwarded to its run logger, also from the
Flight server's threads.
"""

from __future__ import annotations

import logging
import threading

import pytest

from fedcore import agents
from flows import agent as agent_flow
from flows.ui import headline_metric, predict_outcome, prediction_files, retrain_outcome

METRICS = {"accuracy": 0.75333, "f1_macro": 0.7457}


def test_retrain_outcome_names_version_metric_production_and_promotion() -> None:
    production = {"version": "v0002", "metrics": {"accuracy": 0.748}}
    assert retrain_outcome("retail", "v0003", METRICS, "accuracy", True, production) == (
        "retail v0003: accuracy 0.7533 on held-out rows (production v0002: 0.7480); promoted to production")
    assert retrain_outcome("retail", "v0003", METRICS, "f1_macro", False, production) == (
        "retail v0003: f1_macro 0.7457 on held-out rows; NOT promoted, production unchanged")
    assert retrain_outcome("retail", "v0001", METRICS, "accuracy", True, None) == (
        "retail v0001: accuracy 0.7533 on held-out rows; promoted to production")


def test_headline_metric_falls_back_to_the_first_metric() -> None:
    assert headline_metric({"rmse": 1.25, "r2": 0.5}, "r2") == "r2 0.5000"
    assert headline_metric({"rmse": 1.25, "r2": 0.5}, "accuracy") == "rmse 1.2500"
    assert headline_metric({}, "accuracy") == "no metrics"


def test_predict_outcome_in_both_settings() -> None:
    assert (predict_outcome("m", "v0002", {"requester": "bank", "rows": 600})
            == "m v0002: 600 rows predicted for bank")
    assert predict_outcome("m", "v0002", {"rows": 30, "counts": {"a": 10, "b": 20}}) == (
        "m v0002: 30 rows predicted locally (a 10, b 20)")


def test_predict_outcome_and_the_cli_lines_say_where_each_institution_wrote_its_predictions() -> None:
    vertical = {"requester": "bank", "rows": 600, "counts": {"bank": 700, "shop": 650},
                "paths": {"bank": "/srv/bank/predictions/m-v0002-20261127T101500Z.parquet"}}
    assert predict_outcome("m", "v0002", vertical) == (
        "m v0002: 600 rows predicted for bank, written at bank to "
        "/srv/bank/predictions/m-v0002-20261127T101500Z.parquet")
    assert prediction_files({"model": "m", "version": "v0002", "prediction": vertical}) == [
        "fedforest: 600 predictions of m v0002 written at bank to "
        "/srv/bank/predictions/m-v0002-20261127T101500Z.parquet"]
    horizontal = {"rows": 30, "counts": {"a": 10, "b": 20}, "paths": {"a": "pa.parquet", "b": "pb.parquet"}}
    assert predict_outcome("m", "v0002", horizontal) == (
        "m v0002: 30 rows predicted locally (a 10, b 20), written at a to pa.parquet, at b to pb.parquet")
    assert prediction_files({"model": "m", "version": "v0002", "prediction": horizontal}) == [
        "fedforest: 10 predictions of m v0002 written at a to pa.parquet",
        "fedforest: 20 predictions of m v0002 written at b to pb.parquet"]
    assert prediction_files({"model": "m", "version": "v0002", "prediction": None}) == []  # --no-predict


def test_agent_log_reaches_the_run_logger_from_any_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    received: list[tuple[int, str]] = []

    class RunLogger(logging.LoggerAdapter):
        def log(self, level, msg, *args, **kwargs) -> None:
            received.append((level, msg % args if args else msg))

    monkeypatch.setattr(agent_flow, "get_run_logger", lambda: RunLogger(logging.getLogger("run"), {}))
    level = agents.log.level
    with agent_flow.agent_log_in_run():
        worker = threading.Thread(target=agents.log.info, args=("%s: stored %s %s", "bank", "m", "v0003"))
        worker.start()
        worker.join()
        agents.log.debug("not for the operator")
    agents.log.info("after the run: not forwarded")
    assert received == [(logging.INFO, "bank: stored m v0003")]
    assert agents.log.level == level and not any(
        isinstance(h, agent_flow._ToRunLogger) for h in agents.log.handlers)


def test_run_name_reads_the_model_from_the_parameters_or_the_config(monkeypatch, tmp_path) -> None:
    from types import SimpleNamespace

    from flows import ui
    from tests.federations import small_federation

    config_path, _ = small_federation(tmp_path / "federation", 100, seed=0, params={"n_estimators": 2})
    monkeypatch.setattr(ui, "flow_run", SimpleNamespace(parameters={"config_path": str(config_path)}))
    assert ui.run_name("retrain")() == "retrain retail-response"
    monkeypatch.setattr(ui, "flow_run",
                        SimpleNamespace(parameters={"config_path": str(tmp_path / "missing.yaml"),
                                                    "model_name": "churn", "version": "v0002"}))
    assert ui.run_name("predict")() == "predict churn v0002"
    monkeypatch.setattr(ui, "flow_run",
                        SimpleNamespace(parameters={"config_path": str(tmp_path / "missing.yaml")}))
    assert ui.run_name("retrain")() == "retrain"  # the flow itself then says what is wrong with the config
