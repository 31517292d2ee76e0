"""Bad input stops at the edge, with a named error whose message says who, what and how to fix it."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from fedcore.errors import (
    ColumnNotFoundError,
    InputError,
    LabelError,
    NotFittedError,
    ParameterError,
    PartyShapeError,
)
from fedcore.horizontal import FederatedExtraTreesClassifier, FederatedExtraTreesRegressor, PPDERTClassifier
from fedcore.horizontal.validation import CategoryMismatchError, SchemaMismatchError
from fedcore.privacy.ldp import LabelLDP


def _frames(n: int = 40, seed: int = 0):
    rng = np.random.default_rng(seed)

    def one(offset):
        return pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n),
                             "y": np.where(np.arange(n) % 2 == 0, "yes", "no")})

    return [one(0), one(1)]


def _raises(error, message, call):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        call()


def test_column_sets_must_match() -> None:
    frames = _frames()
    frames[1]["c"] = 1.0
    _raises(SchemaMismatchError,
            "party 'party1' has columns ['c'] that party 'party0' lacks; every institution must hold the "
            "same columns", lambda: FederatedExtraTreesClassifier(2).fit(frames, "y"))
    frames = _frames()
    frames = {"bank": frames[0], "insurer": frames[1].drop(columns="b")}
    _raises(SchemaMismatchError,
            "party 'insurer' lacks columns ['b'] that party 'bank' has; every institution must hold the same "
            "columns", lambda: FederatedExtraTreesClassifier(2).fit(frames, "y"))


def test_column_types_must_match() -> None:
    frames = _frames()
    frames[1]["b"] = frames[1]["b"].astype(str)
    _raises(SchemaMismatchError,
            "column 'b' is numeric (dtype float64) at party 'party0' but categorical (dtype str) at party "
            "'party1'; give it the same type at every institution",
            lambda: FederatedExtraTreesClassifier(2).fit(frames, "y"))


def test_label_missing_at_a_party() -> None:
    frames = _frames()
    frames[1] = frames[1].drop(columns="y")
    _raises(ColumnNotFoundError, "party 'party1' lacks the label column 'y' (its columns: 'a', 'b'); in the "
            "horizontal setting every institution holds the label",
            lambda: FederatedExtraTreesClassifier(2).fit(frames, "y"))


def test_party_with_zero_rows() -> None:
    frames = _frames()
    frames[1] = frames[1].iloc[:0]
    _raises(PartyShapeError, "party 'party1' has no rows; give it data or leave it out of the federation",
            lambda: FederatedExtraTreesClassifier(2).fit(frames, "y"))


@pytest.mark.parametrize("epsilon", [0, -1.0, float("nan")])
def test_epsilon_must_be_positive(epsilon) -> None:
    _raises(ParameterError,
            f"privacy: epsilon must be a finite number > 0, got {epsilon!r}: smaller epsilon = more noise "
            "and stronger privacy, larger = less noise (typical values 0.1 to 10)",
            lambda: FederatedExtraTreesClassifier(2, privacy="gdp", epsilon=epsilon).fit(_frames(), "y"))


def test_bloom_filter_too_small_for_the_classes() -> None:
    frames = _frames()
    for f, labels in zip(frames, (["a", "b", "c", "d"], ["e", "f", "g", "h"]), strict=True):
        f["y"] = np.resize(labels, len(f))
    model = FederatedExtraTreesClassifier(2, privacy="ldp",
                                          ldp=LabelLDP(mechanism="bloom", n_bits=4, n_hashes=1))
    with pytest.raises(ParameterError, match=re.escape("LDP Bloom patterns with n_bits=4, n_hashes=1 cannot "
                                                       "represent n_classes=8")):
        model.fit(frames, "y")


def test_ldp_refused_for_regression() -> None:
    _raises(ParameterError, "privacy 'ldp' randomizes class labels and works for classification only; use "
            "'gdp' (Gaussian noise) or 'none' for a regression label",
            lambda: FederatedExtraTreesRegressor(2, privacy="ldp").fit(_frames(), "y"))


def test_unknown_privacy_mode() -> None:
    _raises(ParameterError, "algorithm 'extra-trees' supports privacy ['none', 'ldp', 'gdp'], got 'secret'",
            lambda: FederatedExtraTreesClassifier(2, privacy="secret").fit(_frames(), "y"))


def test_bootstrap_refused() -> None:
    _raises(ParameterError,
            "bootstrap=True is not supported by the horizontal engines: Extra-Trees grow every tree on all "
            "rows, which keeps federated runs identical to the pooled run; leave bootstrap=False",
            lambda: FederatedExtraTreesClassifier(2, bootstrap=True).fit(_frames(), "y"))


def test_a_class_at_one_party_only_is_fine() -> None:
    frames = _frames()
    frames[1].loc[:5, "y"] = "maybe"
    model = FederatedExtraTreesClassifier(3, random_state=0).fit(frames, "y")
    assert list(model.classes_) == ["maybe", "no", "yes"]
    assert model.predict_proba(frames[0]).shape == (40, 3)


def test_categories_must_agree() -> None:
    frames = _frames()
    frames[0]["c"] = pd.Categorical(np.resize(["x", "y"], 40), categories=["x", "y"])
    frames[1]["c"] = pd.Categorical(np.resize(["x", "z"], 40), categories=["x", "z"])
    _raises(CategoryMismatchError,
            "column 'c' has categories ['x', 'y'] at party 'party0' but ['x', 'z'] at party 'party1'; use "
            "identical Categorical dtypes or pass categories={'c': [...]}",
            lambda: FederatedExtraTreesClassifier(2).fit(frames, "y"))
    # an explicit list resolves it, and values outside a declared list are refused
    model = FederatedExtraTreesClassifier(2, categories={"c": ["x", "y", "z"]}).fit(frames, "y")
    assert model.schema_.columns[2].categories == ("x", "y", "z")
    _raises(CategoryMismatchError,
            "column 'c' at party 'party1' has values ['z'] outside the declared categories ['x', 'y']; add "
            "them to categories['c'] or clean the data",
            lambda: FederatedExtraTreesClassifier(2, categories={"c": ["x", "y"]}).fit(frames, "y"))


def test_string_column_needs_declared_categories() -> None:
    frames = _frames()
    for f in frames:
        f["c"] = np.resize(["x", "y"], 40).astype(object)
    _raises(InputError,
            "column 'c' at party 'party0' holds str values without an agreed category list; declare it with "
            "categories={'c': [...]} or give it a pandas Categorical dtype with the same categories at every "
            "institution", lambda: FederatedExtraTreesClassifier(2).fit(frames, "y"))


def test_label_problems() -> None:
    frames = _frames()
    frames[1].loc[3, "y"] = None
    _raises(LabelError, "label 'y' at party 'party1' has 1 missing values; drop or fill those rows",
            lambda: FederatedExtraTreesClassifier(2).fit(frames, "y"))
    frames = _frames()
    for f in frames:
        f["y"] = "same"
    _raises(LabelError,
            "label 'y' has a single class 'same' over all parties; classification needs at least two",
            lambda: FederatedExtraTreesClassifier(2).fit(frames, "y"))
    _raises(LabelError, "regression label 'y' at party 'party0' must be numeric, found dtype str",
            lambda: FederatedExtraTreesRegressor(2).fit(frames, "y"))


def test_infinite_feature_values() -> None:
    frames = _frames()
    frames[1].loc[0, "a"] = np.inf
    _raises(InputError,
            "party 'party1' column 'a' holds 1 infinite value (inf or -inf): replace them with missing "
            "values, which every engine handles, or with finite numbers",
            lambda: FederatedExtraTreesClassifier(2).fit(frames, "y"))


def test_ppdert_and_fet_dp_modes_need_declared_ranges() -> None:
    message = ("PPD-ERT and Federated Extra-Trees in privacy gdp or ldp draw thresholds from declared "
               "feature domains, never from the data: pass feature_ranges={column: (low, high)} for the "
               "numeric columns (from the data contracts), or allow_data_ranges=True in a simulation to use "
               "the pooled data's ranges")
    frames = _frames()
    _raises(ParameterError, message, lambda: PPDERTClassifier(2).fit(frames, "y"))
    for mode in ("gdp", "ldp"):
        _raises(ParameterError, message,
                lambda mode=mode: FederatedExtraTreesClassifier(2, privacy=mode, max_depth=3).fit(frames,
                                                                                                    "y"))
    _raises(ParameterError,
            "feature_ranges lacks the numeric columns ['b']; declare a (low, high) for each (from the data "
            "contracts)",
            lambda: FederatedExtraTreesClassifier(2, privacy="gdp", max_depth=3,
                                                  feature_ranges={"a": (-9, 9)}).fit(frames, "y"))
    _raises(ParameterError,
            "feature_ranges lacks the numeric columns ['b']; declare a (low, high) for each (from the data "
            "contracts)", lambda: PPDERTClassifier(2, feature_ranges={"a": (-9, 9)}).fit(frames, "y"))
    _raises(ParameterError, "feature_ranges['b'] must be finite with low <= high, got (3, 1)",
            lambda: PPDERTClassifier(2, feature_ranges={"a": (-9, 9), "b": (3, 1)}).fit(frames, "y"))
    _raises(ColumnNotFoundError,
            "feature_ranges names ['zz'], which are not numeric feature columns (numeric "
            "columns: ['a', 'b'])",
            lambda: PPDERTClassifier(2, feature_ranges={"a": (-9, 9), "b": (-9, 9),
                                                        "zz": (0, 1)}).fit(frames, "y"))
    frames[1].loc[0, "b"] = 20.0
    _raises(InputError,
            "column 'b' at party 'party1' has 1 values outside its declared range [-9.0, 9.0]; fix the data "
            "or the declared range",
            lambda: PPDERTClassifier(2, feature_ranges={"a": (-9, 9), "b": (-9, 9)}).fit(frames, "y"))


def test_pooled_ranges_are_reported() -> None:
    model = PPDERTClassifier(2, allow_data_ranges=True).fit(_frames(), "y")
    assert model.privacy_report_["feature_ranges"].startswith("pooled data (simulation convenience")
    declared = PPDERTClassifier(2, feature_ranges={"a": (-9, 9), "b": (-9, 9)}).fit(_frames(), "y")
    assert declared.privacy_report_["feature_ranges"] == "declared"
    for mode in ("gdp", "ldp"):
        pooled = FederatedExtraTreesClassifier(2, privacy=mode, max_depth=3, allow_data_ranges=True).fit(
            _frames(), "y")
        assert pooled.privacy_report_["feature_ranges"].startswith("pooled data (simulation convenience")
        assert pooled.privacy_report_["min_max"] is None
        declared = FederatedExtraTreesClassifier(2, privacy=mode, max_depth=3,
                                                 feature_ranges={"a": (-9, 9), "b": (-9, 9)})
        declared = declared.fit(_frames(), "y")
        assert declared.privacy_report_["feature_ranges"] == "declared"


def test_hyper_parameters() -> None:
    _raises(ParameterError, "max_depth must be an integer >= 1, got 0",
            lambda: FederatedExtraTreesClassifier(2, max_depth=0).fit(_frames(), "y"))
    _raises(ParameterError, "criterion for regression must be one of ['squared_error'], got 'gini'",
            lambda: FederatedExtraTreesRegressor(2, criterion="gini").fit(_frames(), "y"))
    _raises(ParameterError, "max_features as a fraction must be in (0, 1], got 1.5",
            lambda: PPDERTClassifier(2, max_features=1.5, allow_data_ranges=True).fit(_frames(), "y"))


def test_not_fitted_and_bad_prediction_input() -> None:
    model = FederatedExtraTreesClassifier(2)
    _raises(NotFittedError, "This FederatedExtraTreesClassifier instance is not fitted yet. Call 'fit' with "
            "appropriate arguments before using this estimator.",
            lambda: model.predict(_frames()[0]))
    model.fit(_frames(), "y")
    _raises(ColumnNotFoundError,
            "the frame lacks the schema's feature columns ['b']; every institution must hold every feature "
            "column", lambda: model.predict(_frames()[0].drop(columns="b")))
    _raises(PartyShapeError, "pass a list (or dict) of party DataFrames, not a single DataFrame",
            lambda: FederatedExtraTreesClassifier(2).fit(_frames()[0], "y"))
