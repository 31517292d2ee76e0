"""Boosted horizontal models export with their base score and link, and explain rows in margin space.

A forest's export averages its trees; a boosted model's must add its trees' leaf weights onto the base score
(tree t to margin t mod K) and apply its link. Checked with onnxruntime and Treelite's own predictor against
fedforest's predictions, binary (sigmoid), multiclass (softmax) and regression (identity), and through the
CLI on a registered version.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedcore.cli import main
from fedcore.horizontal.boosting.estimators import HorizontalBoostingClassifier, HorizontalBoostingRegressor
from fedcore.models import signing
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

ROUNDS = 8
def _fit(estimator, rows: pd.DataFrame, label: str, values) -> object:
    return estimator(ROUNDS, max_depth=4, learning_rate=0.5, allow_data_ranges=True, categories=CATEGORIES,
                     random_state=2).fit(two_parties(rows.assign(**{label: values})), label=label)


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    return export_table(600, 7)


@pytest.fixture(scope="module")
def models(rows) -> dict[str, object]:
    amount = rows["amount"].fillna(0)
    return {
        "binary": _fit(HorizontalBoostingClassifier, rows, "churned",
                       np.where(amount + (rows["plan"] == "gold") > 0.4, "yes", "no")),
        "multiclass": _fit(HorizontalBoostingClassifier, rows, "outcome",
                           np.where(rows["plan"] == "gold", "churn",
                                    np.where(amount > 0, "stay", "downgrade"))),
        "regression": _fit(HorizontalBoostingRegressor, rows, "spend",
                           3 * amount + rows["age"] / 10 + (rows["plan"] == "plus") * 2),
    }


def _margin_bound(model) -> float:
    """How far onnxruntime's float32 margins may be from fedforest's float64 ones.

    The base score and each of the T leaf weights are rounded once to float32 and each of the T additions
    once, every term and partial sum at most S = |base score| + the trees' largest |leaf weight| summed.
    """
    forest = model.model_
    leaves = forest.feature < 0
    largest = np.zeros(forest.n_trees)
    np.maximum.at(largest, forest.tree[leaves], np.abs(forest.value[leaves, 0]))
    scale = float(np.abs(forest.combination.base_score).max() + largest.sum())
    return (2 * forest.n_trees + 1) * scale * 2.0 ** -24


LINK_BOUND = 4 * 2.0 ** -24
"""A float32 sigmoid or softmax is within a few float32 ulps of 1 of the exact value; its inputs' error
carries through at most once (both maps are 1-Lipschitz in the largest coordinate)."""


def test_the_models_are_boosted_with_their_links(models) -> None:
    links = {name: model.model_.combination for name, model in models.items()}
    assert {name: (c.kind, c.link, c.trees_per_round) for name, c in links.items()} == {
        "binary": ("sum", "sigmoid", 1), "multiclass": ("sum", "softmax", 3),
        "regression": ("sum", "identity", 1)}
    assert all(any(b != 0 for b in c.base_score) for c in links.values())  # the base score counts


@pytest.mark.parametrize("name", ["binary", "multiclass"])
def test_onnx_classifier_predicts_as_fedforest(models, name) -> None:
    model = models[name]
    assert_onnx_classifier_matches(model, export_table(300, 11), _margin_bound(model) + LINK_BOUND)


def test_onnx_regressor_within_float32_rounding(models, rows) -> None:
    model = models["regression"]
    (values,) = onnx_run(model.to_onnx(), model.schema_.encode(rows))
    np.testing.assert_allclose(values[:, 0], model.predict(rows), rtol=0, atol=_margin_bound(model))


@pytest.mark.parametrize("name", ["binary", "multiclass", "regression"])
def test_treelite_equals_fedforest(models, rows, name) -> None:
    """Treelite's margins are fedforest's up to the order of a float64 sum; its link, within LINK_BOUND.

    Its softmax runs at float32's precision (measured: 5.7e-8 from the float64 one).
    """
    model = models[name]
    X = model.schema_.encode(rows)
    forest = model.model_
    exported = model.to_treelite()
    margins = treelite.gtil.predict(exported, X, pred_margin=True).reshape(len(X), -1)
    np.testing.assert_allclose(margins, forest.combination.margins(forest.value[forest.apply(X)]),
                               rtol=1e-12, atol=1e-15)
    # a regression's output is its margin: the float64 sum's order only
    regression = name == "regression"
    np.testing.assert_allclose(treelite_predict(exported, X), forest.predict_values(X),
                               rtol=1e-12 if regression else 0, atol=1e-15 if regression else LINK_BOUND)


@pytest.mark.parametrize("name", ["binary", "multiclass", "regression"])
def test_contributions_add_up_to_the_margins(models, rows, name) -> None:
    """As XGBoost's pred_contribs, in margin space: a row's columns sum to its margin (the link's input).

    The bias column is the base score plus the trees' expected leaf weights.
    """
    model = models[name]
    head = rows.head(40)
    forest = model.model_
    margins = forest.combination.margins(forest.value[forest.apply(model.schema_.encode(head))])
    explained = model.predict_contributions(head)
    if margins.shape[1] == 1:
        assert explained.shape == (40, model.schema_.n_features + 1)
        explained = explained[:, None, :]
    else:
        assert explained.shape == (40, margins.shape[1], model.schema_.n_features + 1)
    np.testing.assert_allclose(explained.sum(axis=2), margins, rtol=0, atol=1e-9)


def test_cli_exports_a_registered_boosted_version(capsys, models, rows, tmp_path) -> None:
    model = models["multiclass"]
    key = tmp_path / "master.pem"
    signing.generate_signing_key(key)
    registry = ModelRegistry(tmp_path / "registry", signing_key=key)
    registry.register("churn", {"algorithm": "boosting", "setting": "horizontal", "task": "classification",
                                "metrics": {"accuracy": 0.9}}, {"model": model.model_.to_table()})
    X = model.schema_.encode(rows)
    expected = model.model_.predict_values(X)
    for fmt in ("onnx", "treelite"):
        out = tmp_path / f"churn.{fmt}"
        code = main(["models", "export", "--registry", str(registry.root), "--public-key",
                     str(key.with_name("master.pem.pub")), "--model", "churn", "--format", fmt,
                     "--out", str(out)])
        assert code == 0, capsys.readouterr().err
        if fmt == "onnx":
            session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
            np.testing.assert_allclose(session.run(None, {"X": X})[1], expected, rtol=0,
                                       atol=_margin_bound(model) + LINK_BOUND)
        else:
            np.testing.assert_allclose(treelite_predict(treelite.Model.deserialize(str(out)), X), expected,
                                       rtol=0, atol=LINK_BOUND)
