"""ONNX and Treelite exports of horizontal forests predict as fedforest does.

Checked with onnxruntime and treelite's own predictor; the CLI exports a verified registered version and
refuses a vertical one in one line.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedcore.cli import main
from fedcore.errors import ArtifactError
from fedcore.horizontal.estimators import FederatedExtraTreesClassifier, FederatedExtraTreesRegressor
from fedcore.models import signing
from fedcore.models.export import exported_trees
from fedcore.models.registry import ModelRegistry
from fedcore.models.treelite_export import treelite_predict
from tests.models.export_rows import (
    CATEGORIES,
    assert_onnx_classifier_matches,
    export_table,
    onnx_run,
    two_parties,
)

ort = pytest.importorskip("onnxruntime", reason="the [export] extra (onnxruntime) is in [dev]")
treelite = pytest.importorskip("treelite", reason="the [export] extra (treelite) is in [dev]")

N_TREES = 6
FLOAT32_SUM_BOUND = 2 * N_TREES * 2.0 ** -24
"""onnxruntime sums the trees' leaf weights in float32: each weight rounded once to float32 and each of the
n_trees additions rounded once, every term and partial sum at most the output's scale (1 for
probabilities)."""


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    return export_table(500, 7)


@pytest.fixture(scope="module")
def multiclass(rows):
    label = np.where(rows["plan"] == "gold", "churn",
                     np.where(rows["amount"].fillna(0) > 0, "stay", "downgrade"))
    frame = rows.assign(outcome=label)
    return FederatedExtraTreesClassifier(n_estimators=N_TREES, max_depth=6, random_state=3,
                                         categories=CATEGORIES).fit(two_parties(frame), label="outcome")


@pytest.fixture(scope="module")
def regressor(rows):
    target = 3 * rows["amount"].fillna(-1) + rows["age"] / 10 + (rows["plan"] == "plus") * 2
    frame = rows.assign(spend=target)
    return FederatedExtraTreesRegressor(n_estimators=N_TREES, max_depth=6, random_state=3,
                                        categories=CATEGORIES).fit(two_parties(frame), label="spend")


def test_onnx_classifier_predicts_as_fedforest(multiclass, rows):
    assert_onnx_classifier_matches(multiclass, export_table(300, 11), FLOAT32_SUM_BOUND)


def test_onnx_binary_integer_labels(rows):
    frame = rows.assign(flag=(rows["age"] > 50).astype(int))
    model = FederatedExtraTreesClassifier(n_estimators=N_TREES, max_depth=5, random_state=5,
                                          categories=CATEGORIES).fit(two_parties(frame), label="flag")
    labels, probabilities = onnx_run(model.to_onnx(), model.schema_.encode(rows))
    np.testing.assert_allclose(probabilities, model.predict_proba(rows), rtol=0, atol=FLOAT32_SUM_BOUND)
    assert labels.dtype == np.int64
    expected = model.predict_proba(rows)
    clear = np.abs(expected[:, 1] - expected[:, 0]) > 2 * FLOAT32_SUM_BOUND
    assert clear.sum() > 400 and set(labels[clear].tolist()) == {0, 1}
    assert list(labels[clear]) == list(model.predict(rows)[clear])


def test_onnx_regressor_within_float32_rounding(regressor, rows):
    X = regressor.schema_.encode(rows)
    (values,) = onnx_run(regressor.to_onnx(), X)
    expected = regressor.predict(rows)
    scale = np.abs(regressor.model_.value).max()
    np.testing.assert_allclose(values[:, 0], expected, rtol=0, atol=FLOAT32_SUM_BOUND * scale)


def test_onnx_splits_compare_in_float64(multiclass):
    """A value just above a threshold that float32 would round onto it still goes right."""
    forest = multiclass.model_
    internal = np.flatnonzero((forest.feature >= 0) & (forest.node == 0))  # every tree's root split
    X = np.zeros((len(internal), multiclass.schema_.n_features))
    for row, node in enumerate(internal):
        X[row, forest.feature[node]] = np.nextafter(forest.threshold[node], np.inf)
    _, probabilities = onnx_run(multiclass.to_onnx(), X)
    np.testing.assert_allclose(probabilities, forest.predict_values(X), rtol=0, atol=FLOAT32_SUM_BOUND)


def test_treelite_equals_fedforest(multiclass, regressor, rows):
    for model in (multiclass, regressor):
        X = model.schema_.encode(rows)
        predicted = treelite_predict(model.to_treelite(), X)
        expected = model.model_.predict_values(X)
        np.testing.assert_allclose(predicted, expected, rtol=1e-12, atol=1e-15)  # float64 sum order only


def test_a_forest_without_schema_is_refused(multiclass):
    from dataclasses import replace

    with pytest.raises(ArtifactError, match=r"^this model carries no schema: its input encoding \(column "
                                            r"order, category codes\) is unknown, so it cannot be exported$"):
        exported_trees(replace(multiclass.model_, schema=None))


@pytest.fixture
def registry(tmp_path, multiclass) -> ModelRegistry:
    key = tmp_path / "master.pem"
    signing.generate_signing_key(key)
    registry = ModelRegistry(tmp_path / "registry", signing_key=key)
    forest = multiclass.model_
    registry.register("churn", {"algorithm": "extra-trees", "setting": "horizontal", "task": "classification",
                                "metrics": {"accuracy": 0.9}}, {"model": forest.to_table()})
    registry.register("credit", {"algorithm": "forest", "setting": "vertical", "task": "classification",
                                 "metrics": {"accuracy": 0.9}}, {"model": forest.to_table()})
    return registry


def _export(capsys, registry, model: str, fmt: str, out) -> tuple[int, str, str]:
    code = main(["models", "export", "--registry", str(registry.root), "--public-key",
                 str(registry.root.parent / "master.pem.pub"), "--model", model, "--format", fmt, "--out",
                 str(out)])
    stdout, stderr = capsys.readouterr()
    return code, stdout, stderr


def test_cli_exports_a_registered_version(capsys, registry, multiclass, rows, tmp_path):
    X = multiclass.schema_.encode(rows)
    expected = multiclass.model_.predict_values(X)

    code, out, _ = _export(capsys, registry, "churn", "onnx", tmp_path / "churn.onnx")
    assert code == 0 and out.startswith(f"churn v0001: wrote {tmp_path / 'churn.onnx'} (onnx;")
    session = ort.InferenceSession(str(tmp_path / "churn.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"X": X})[1], expected, rtol=0, atol=FLOAT32_SUM_BOUND)
    schema = session.get_modelmeta().custom_metadata_map["fedforest.schema"]
    assert '"plan"' in schema and '"gold"' in schema

    code, _, _ = _export(capsys, registry, "churn", "treelite", tmp_path / "churn.tl")
    assert code == 0
    loaded = treelite.Model.deserialize(str(tmp_path / "churn.tl"))
    np.testing.assert_allclose(treelite_predict(loaded, X), expected, rtol=1e-12, atol=1e-15)
    assert not list(tmp_path.glob(".*.partial"))


def test_cli_refuses_a_vertical_version(capsys, registry, tmp_path):
    code, out, err = _export(capsys, registry, "credit", "onnx", tmp_path / "credit.onnx")
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert ("model 'credit' v0001 is a vertical model: its split thresholds stay at the institutions that "
            "own them, so it cannot run outside the federation (docs/design.md, Export): only horizontal "
            "models export to onnx or treelite; --format structure writes the tables this registry "
            "holds") in err
    assert not (tmp_path / "credit.onnx").exists()
