"""Each demo has its own folder, and `retrain`/`predict` record runs in the demo's Prefect home.

That is the home the demo points the UI at (the federation's `.prefect`), unless the user chose a home or a
server.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fedcore.cli import main
from flows.commands.demo import demo_folder
from flows.commands.environment import use_federation_prefect_home


def test_every_demo_has_its_own_folder():
    folders = {demo_folder("vertical", "forest"), demo_folder("vertical", "boosting"),
               demo_folder("horizontal", "extra-trees"), demo_folder("horizontal", "ppd-ert"),
               demo_folder("horizontal", "boosting")}
    assert folders == {Path("work/demo"), Path("work/demo-boosting"), Path("work/demo-horizontal"),
                       Path("work/demo-ppd-ert"), Path("work/demo-horizontal-boosting")}


@pytest.fixture
def clean_env(monkeypatch):
    for key in ("PREFECT_HOME", "PREFECT_API_URL"):
        monkeypatch.delenv(key, raising=False)
    yield monkeypatch
    os.environ.pop("PREFECT_HOME", None)  # set by the code under test, not through monkeypatch


def test_runs_go_to_the_federations_prefect_home(tmp_path, clean_env, capsys):
    config = tmp_path / "federation.yaml"
    assert use_federation_prefect_home(config) is None  # no .prefect there: Prefect's default
    (tmp_path / ".prefect").mkdir()
    assert use_federation_prefect_home(config) == tmp_path / ".prefect"
    assert os.environ["PREFECT_HOME"] == str(tmp_path / ".prefect")
    assert "recording runs in" in capsys.readouterr().err


@pytest.mark.parametrize("chosen", ["PREFECT_HOME", "PREFECT_API_URL"])
def test_a_home_or_server_the_user_chose_wins(tmp_path, clean_env, chosen):
    (tmp_path / ".prefect").mkdir()
    clean_env.setenv(chosen, "/elsewhere" if chosen == "PREFECT_HOME" else "http://server:4200/api")
    assert use_federation_prefect_home(tmp_path / "federation.yaml") is None
    assert os.environ.get("PREFECT_HOME") in (None, "/elsewhere")


def test_retrain_uses_it(tmp_path, clean_env, monkeypatch):
    import flows.retrain

    seen = []
    monkeypatch.setattr(flows.retrain, "retrain",
                        lambda *a, **k: seen.append(os.environ.get("PREFECT_HOME")) or {})
    (tmp_path / ".prefect").mkdir()
    assert main(["retrain", "--config", str(tmp_path / "federation.yaml")]) == 0
    assert seen == [str(tmp_path / ".prefect")]


@pytest.mark.parametrize("command", ["retrain", "predict"])
def test_retrain_and_predict_print_where_the_predictions_went(tmp_path, clean_env, monkeypatch, capsys,
                                                              command):
    import flows.batch_predict
    import flows.retrain

    path = "/srv/bank/predictions/bank/m-v0001-20261127T101500Z.parquet"
    prediction = {"requester": "bank", "rows": 600, "counts": {"bank": 700}, "paths": {"bank": path}}
    summary = {"model": "m", "version": "v0001", "prediction": prediction}
    monkeypatch.setattr(flows.retrain if command == "retrain" else flows.batch_predict,
                        "retrain" if command == "retrain" else "batch_predict", lambda *a, **k: summary)
    assert main([command, "--config", str(tmp_path / "federation.yaml")]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["prediction"]["paths"] == {"bank": path}
    assert err.splitlines()[-1] == f"fedforest: 600 predictions of m v0001 written at bank to {path}"
