"""The rows the export tests fit and predict: two numbers (one with missing values) and a category."""

from __future__ import annotations

import numpy as np
import pandas as pd

CATEGORIES = {"plan": ["basic", "plus", "gold"]}


def export_table(n_rows: int, seed: int) -> pd.DataFrame:
    """`n_rows` rows of amount (every 13th missing: NaN goes right or the learned way), age and plan."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"amount": rng.normal(size=n_rows),
                          "age": rng.integers(18, 90, n_rows).astype(float),
                          "plan": rng.choice(CATEGORIES["plan"], n_rows)})
    frame.loc[::13, "amount"] = np.nan
    return frame


def two_parties(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The first half of `frame` at north, the rest at south."""
    half = len(frame) // 2
    return {"north": frame.iloc[:half].reset_index(drop=True),
            "south": frame.iloc[half:].reset_index(drop=True)}
