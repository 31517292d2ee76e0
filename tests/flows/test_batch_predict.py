"""The batch-predict flow: a registered version predicts new rows without training, over Flight with mutual
TLS under a Prefect test server, exactly as the training run's own batch prediction did."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from fedcore.errors import ArtifactError
from flows.batch_predict import batch_predict
from flows.retrain import retrain
from tests.federations import small_federation

pytestmark = pytest.mark.slow
MODEL = "retail-response"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    work = tmp_path_factory.mktemp("federation")
    config_path, scenario = small_federation(work, 800, seed=5, params={"n_estimators": 6, "max_depth": 4})
    result = retrain(str(config_path), agents="local")
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
    assert [(f.parent.name, f.name) for f in files] == [("bank", f"{MODEL}-v0001.parquet")]
    predictions = pd.read_parquet(files[0])
    assert len(predictions) == result["prediction"]["rows"] == scenario["overlap"]["new"]
    assert files[0].read_bytes() == reference


def test_missing_version_fails_clearly(trained) -> None:
    _, config_path, _, _, _ = trained
    with pytest.raises(ArtifactError, match=rf"model '{MODEL}' has no version 'v0042' \(versions: v0001"):
        batch_predict(str(config_path), version="v0042", agents="local")
