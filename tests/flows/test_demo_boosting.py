"""`fedforest demo --algorithm boosting`: the vertical pipeline with gradient boosting (issue #32).

The retrain flow trains through the agents with early stopping on the bank's held-out rows, signs the
version into the registry with its boosting facts and card, and predicts the new customers; `fedforest
predict` then loads the signed version and predicts them again, the same probabilities.
"""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from fedcore.cli import main
from fedcore.models.tables import COMBINATION_KEY


@pytest.mark.slow
def test_the_boosting_demo_runs_the_pipeline_and_its_version_predicts_again(tmp_path, monkeypatch,
                                                                           capsys) -> None:
    import flows.demos.vertical as demo

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    monkeypatch.setitem(demo.PARAMS, "boosting", {"n_estimators": 30, "max_depth": 3, "learning_rate": 0.6,
                                                  "reg_lambda": 1.0, "early_stopping_rounds": 3,
                                                  "random_state": 0})
    work = tmp_path / "demo"
    assert main(["demo", "--algorithm", "boosting", "--work", str(work), "--customers", "1500"]) == 0
    out = capsys.readouterr().out
    kept = re.search(r"training: +gradient boosting, (\d+) rounds kept of 30 \(early stopping on the bank's "
                     r"held-out log_loss\), depth 3", out)
    assert kept is not None, out
    assert "scikit-learn HistGradientBoostingClassifier on pooled data" in out

    version = work / "registry" / "master" / "retail-response" / "v0001"
    manifest = json.loads((version / "manifest.json").read_text())
    assert manifest["algorithm"] == "boosting" and manifest["params"]["early_stopping_rounds"] == 3
    boosting = manifest["boosting"]
    assert (boosting["rounds"], boosting["rounds_grown"], boosting["loss"]) == (int(kept[1]), 30,
                                                                                 "binary:logistic")
    assert {"log_loss", "roc_auc", "accuracy"} <= set(manifest["metrics"])
    import pyarrow.ipc as ipc

    with ipc.open_file(version / "master.arrow") as reader:
        assert COMBINATION_KEY in reader.schema.metadata

    trained = sorted((work / "predictions" / "bank").glob("*.parquet"))
    assert len(trained) == 1
    config = work / "federation.yaml"
    assert main(["predict", "--config", str(config), "--agents", "local", "--version", "v0001"]) == 0
    again = sorted((work / "predictions" / "bank").glob("*.parquet"))
    assert len(again) == 2
    first, second = (pd.read_parquet(p).sort_values("customer_id").reset_index(drop=True) for p in again)
    assert first.equals(second)  # the loaded version's one-round prediction is the trained session's
