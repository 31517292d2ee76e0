"""The population stability index of a batch against the training rows' snapshot (fedcore/drift.py)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fedcore.drift import DriftSettings, batch_scores, psi, training_snapshot
from fedcore.errors import ConfigError


def _table(n: int, seed: int, shift: float = 0.0, channel: str | None = None) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    income = rng.lognormal(10 + shift, 0.5, n)
    income[rng.random(n) < 0.05] = np.nan
    return pd.DataFrame({
        "income": income,
        "orders": rng.poisson(3, n),
        "channel": pd.Categorical(rng.choice(["web", "app", "store"], n, p=[0.5, 0.3, 0.2]) if channel is None
                                  else [channel] * n),
        "member": rng.random(n) < 0.4})


def test_a_batch_like_the_training_rows_scores_low_and_a_shifted_one_high() -> None:
    snapshot = json.loads(json.dumps(training_snapshot(_table(5000, 1))))  # as kept in a manifest
    same = batch_scores(snapshot, _table(1000, 2))
    assert set(same) == {"income", "orders", "channel", "member"}
    assert max(same.values()) < 0.05
    shifted = batch_scores(snapshot, _table(1000, 3, shift=0.5, channel="store"))
    assert shifted["income"] > 0.5 and shifted["channel"] > 1.0
    assert shifted["orders"] < 0.05 and shifted["member"] < 0.05


def test_scores_depend_on_the_rows_only_not_their_order_or_blocks() -> None:
    snapshot = training_snapshot(_table(3000, 4))
    batch = _table(800, 5, shift=0.2)
    scores = batch_scores(snapshot, batch)
    assert batch_scores(snapshot, batch.sample(frac=1.0, random_state=0)) == scores  # exactly
    assert training_snapshot(_table(3000, 4).iloc[::-1]) == snapshot


def test_missing_values_and_unseen_categories_have_bins_of_their_own() -> None:
    training = pd.DataFrame({"x": [1.0, 2.0, 3.0, 4.0] * 50, "c": ["a", "b"] * 100})
    snapshot = training_snapshot(training)
    assert snapshot["features"]["c"] == {"kind": "categorical", "categories": ["a", "b"],
                                         "counts": [100, 100, 0, 0]}  # a, b, another category, missing
    batch = pd.DataFrame({"x": [np.nan] * 200, "c": ["z"] * 200})
    scores = batch_scores(snapshot, batch)
    # every row moved into a bin training left empty (floored at 1e-4)
    counts_x = np.array(snapshot["features"]["x"]["counts"])
    assert counts_x[-1] == 0 and counts_x.sum() == 200  # the last bin: missing values
    expected_x = psi(counts_x, np.append(np.zeros(len(counts_x) - 1, np.int64), 200))
    assert scores == {"x": expected_x, "c": psi(np.array([100, 100, 0, 0]), np.array([0, 0, 200, 0]))}
    assert scores["c"] == pytest.approx((1e-4 - 0.5) * np.log(1e-4 / 0.5) * 2 + (1 - 1e-4) * np.log(1 / 1e-4))
    assert psi(np.array([5, 5]), np.array([50, 50])) == 0.0
    assert batch_scores(snapshot, batch.iloc[:0]) == {}


@pytest.mark.parametrize("raw, error", [
    ({"psi_threshold": 0}, "drift.psi_threshold must be a positive number (0.2 is usual), got 0"),
    ({"psi_threshold": "high"}, "drift.psi_threshold must be a positive number (0.2 is usual), got 'high'"),
    ({"on_drift": "retrain"}, "drift.on_drift must be 'warn' or 'fail', got 'retrain'"),
    ({"threshold": 0.1}, "unknown drift setting 'threshold'; known: psi_threshold, on_drift"),
    ("fail", "drift must be a mapping like {psi_threshold: 0.2, on_drift: warn}"),
])
def test_drift_settings_refuse_bad_values_by_name(raw, error: str) -> None:
    with pytest.raises(ConfigError) as refused:
        DriftSettings.from_mapping(raw, "federation.yaml")
    assert str(refused.value) == f"federation.yaml: {error}"


def test_drift_settings_default_to_warn_at_0_2() -> None:
    assert DriftSettings.from_mapping(None, "f") == DriftSettings(0.2, "warn")
    assert DriftSettings.from_mapping({"psi_threshold": 0.1, "on_drift": "fail"}, "f") == DriftSettings(0.1,
                                                                                                     "fail")
