"""What the export tests share: their rows and the ONNX runtime checks.

The rows: two numbers (one with missing values) and a category.
"""

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


def onnx_run(model, X: np.ndarray) -> list[np.ndarray]:
    """An ONNX `ModelProto` run by onnxruntime on the encoded rows `X`: its outputs."""
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"X": X})


def assert_onnx_classifier_matches(model, held_out: pd.DataFrame, bound: float) -> None:
    """`model.to_onnx()` predicts `held_out` as fedforest does, within `bound`.

    Probabilities within `bound`; labels equal wherever the top two classes are more than 2 x bound apart
    (no tie within float32 rounding).
    """
    labels, probabilities = onnx_run(model.to_onnx(), model.schema_.encode(held_out))
    expected = model.predict_proba(held_out)
    assert probabilities.shape == expected.shape
    np.testing.assert_allclose(probabilities, expected, rtol=0, atol=bound)
    decided = np.sort(expected, axis=1)
    clear = decided[:, -1] - decided[:, -2] > 2 * bound
    assert clear.sum() > 250
    assert list(labels[clear]) == list(model.predict(held_out)[clear])
