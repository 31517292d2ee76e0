"""README's horizontal Python block (issue #33), run as written: importances, contributions, ONNX, drift.

The block is taken from README.md as it stands, so a change there that stops it working fails here; each
value it computes is then checked for what its comment claims.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from fedcore.drift import DriftSettings

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_block() -> str:
    """The python block README introduces with "tests/test_readme_python.py` runs this block"."""
    after = README.read_text().split("`tests/test_readme_python.py` runs this block", 1)[1]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


@pytest.fixture(scope="module")
def ran() -> dict:
    namespace: dict = {}
    exec(compile(readme_block(), str(README), "exec"), namespace)  # noqa: S102 - our own README's code
    return namespace


def test_the_importances_are_every_features_summing_to_one(ran) -> None:
    model, importances = ran["model"], ran["importances"]
    assert list(model.feature_names_in_) == [f"x{i}" for i in range(1, 22)]
    assert importances.shape == (21,) and importances.sum() == pytest.approx(1.0, abs=1e-12)
    assert (importances >= 0).all() and importances.max() < 1


def test_the_contributions_add_up_to_the_probabilities(ran) -> None:
    model, contributions, new = ran["model"], ran["contributions"], ran["new"]
    assert contributions.shape == (5, 3, 22)  # (rows, classes, features + 1), the expected value last
    np.testing.assert_allclose(contributions.sum(axis=2), model.predict_proba(new.head(5)), rtol=0,
                               atol=1e-12)
    assert np.abs(contributions[:, :, :-1]).max() > 0  # the features moved the predictions


def test_the_onnx_model_predicts_as_fedforest(ran) -> None:
    pytest.importorskip("onnxruntime", reason="the [export] extra (onnxruntime) is in [dev]")
    from tests.models.export_rows import onnx_run

    model, new = ran["model"], ran["new"]
    _, probabilities = onnx_run(ran["onnx_model"], model.schema_.encode(new))
    np.testing.assert_allclose(probabilities, model.predict_proba(new), rtol=0,
                               atol=2 * model.n_estimators * 2.0 ** -24)  # summed in float32


def test_only_the_moved_feature_drifts(ran) -> None:
    threshold = DriftSettings().psi_threshold
    drift = ran["drift"]
    assert set(drift) == {f"x{i}" for i in range(1, 22)}
    assert [name for name, psi in drift.items() if psi >= threshold] == ["x7"]
