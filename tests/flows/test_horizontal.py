"""The retrain and batch-predict flows in the horizontal setting.

Three hospitals as local agents over Flight with mutual TLS under a Prefect test server.
"""

from __future__ import annotations

import re

import pandas as pd
import pytest
import yaml
from prefect.client.orchestration import get_client

from fedcore.drift import drift_note
from fedcore.errors import ContractMismatch
from fedcore.horizontal.model import HorizontalForest
from fedcore.models.registry import ModelRegistry
from flows.batch_predict import batch_predict
from flows.demos.horizontal import prepare_horizontal_workspace
from flows.retrain import retrain
from tests.prefect_reads import all_artifacts, all_logs

pytestmark = pytest.mark.slow
MODEL = "readmission"
HOSPITALS = ("riverside", "lakeside", "hillcrest")
SMALL = {"n_estimators": 8, "max_depth": 6, "random_state": 0}


def _registry(work, name: str = "master") -> ModelRegistry:
    """A registry of the demo federation in `work`, trusting the master's public key as institutions do."""
    return ModelRegistry(work / "registry" / name, public_key=work / "keys" / "master.key.pub")


def _workspace(work, algorithm: str, privacy=None):
    config_path, scenario = prepare_horizontal_workspace(work, n_patients=1500, seed=2, algorithm=algorithm,
                                                         privacy=privacy, params=SMALL)
    raw = yaml.safe_load(config_path.read_text())
    raw["training"]["connect_timeout_s"] = 90
    config_path.write_text(yaml.safe_dump(raw))
    return config_path, scenario


@pytest.fixture(scope="module")
def fet(tmp_path_factory):
    work = tmp_path_factory.mktemp("hospitals")
    config_path, scenario = _workspace(work, "extra-trees")
    return work, config_path, scenario, retrain(str(config_path), agents="local")


def _prediction(work, institution: str):
    """The one predictions file of v0001 an institution wrote (it names it `<model>-v0001-<UTC time>`)."""
    (path,) = (work / "predictions" / institution).glob(f"{MODEL}-v0001-*.parquet")
    return path


def test_every_hospital_stores_the_complete_model_and_predicts_at_home(fet) -> None:
    work, _, scenario, result = fet
    assert (result["version"], result["promoted"], result["privacy"]["mode"]) == ("v0001", True, "none")
    assert 0.6 < result["metrics"]["accuracy"] <= 1
    _, tables = _registry(work).load(MODEL, "production")
    master = HorizontalForest.from_table(tables["model"])
    for name in HOSPITALS:
        manifest, local = _registry(work, name).load(MODEL, "v0001")
        assert HorizontalForest.from_table(local["model"]).same_as(master)
        predictions = pd.read_parquet(_prediction(work, name))
        new = pd.read_parquet(scenario["institutions"][name]["new"])
        assert list(predictions["patient_id"]) == list(new["patient_id"])
    assert result["prediction"]["counts"] == {n: scenario["institutions"][n]["new_rows"] for n in HOSPITALS}
    for name in HOSPITALS:  # what each agent did at home, in its own log
        log = (work / "logs" / f"agent-{name}.log").read_text()
        assert f"agent {name}: stored {MODEL} v0001 (signed by the master; table sha256 " in log
        assert f"agent {name}: wrote {scenario['institutions'][name]['new_rows']} predictions to " in log


def test_artifacts_describe_the_run_without_raw_values(fet) -> None:
    work, _, scenario, _ = fet
    with get_client(sync_client=True) as client:
        artifacts = all_artifacts(client)
        logs = " ".join(log.message for log in all_logs(client))
    keys = {a.key for a in artifacts}
    assert {"institution-rows", "training-progress", "model-card", "batch-prediction",
            "model-version", "feature-importances"} <= keys
    card = next(a.data for a in artifacts if a.key == "model-card" and a.data.startswith(f"# {MODEL} "))
    assert "Federated Extra-Trees (horizontal, classification, privacy none)" in card
    assert "## Feature importances (impurity decrease, summing to 1)" in card and "| cholesterol | " in card
    pictures = next(a.data for a in artifacts  # this model's: the session's server holds other flows' too
                    if a.key == "model-pictures" and a.data.startswith(f"# {MODEL} "))
    # horizontal: the summed confusion, the pooled held-out curves (binary), the whole forest's importances,
    # the metric's history
    assert re.findall(r"!\[(\w+)\]\(data:image/svg\+xml;base64,", pictures) == [
        "confusion", "roc", "precision_recall", "calibration", "importances", "history"]
    train = pd.read_parquet(scenario["institutions"]["riverside"]["train"])
    needles = (list(train["patient_id"].iloc[::50])
               + [f"{v:.2f}" for v in train["cholesterol"].dropna().iloc[::50]])
    text = " ".join(str(a.data) for a in artifacts) + logs
    assert [n for n in needles if n in text] == []


