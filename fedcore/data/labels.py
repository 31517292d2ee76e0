"""Which task a label column implies, by the one rule the simulator, contracts and commands share."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedcore.data.binning import is_categorical_dtype

MAX_AUTO_CLASSES = 20
"""At most this many distinct integer values make a numeric label a class label."""


def infer_task(y: pd.Series) -> str:
    """Classification for non-numeric labels or at most 20 distinct integer values, else regression."""
    if is_categorical_dtype(y) or not pd.api.types.is_numeric_dtype(y):
        return "classification"
    values = y.dropna().to_numpy(dtype=np.float64)
    integral = np.all(np.isfinite(values)) and np.all(values == np.round(values))
    if integral and len(np.unique(values)) <= MAX_AUTO_CLASSES:
        return "classification"
    return "regression"
