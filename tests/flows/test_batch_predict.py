"""The batch-predict flow.

A registered version predicts new rows without training, over Flight with mutual TLS under a Prefect test
server, exactly as the training run's own batch prediction did.
"""

from __future__ import annotations

import re
import shutil

import pandas as pd
import pytest
from prefect.client.orchestration import get_client

from fedcore.errors import ArtifactError
from flows.batch_predict import batch_predict
from tests.federations import copy_of
from tests.prefect_reads import all_artifacts

pytestmark = pytest.mark.slow
MODEL = "retail-response"


@pytest.fixture(scope="module")
def trained(tmp_path_factory, trained_federation):
    """A copy of the session's trained federation, without the predictions its training run wrote."""
    copy = copy_of(trained_federation, tmp_path_factory.mktemp("federation") / "work")
    work, config_path, scenario, result = copy.work, copy.config_path, copy.scenario, copy.result
    files = sorted((work / "predictions").rglob("*.parquet"))
    assert [f.parent.name for f in files] == ["bank"]
    reference = files[0].read_bytes()  # what the training run's own batch prediction wrote
    shutil.rmtree(work / "predictions")
    return work, config_path, scenario, result, reference


def test_registered_version_predicts_like_the_training_run(trained) -> None:
    work, config_path, scenario, first, reference = trained
    result = batch_predict(str(config_path), agents="local")
    assert result["version"] == first["version"] == "v0001" and result["ref"] == "production"
    assert result["prediction"]["requester"] == "bank"
    files = sorted((work / "predictions").rglob("*.parquet"))
    assert [f.parent.name for f in files] == ["bank"]
    assert re.fullmatch(rf"{MODEL}-v0001-\d{{8}}T\d{{6}}Z\.parquet", files[0].name)  # the agent names it
    assert result["prediction"]["paths"] == {"bank": str(files[0])}  # as the bank reported it
    predictions = pd.read_parquet(files[0])
    assert len(predictions) == result["prediction"]["rows"] == scenario["overlap"]["new"]
    assert files[0].read_bytes() == reference


def test_the_run_is_named_after_the_version_and_says_where_predictions_went(trained) -> None:
    _, config_path, scenario, _, _ = trained
    state = batch_predict(str(config_path), version="latest", agents="local", return_state=True)
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
    assert run.name == f"predict {MODEL} v0001"
    result = state.result()
    assert state.message == (f"{MODEL} v0001: {scenario['overlap']['new']} rows predicted for bank, "
                             f"written at bank to {result['prediction']['paths']['bank']}")
    assert result["version"] == "v0001"


def test_missing_version_fails_clearly(trained) -> None:
    _, config_path, _, _, _ = trained
    with pytest.raises(ArtifactError, match=rf"model '{MODEL}' has no version 'v0042' \(versions: v0001"):
        batch_predict(str(config_path), version="v0042", agents="local")


def test_an_until_without_a_time_zone_fails_before_any_agent_starts(trained) -> None:
    from datetime import datetime

    _, config_path, _, _, _ = trained
    state = batch_predict(str(config_path), agents="local", until=datetime(2026, 6, 30, 12, 0),
                          return_state=True)
    assert state.is_failed()
    with pytest.raises(ValueError) as refused:
        state.result()
    assert str(refused.value) == ("until 2026-06-30T12:00:00 has no time zone: give one, e.g. "
                                  "2026-06-30T12:00:00+00:00 for UTC")


def test_a_drifted_batch_is_named_in_the_final_message_or_fails_the_run(trained) -> None:
    """Drift computed at home (issue #33): ecommerce's batch with larger baskets, all on one channel."""
    import yaml

    work, config_path, _, _, _ = trained
    batch = pd.read_parquet(work / "data" / "ecommerce" / "new.parquet")
    batch["avg_basket"] = batch["avg_basket"] * 3
    batch["preferred_channel"] = pd.Categorical([batch["preferred_channel"].cat.categories[0]] * len(batch),
                                                categories=batch["preferred_channel"].cat.categories)
    batch.to_parquet(work / "data" / "ecommerce" / "shifted.parquet")
    raw = yaml.safe_load(config_path.read_text())
    next(i for i in raw["institutions"] if i["name"] == "ecommerce")["predict_data"] = \
        "data/ecommerce/shifted.parquet"
    warn = config_path.with_name("drift-warn.yaml")
    warn.write_text(yaml.safe_dump(raw))
    state = batch_predict(str(warn), agents="local", return_state=True)
    drift = state.result()["prediction"]["drift"]
    assert list(drift) == ["ecommerce"] and set(drift["ecommerce"]) == {"preferred_channel", "avg_basket"}
    assert state.message.endswith(f"; drift at ecommerce: preferred_channel "
                                  f"{drift['ecommerce']['preferred_channel']:.4f}, avg_basket "
                                  f"{drift['ecommerce']['avg_basket']:.4f}")
    with get_client(sync_client=True) as client:
        drifts = sorted((a for a in all_artifacts(client) if a.key == "batch-drift"), key=lambda a: a.created)
    tables = [a.data for a in reversed(drifts)]  # newest first: this run's
    assert tables and "avg_basket" in str(tables[0]) and "orders_12m" not in str(tables[0])

    raw["drift"] = {"psi_threshold": 0.2, "on_drift": "fail"}
    fail = config_path.with_name("drift-fail.yaml")
    fail.write_text(yaml.safe_dump(raw))
    before = sorted((work / "predictions").rglob("*.parquet"))
    state = batch_predict(str(fail), agents="local", return_state=True)
    assert state.is_failed()
    with pytest.raises(Exception) as refused:
        state.result()
    assert ("institution 'ecommerce' refuses to predict: its batch drifted from its training rows "
            f"(PSI >= 0.2): preferred_channel {drift['ecommerce']['preferred_channel']:.4f}, avg_basket "
            f"{drift['ecommerce']['avg_basket']:.4f}; drift.on_drift is fail") in str(refused.value)
    assert sorted((work / "predictions").rglob("*.parquet")) == before  # nothing predicted
