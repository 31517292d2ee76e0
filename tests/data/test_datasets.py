"""Waveform-21 generator follows Breiman's definition; load_table reads Parquet and CSV and refuses others."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedcore.data.datasets import load_table, make_waveform


def _h(centre: int) -> np.ndarray:
    """Breiman's triangular wave max(6 - |i - centre|, 0) for i = 1..21, written out independently."""
    return np.array([max(6 - abs(i - centre), 0) for i in range(1, 22)], dtype=float)


H1, H2, H3 = _h(7), _h(15), _h(11)
# With u ~ U(0, 1), E[u] = 1/2: each class mean is the average of its two waves.
EXPECTED_CLASS_MEANS = {0: (H1 + H2) / 2, 1: (H1 + H3) / 2, 2: (H2 + H3) / 2}


def test_shape_columns_and_dtypes() -> None:
    frame = make_waveform(1234, random_state=1)
    assert frame.shape == (1234, 22)
    assert list(frame.columns) == [f"x{i}" for i in range(1, 22)] + ["class"]
    assert pd.api.types.is_integer_dtype(frame["class"])
    assert set(frame["class"].unique()) == {0, 1, 2}
    assert all(pd.api.types.is_float_dtype(frame[f"x{i}"]) for i in range(1, 22))


def test_classes_roughly_uniform() -> None:
    shares = make_waveform(5000, random_state=0)["class"].value_counts(normalize=True)
    assert np.all(np.abs(shares.to_numpy() - 1 / 3) < 0.03)


def test_deterministic_for_a_seed_and_different_across_seeds() -> None:
    pd.testing.assert_frame_equal(make_waveform(500, random_state=42), make_waveform(500, random_state=42))
    assert not make_waveform(500, random_state=1).equals(make_waveform(500, random_state=2))


def test_class_conditional_means_match_base_waves() -> None:
    frame = make_waveform(5000, random_state=0)
    features = [f"x{i}" for i in range(1, 22)]
    for label, expected in EXPECTED_CLASS_MEANS.items():
        means = frame.loc[frame["class"] == label, features].mean().to_numpy()
        np.testing.assert_allclose(means, expected, atol=0.3, err_msg=f"class {label}")
    # The example from the definition: x7 of class 0 averages 0.5*6 + 0.5*0 = 3.
    assert abs(frame.loc[frame["class"] == 0, "x7"].mean() - 3.0) < 0.3


def test_noise_is_unit_variance_where_both_waves_are_zero() -> None:
    # x1 and x21 are zero in every wave, so they are pure N(0, 1) noise.
    frame = make_waveform(5000, random_state=3)
    for column in ("x1", "x21"):
        assert abs(frame[column].mean()) < 0.1
        assert abs(frame[column].std() - 1.0) < 0.1


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_load_table_round_trip(tmp_path, suffix: str) -> None:
    frame = make_waveform(50, random_state=0)
    path = tmp_path / f"table{suffix}"
    if suffix == ".parquet":
        frame.to_parquet(path)
    else:
        frame.to_csv(path, index=False)
    pd.testing.assert_frame_equal(load_table(path), frame, check_exact=False, rtol=1e-12)


def test_load_table_refuses_other_suffixes(tmp_path) -> None:
    path = tmp_path / "table.json"
    path.write_text("{}")
    with pytest.raises(ValueError, match="parquet or .csv"):
        load_table(path)
