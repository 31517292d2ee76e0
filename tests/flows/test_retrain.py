"""The retrain flow end to end on the demo scenario: local agents over Flight with mutual TLS, under a
Prefect test server. Checks artifacts, registries, where predictions land, that no raw value reaches
Prefect, and that bad input stops the run before any version is registered."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml
from prefect.client.orchestration import get_client

from fedcore.errors import ContractViolation, ProtocolError
from fedcore.models.registry import ModelRegistry
from flows.retrain import retrain
from tests.flows.conftest import small_federation

pytestmark = pytest.mark.slow
MODEL = "retail-response"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    work = tmp_path_factory.mktemp("federation")
    config_path, scenario = small_federation(work, 1200, seed=4, params={"n_estimators": 8, "max_depth": 5})
    return work, config_path, scenario


@pytest.fixture(scope="module")
def first_run(workspace):
    work, config_path, _ = workspace
    return retrain(str(config_path), agents="local")


def _artifacts() -> list:
    with get_client(sync_client=True) as client:
        return client.read_artifacts()


def test_retrain_registers_promotes_and_predicts(workspace, first_run) -> None:
    work, _, scenario = workspace
    assert first_run["version"] == "v0001" and first_run["promoted"]
    assert first_run["alignment"]["overlap"] == scenario["overlap"]["train"]
    assert 0.5 < first_run["metrics"]["accuracy"] <= 1
    master = ModelRegistry(work / "registry" / "master")
    manifest, tables = master.load(MODEL, "production")
    assert manifest["signature"]["algorithm"] == "ed25519" and set(tables) == {"master"}
    assert [p["feature_count"] for p in manifest["parties"]] == [8, 6, 5]
    for name in ("bank", "ecommerce", "insurer"):
        local, _ = ModelRegistry(work / "registry" / name).load(MODEL, "v0001")
        assert local["master_manifest"]["version"] == "v0001"
    files = sorted((work / "predictions").rglob("*.parquet"))
    assert [f.parent.name for f in files] == ["bank"]
    assert len(pd.read_parquet(files[0])) == scenario["overlap"]["new"]


def test_artifacts_exist_and_hold_no_raw_data(workspace, first_run) -> None:
    work, _, scenario = workspace
    artifacts = _artifacts()
    keys = {a.key for a in artifacts}
    assert {"validation-bank", "validation-ecommerce", "validation-insurer", "id-overlap", "training-progress",
            "model-version", "model-card", "batch-prediction"} <= keys
    bank = pd.read_parquet(scenario["institutions"]["bank"]["train"])
    needles = list(bank[scenario["id_column"]].iloc[::40]) + [f"{v:.2f}" for v in bank["income"].dropna().iloc[::40]]
    with get_client(sync_client=True) as client:
        logs = " ".join(log.message for log in client.read_logs())
    text = " ".join(str(a.data) for a in artifacts) + " " + logs
    assert [n for n in needles if n in text] == []


def _negative_age(frame: pd.DataFrame) -> str:
    frame.loc[frame.index[:3], "age"] = -4
    return "-4"


def _drop_basket(frame: pd.DataFrame) -> str:
    del frame["avg_basket"]
    return "avg_basket_values_never_shown"


def _duplicate_id(frame: pd.DataFrame) -> str:
    frame.loc[frame.index[1], "customer_id"] = frame.loc[frame.index[0], "customer_id"]
    return str(frame.loc[frame.index[0], "customer_id"])


def _unknown_vehicle(frame: pd.DataFrame) -> str:
    frame["vehicle_type"] = frame["vehicle_type"].astype(object)
    frame.loc[frame.index[:2], "vehicle_type"] = "hovercraft"
    return "hovercraft"


@pytest.mark.parametrize(("institution", "damage", "expected"), [
    ("bank", _negative_age, r"institution 'bank', column 'age': expect_column_values_to_be_between\(.*\) failed: "
                            r"3 unexpected"),
    ("ecommerce", _drop_basket, r"institution 'ecommerce', column 'avg_basket': expect_column_to_exist"),
    ("insurer", _duplicate_id, r"institution 'insurer', column 'customer_id': expect_column_values_to_be_unique"),
    ("insurer", _unknown_vehicle, r"institution 'insurer', column 'vehicle_type': expect_column_values_to_be_in_set"),
])
def test_contract_violation_stops_before_training(workspace, first_run, institution, damage, expected) -> None:
    work, config_path, scenario = workspace
    path = scenario["institutions"][institution]["train"]
    original = pd.read_parquet(path)
    broken = original.copy()
    raw_value = damage(broken)
    broken.to_parquet(path)
    try:
        with pytest.raises(ContractViolation, match=expected) as caught:
            retrain(str(config_path), agents="local")
    finally:
        original.to_parquet(path)
    assert raw_value not in str(caught.value)
    assert ModelRegistry(work / "registry" / "master").versions(MODEL) == ["v0001"]
    failures = [a for a in _artifacts() if a.key == "failure"]
    assert failures and all(raw_value not in str(a.data) for a in failures)


def test_unreachable_agents_fail_with_their_names(workspace) -> None:
    _, config_path, _ = workspace
    raw = yaml.safe_load(config_path.read_text())
    raw["training"]["connect_timeout_s"] = 2
    other = config_path.with_name("unreachable.yaml")
    other.write_text(yaml.safe_dump(raw))
    with pytest.raises(ProtocolError, match=r"agents not ready after 2 s: cannot reach party 'bank'"):
        retrain(str(other), agents="running")
