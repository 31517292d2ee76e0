"""The complete forest: local prediction, missing values and categories, the Arrow table round trip."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from fedcore.errors import ArtifactError
from fedcore.horizontal import FederatedExtraTreesClassifier, FederatedExtraTreesRegressor, HorizontalForest
from fedcore.horizontal.model import META_KEY
from fedcore.horizontal.schema import CATEGORICAL, NUMERIC, ColumnSpec, HorizontalSchema
from tests.horizontal.common import assert_same_forest, horizontal_table, split_rows


def _stump() -> HorizontalForest:
    """One tree: root splits feature 0 at 0.5; left leaf value 0.25, right leaf 0.75."""
    return HorizontalForest(
        tree=np.zeros(3, np.int32), node=np.arange(3, dtype=np.int32), left=np.array([1, -1, -1], np.int32),
        right=np.array([2, -1, -1], np.int32), depth=np.array([0, 1, 1], np.int16),
        feature=np.array([0, -1, -1], np.int32), threshold=np.array([0.5, np.nan, np.nan]),
        weight=np.array([10.0, 4.0, 6.0]), value=np.array([[0.5], [0.25], [0.75]]), n_trees=1,
        task="regression")


def test_missing_values_go_right() -> None:
    X = np.array([[0.1], [0.5], [0.9], [np.nan]])
    np.testing.assert_array_equal(_stump().predict_values(X)[:, 0], [0.25, 0.25, 0.75, 0.75])


def test_categorical_codes_and_unknown_categories() -> None:
    schema = HorizontalSchema((ColumnSpec("c", CATEGORICAL, ("b", "a", "z")), ColumnSpec("n", NUMERIC)), "y",
                              "regression")
    frame = pd.DataFrame({"c": ["a", "z", None, "unseen"], "n": [1.0, None, 3.0, True]})
    X = schema.encode(frame)
    np.testing.assert_array_equal(X[:, 0], [1.0, 2.0, np.nan, np.nan])
    np.testing.assert_array_equal(X[:, 1], [1.0, np.nan, 3.0, 1.0])
    # unknown categories go right like missing values
    np.testing.assert_array_equal(_stump().predict_values(X[:, :1])[:, 0], [0.75, 0.75, 0.75, 0.75])


def test_missing_values_in_training_go_right() -> None:
    rng = np.random.default_rng(0)
    a = rng.random(400)
    a[rng.random(400) < 0.25] = np.nan
    frame = pd.DataFrame({"a": a, "y": np.where(np.isnan(a), 5.0, a)})
    model = FederatedExtraTreesRegressor(3, max_depth=1, random_state=0).fit(split_rows(frame, 2), "y")
    f = model.model_
    roots = f.tree_offsets()[:-1]
    assert (f.feature[roots] == 0).all()
    prediction = model.predict(pd.DataFrame({"a": [np.nan]}))[0]
    right = roots + f.right[roots]
    assert prediction == pytest.approx(f.value[right, 0].mean())
    # the right children hold every missing row: their weights exceed the missing count
    assert (f.weight[right] >= np.isnan(a).sum()).all()


def test_arrow_table_round_trip() -> None:
    table = horizontal_table(seed=2)
    model = FederatedExtraTreesClassifier(4, random_state=1).fit(split_rows(table, 2), "target")
    arrow = model.model_.to_table()
    assert isinstance(arrow, pa.Table) and arrow.num_rows == model.model_.n_nodes
    back = HorizontalForest.from_table(arrow)
    assert_same_forest(model.model_, back)
    assert back.schema == model.schema_ and back.task == "classification" and back.algorithm == "extra-trees"
    np.testing.assert_array_equal(back.predict_values(model.schema_.encode(table)),
                                  model.predict_proba(table))
    with pytest.raises(ArtifactError, match="not a horizontal forest table"):
        HorizontalForest.from_table(pa.table({"x": [1]}))
    # tables written before the algorithm registry say 'fet': read as extra-trees, written back canonical
    meta = dict(arrow.schema.metadata)
    meta[META_KEY] = meta[META_KEY].replace(b'"extra-trees"', b'"fet"')
    old = HorizontalForest.from_table(arrow.replace_schema_metadata(meta))
    assert old.algorithm == "extra-trees" and b'"extra-trees"' in old.to_table().schema.metadata[META_KEY]


def test_probabilities_are_distributions() -> None:
    table = horizontal_table(seed=2)
    model = FederatedExtraTreesClassifier(4, random_state=1).fit(split_rows(table, 3), "target")
    proba = model.predict_proba(table)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert list(model.classes_) == ["class_0", "class_1", "class_2"]
    assert (model.predict(table) == model.classes_[proba.argmax(axis=1)]).all()
