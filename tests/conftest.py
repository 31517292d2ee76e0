"""Shared fixtures: small synthetic tables with numeric, categorical and missing values."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest


def mixed_table(n_rows: int = 600, seed: int = 0, task: str = "classification", n_classes: int = 3) -> pd.DataFrame:
    """A table with numeric, integer, string-categorical and pandas-categorical columns and NaNs."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({f"num{i}": rng.normal(size=n_rows) for i in range(8)})
    frame["int0"] = rng.integers(0, 5, n_rows)
    frame["cat_str"] = rng.choice(["crimson", "emerald", "azure", "onyx"], n_rows).astype(object)
    frame["cat_pd"] = pd.Categorical(rng.choice(["a", "b", "c"], n_rows))
    frame["flag"] = rng.random(n_rows) < 0.3
    for column in ("num0", "num3", "cat_str"):
        frame.loc[rng.random(n_rows) < 0.1, column] = np.nan
    signal = (
        frame["num1"].to_numpy()
        + 0.8 * np.nan_to_num(frame["num0"].to_numpy())
        + (frame["cat_str"] == "crimson").to_numpy() * 1.5
        - (frame["cat_pd"] == "b").to_numpy() * 1.0
        + 0.3 * frame["int0"].to_numpy()
    )
    if task == "regression":
        frame["target"] = signal + rng.normal(scale=0.3, size=n_rows)
    else:
        cuts = np.quantile(signal, np.linspace(0, 1, n_classes + 1)[1:-1])
        frame["target"] = np.array([f"class_{k}" for k in np.digitize(signal, cuts)], dtype=object)
    return frame


@pytest.fixture
def classification_table() -> pd.DataFrame:
    return mixed_table(task="classification")


@pytest.fixture
def regression_table() -> pd.DataFrame:
    return mixed_table(task="regression")
