"""The label holder's classes and codes, made in chunks, are np.unique's exactly (issue #29)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedcore.vertical import party

RNG = np.random.default_rng(1)


@pytest.mark.parametrize("labels", [
    np.array(["b", "a", "c", "a"] * 20, dtype=object),  # object strings, as pandas gives them
    np.array(["x", "yy", "x"] * 10),  # fixed-width strings: the classes keep the width
    RNG.integers(0, 5, 100),
    RNG.normal(size=50).round(0),
    np.array([True, False] * 9),
    np.array([1.0, np.nan, 2.0, np.nan] * 5),  # NaNs are one class, last, as np.unique has them
    np.array([], dtype=object),
], ids=["object", "unicode", "int", "float", "bool", "nan", "empty"])
def test_chunked_class_codes_are_np_uniques(monkeypatch, labels) -> None:
    monkeypatch.setattr(party, "_CODE_ROWS", 7)  # chunks that split every case (and a short last one)
    classes, codes = party.class_codes(labels)
    expected, inverse = np.unique(labels, return_inverse=True)
    assert classes.dtype == expected.dtype and classes.shape == expected.shape
    assert [str(c) for c in classes] == [str(c) for c in expected]
    assert codes.dtype == np.float64 and codes.tobytes() == inverse.astype(np.float64).tobytes()


def test_chunked_class_codes_of_a_series_are_np_uniques_of_its_values(monkeypatch) -> None:
    """Arrow-backed strings (pandas' default) are turned into Python strings a chunk at a time."""
    monkeypatch.setattr(party, "_CODE_ROWS", 7)
    labels = pd.Series(["yes", "no", "maybe"] * 11, dtype="string[pyarrow]")
    classes, codes = party.class_codes(labels)
    expected, inverse = np.unique(labels.to_numpy(), return_inverse=True)
    assert classes.dtype == expected.dtype and list(classes) == list(expected)
    assert codes.tobytes() == inverse.astype(np.float64).tobytes()