def test_batch_predict_with_the_registered_version_repeats_the_predictions(fet) -> None:
    work, config_path, _, _ = fet
    before = {n: pd.read_parquet(_prediction(work, n)) for n in HOSPITALS}
    for path in (work / "predictions").rglob("*.parquet"):
        path.unlink()
    state = batch_predict(str(config_path), version="production", agents="local", return_state=True)
    result = state.result()
    assert result["version"] == "v0001"
    counts = ", ".join(f"{name} {count}" for name, count in result["prediction"]["counts"].items())
    paths = {name: str(_prediction(work, name)) for name in HOSPITALS}  # each hospital's own file
    assert result["prediction"]["paths"] == paths
    written = ", ".join(f"at {name} to {path}" for name, path in paths.items())
    # the hospitals' new patients may drift from their training rows: the message then names the features
    # each hospital reported (drift.on_drift is warn here, so it still predicts)
    assert state.message == (f"{MODEL} v0001: {result['prediction']['rows']} rows predicted locally "
                             f"({counts}), written {written}"
                             + drift_note(result["prediction"].get("drift") or {}))
    for name in HOSPITALS:
        pd.testing.assert_frame_equal(pd.read_parquet(_prediction(work, name)),
                                      before[name])


def test_a_contract_that_disagrees_stops_the_run(fet) -> None:
    work, config_path, _, _ = fet
    path = work / "contracts" / "lakeside.yaml"
    original = path.read_text()
    contract = yaml.safe_load(original)
    contract["columns"] = [c for c in contract["columns"] if c["name"] != "cholesterol"]
    contract["allow_extra_columns"] = True
    path.write_text(yaml.safe_dump(contract))
    try:
        with pytest.raises(ContractMismatch,
                           match=r"institution 'lakeside': its contract lacks \['cholesterol'\] "
                                 "compared with 'riverside'"):
            retrain(str(config_path), agents="local")
    finally:
        path.write_text(original)
    assert _registry(work).versions(MODEL) == ["v0001"]


def test_ppd_ert_with_secure_aggregation_runs_the_same_pipeline(tmp_path) -> None:
    config_path, scenario = _workspace(tmp_path, "ppd-ert")
    result = retrain(str(config_path), agents="local")
    assert result["privacy"]["mode"] == "secagg" and result["version"] == "v0001"
    assert result["metrics"]["accuracy"] > 0.6
    for name in HOSPITALS:
        assert _prediction(tmp_path, name).stat().st_size > 0


def test_horizontal_boosting_retrains_stores_and_batch_predicts_through_the_flows(tmp_path) -> None:
    """Issue #32: `algorithm: boosting` over Flight/mTLS agents; the stored model is the in-process one."""
    from fedcore.config import load_config
    from tests.federations import horizontal_session_from_config

    config_path, _ = _workspace(tmp_path, "boosting")
    params = {"n_estimators": 6, "max_depth": 3, "random_state": 0}
    raw = yaml.safe_load(config_path.read_text())
    raw["params"] = params
    config_path.write_text(yaml.safe_dump(raw))
    result = retrain(str(config_path), agents="local")
    assert (result["version"], result["privacy"]["mode"]) == ("v0001", "secagg")
    assert (result["boosting"]["rounds"], result["boosting"]["loss"]) == (6, "binary:logistic")
    assert result["metrics"]["accuracy"] > 0.6
    _, tables = _registry(tmp_path).load(MODEL, "v0001")
    stored = HorizontalForest.from_table(tables["model"])
    for name in HOSPITALS:
        _, local = _registry(tmp_path, name).load(MODEL, "v0001")
        assert HorizontalForest.from_table(local["model"]).same_as(stored)
    # the agents' processes trained what the same config's agents train in process (the estimator's model:
    # tests/horizontal/test_boosting_session.py)
    session = horizontal_session_from_config(load_config(config_path))
    session.agree_schema()
    session.train()
    assert session.model.same_as(stored) and session.model.combination == stored.combination
    session.close()
    before = {n: pd.read_parquet(_prediction(tmp_path, n)) for n in HOSPITALS}
    for path in (tmp_path / "predictions").rglob("*.parquet"):
        path.unlink()
    assert batch_predict(str(config_path), version="v0001", agents="local")["version"] == "v0001"
    for name in HOSPITALS:
        pd.testing.assert_frame_equal(pd.read_parquet(_prediction(tmp_path, name)), before[name])
