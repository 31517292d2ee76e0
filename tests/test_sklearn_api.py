"""The simulation estimators follow scikit-learn's estimator conventions (fedcore/estimator_api.py).

scikit-learn's own checks (sklearn.utils.estimator_checks) that run, on all five estimators:

- without fitting: check_estimator_cloneable, check_estimator_repr, check_get_params_invariance,
  check_set_params, check_parameters_default_constructible, check_no_attributes_set_in_init,
  check_do_not_raise_errors_in_init_or_set_params, check_valid_tag_types, check_estimator_tags_renamed;
- check_estimators_unfitted (predict and predict_proba before fit), with the check's NotFittedError
  swapped for fedcore's: production code does not import scikit-learn, so fedcore raises its own, an
  AttributeError and a ValueError like scikit-learn's, with the same message (tested below as well);
- the checks that fit, through `one_party`: the estimators' `fit` takes party DataFrames and the label's
  column name (vertical: one frame per party, the same rows; horizontal: one frame per institution, the
  same columns), never a single array X and a y. `one_party(cls)` is a test-only subclass whose fit(X, y)
  and predict(X) put the array into one party's DataFrame (one party holding every column and the label:
  the single-party run of the same engine) and call the estimator unchanged. Through it run
  check_estimators_fit_returns_self, check_dont_overwrite_parameters, check_estimators_overwrite_params,
  check_fit_check_is_fitted, check_n_features_in, check_fit_idempotent, check_methods_subset_invariance,
  check_methods_sample_order_invariance, check_estimators_pickle, check_classifiers_one_label,
  check_classifiers_classes, check_regressors_train and check_regressors_int; and GridSearchCV itself.

Not run: the checks of how a single array X is validated (check_fit2d_predict1d, check_fit1d,
check_fit2d_1sample, check_estimators_empty_data_messages, check_estimators_dtypes, check_dtype_object,
check_complex_data, check_estimators_nan_inf, check_n_features_in_after_fitting, check_supervised_y_2d,
check_requires_y_none, check_fit_score_takes_y, check_dataframe_column_names_consistency, the sparse and
array-API checks): that validation would be the adapter's, not the estimators'. check_classifiers_train too:
it expects predict to refuse an array with more columns, but the estimators select the trained columns of a
DataFrame by name and ignore others (a prediction frame may keep the label column). Sample weights, class
weights, multi-output, partial_fit, transformers, clusterers and outlier detectors: not features of these
estimators. check_mixin_order: only about scikit-learn's own mixins. Pickling in every privacy mode:
tests/test_estimator_pickle.py.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone, is_classifier, is_regressor
from sklearn.ensemble import ExtraTreesClassifier, RandomForestClassifier, RandomForestRegressor
from sklearn.exceptions import NotFittedError as SklearnNotFittedError
from sklearn.metrics import accuracy_score, r2_score
from sklearn.model_selection import GridSearchCV
from sklearn.utils import estimator_checks
from sklearn.utils.validation import check_is_fitted

from fedcore import errors
from fedcore.data.split import split_vertical
from fedcore.estimator_api import NotFittedError, impurity_importances, node_impurity_decrease, r2
from fedcore.horizontal import FederatedExtraTreesClassifier, FederatedExtraTreesRegressor, PPDERTClassifier
from fedcore.vertical.estimators import FederatedForestClassifier, FederatedForestRegressor
from tests.thresholds import assert_decides_at_thresholds

SMALL = {"n_estimators": 3, "max_depth": 3}
ESTIMATORS = {
    "FederatedForestClassifier": lambda: FederatedForestClassifier(**SMALL),
    "FederatedForestRegressor": lambda: FederatedForestRegressor(**SMALL),
    "FederatedExtraTreesClassifier": lambda: FederatedExtraTreesClassifier(**SMALL),
    "FederatedExtraTreesRegressor": lambda: FederatedExtraTreesRegressor(**SMALL),
    "PPDERTClassifier": lambda: PPDERTClassifier(**SMALL, allow_data_ranges=True),
}
VERTICAL = (FederatedForestClassifier, FederatedForestRegressor)

UNFITTED_CHECKS = [
    "check_estimator_cloneable", "check_estimator_repr", "check_get_params_invariance", "check_set_params",
    "check_parameters_default_constructible", "check_no_attributes_set_in_init",
    "check_do_not_raise_errors_in_init_or_set_params", "check_valid_tag_types",
    "check_estimator_tags_renamed",
]
FIT_CHECKS = [
    "check_estimators_fit_returns_self", "check_dont_overwrite_parameters",
    "check_estimators_overwrite_params", "check_fit_check_is_fitted", "check_n_features_in",
    "check_fit_idempotent", "check_methods_subset_invariance", "check_methods_sample_order_invariance",
    "check_estimators_pickle",
]
CLASSIFIER_CHECKS = ["check_classifiers_one_label", "check_classifiers_classes"]
REGRESSOR_CHECKS = ["check_regressors_train", "check_regressors_int"]


# -- the one-party adapter: arrays in, one party's DataFrame to the estimator ------------------------
LABEL = "target"


def _frame(X) -> pd.DataFrame:
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"Expected a 2D array, got {X.ndim}D")
    return pd.DataFrame(X, columns=[f"x{i}" for i in range(X.shape[1])])


@functools.cache
def one_party(cls: type) -> type:
    """`cls` with fit(X, y) / predict(X) / predict_proba(X) on arrays, as one party holding every column."""
    vertical = issubclass(cls, VERTICAL)

    def rows(X):
        if isinstance(X, (list, pd.DataFrame)):  # already the estimator's input (predict calls predict_proba)
            return X
        return [_frame(X)] if vertical else _frame(X)

    class OneParty(cls):
        def fit(self, X, y):
            frame = _frame(X)
            y = np.asarray(y)
            if len(y) != len(frame):
                raise ValueError(f"X has {len(frame)} rows but y has {len(y)} values")
            frame[LABEL] = y
            return super().fit([frame], label=LABEL)

        def predict(self, X, *method):
            return super().predict(rows(X), *method)

    if hasattr(cls, "predict_proba"):
        OneParty.predict_proba = lambda self, X, *method: cls.predict_proba(self, rows(X), *method)
    OneParty.__name__ = OneParty.__qualname__ = f"OneParty{cls.__name__}"
    globals()[OneParty.__name__] = OneParty  # pickle finds a class by its module and name
    return OneParty


def _adapted(name: str):
    estimator = ESTIMATORS[name]()
    return one_party(type(estimator))(**estimator.get_params())


def _checks(names: list[str], estimators=ESTIMATORS) -> list:
    return [pytest.param(e, c, id=f"{e}-{c}") for e in estimators for c in names]


@pytest.mark.parametrize(("name", "check"), _checks(UNFITTED_CHECKS))
def test_sklearn_checks_without_fitting(name: str, check: str) -> None:
    getattr(estimator_checks, check)(name, ESTIMATORS[name]())


@pytest.mark.parametrize("name", ESTIMATORS)
def test_sklearn_unfitted_check_with_fedcore_not_fitted_error(name: str, monkeypatch) -> None:
    monkeypatch.setattr(estimator_checks, "NotFittedError", NotFittedError)
    estimator_checks.check_estimators_unfitted(name, ESTIMATORS[name]())


FITTING = (_checks(FIT_CHECKS)
           + _checks(CLASSIFIER_CHECKS, [n for n in ESTIMATORS if "Classifier" in n])
           + _checks(REGRESSOR_CHECKS, [n for n in ESTIMATORS if "Regressor" in n]))


@pytest.mark.parametrize(("name", "check"), FITTING)
def test_sklearn_checks_that_fit_one_party(name: str, check: str) -> None:
    getattr(estimator_checks, check)(name, _adapted(name))


@pytest.mark.parametrize("name", ["FederatedForestClassifier", "FederatedExtraTreesRegressor"])
def test_grid_search_clones_and_sets_parameters(name: str) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 3))
    y = X[:, 0] + 0.1 * rng.normal(size=80)
    if "Classifier" in name:
        y = np.where(y > 0, "yes", "no")
    estimator = _adapted(name)
    search = GridSearchCV(estimator, {"max_depth": [1, 4], "n_estimators": [2]}, cv=2).fit(X, y)
    assert [p["max_depth"] for p in search.cv_results_["params"]] == [1, 4]
    assert np.all(np.isfinite(search.cv_results_["mean_test_score"]))
    best = search.best_estimator_
    assert best is not estimator and best.n_estimators == 2
    assert best.max_depth == search.best_params_["max_depth"]
    assert best.params_.max_depth == best.max_depth  # refitted with the chosen parameters
    assert not estimator.__sklearn_is_fitted__() and estimator.max_depth == 3  # the search fitted clones


# -- parameters: stored, read, set and cloned; checked by fit -----------------------------------------
def _table(n_rows: int = 160, seed: int = 0, task: str = "classification") -> pd.DataFrame:
    """A table whose column `signal` carries the label, `weak` a little, `noise` nothing."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"signal": rng.normal(size=n_rows), "noise": rng.normal(size=n_rows),
                          "weak": rng.normal(size=n_rows), "noise2": rng.normal(size=n_rows)})
    score = frame["signal"] + 0.3 * frame["weak"]
    frame[LABEL] = (score + 0.05 * rng.normal(size=n_rows) if task == "regression"
                    else np.where(score > 0, "a", "b"))
    return frame


def _vertical_parties(table: pd.DataFrame, n_parties: int = 2) -> list[pd.DataFrame]:
    return split_vertical(table, n_parties, label=LABEL, seed=1)


def _row_split(table: pd.DataFrame, n_parties: int) -> list[pd.DataFrame]:
    return [table.iloc[rows].reset_index(drop=True)
            for rows in np.array_split(np.arange(len(table)), n_parties)]


def _features(parties: list[pd.DataFrame]) -> list[pd.DataFrame]:
    return [p.drop(columns=LABEL, errors="ignore") for p in parties]


def _fit(name: str, table: pd.DataFrame, n_parties: int = 2, **params):
    """A fitted estimator and the X its predict takes."""
    model = ESTIMATORS[name]().set_params(**params)
    if isinstance(model, VERTICAL):
        parties = _vertical_parties(table, n_parties)
        return model.fit(parties, label=LABEL), _features(parties)
    return model.fit(_row_split(table, n_parties), label=LABEL), table.drop(columns=LABEL)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_parameters_are_attributes_and_fit_checks_them(name: str) -> None:
    model = ESTIMATORS[name]()
    assert model.n_estimators == 3 and model.max_depth == 3  # stored as given
    assert model.get_params()["n_estimators"] == 3
    assert f"{type(model).__name__}(" in repr(model) and "max_depth=3" in repr(model)
    assert "random_state" not in repr(model)  # defaults are left out
    bad = clone(model).set_params(n_estimators=0)  # no check at construction or set_params
    with pytest.raises(errors.ParameterError, match="n_estimators must be an integer >= 1, got 0"):
        bad.params  # noqa: B018  (the validated parameters, on demand)
    table = _table(task="classification" if is_classifier(model) else "regression")
    with pytest.raises(errors.ParameterError, match="n_estimators must be an integer >= 1, got 0"):
        _fit(name, table, n_estimators=0)
    with pytest.raises(errors.ParameterError, match="Invalid parameter 'n_trees'"):
        model.set_params(n_trees=5)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_fit_sets_only_trailing_underscore_attributes_and_clone_gives_an_unfitted_copy(name: str) -> None:
    model = ESTIMATORS[name]()
    before = dict(vars(model))
    assert not model.__sklearn_is_fitted__()
    table = _table(task="classification" if is_classifier(model) else "regression")
    model, X = _fit(name, table)
    added = set(vars(model)) - set(before)
    assert added and all(a.endswith("_") or a.startswith("_") for a in added), sorted(added)
    assert all(vars(model)[k] is v for k, v in before.items())  # parameters untouched
    check_is_fitted(model)
    assert model.params == model.params_ and model.params_.n_estimators == 3
    copy = clone(model)
    assert type(copy) is type(model) and copy.get_params() == model.get_params()
    assert not copy.__sklearn_is_fitted__() and not hasattr(copy, "n_features_in_")
    with pytest.raises(SklearnNotFittedError):
        check_is_fitted(copy)
    # a grid-search-like loop: set_params, fit, score
    scores = [model.set_params(max_depth=depth).fit(*_fit_args(name, table)).score(X, table[LABEL])
              for depth in (1, 3)]
    assert model.params_.max_depth == 3 and all(np.isfinite(scores))


@pytest.mark.parametrize("name", ESTIMATORS)
def test_communication_rounds_and_transcript_read_the_same_way_in_both_settings(name: str) -> None:
    model = ESTIMATORS[name]()
    for attribute in ("communication_", "rounds_", "transcript_"):
        assert not hasattr(model, attribute)
    table = _table(task="classification" if is_classifier(model) else "regression")
    model, X = _fit(name, table)
    trained = model.communication_
    assert model.rounds_ == trained["rounds"] > 0
    with pytest.raises(NotFittedError, match="no transcript: fit with record_transcript=True"):
        model.transcript_  # noqa: B018
    model.predict(X)  # vertical prediction crosses the wire; horizontal prediction is local
    assert (model.rounds_ > trained["rounds"]) == isinstance(model, VERTICAL)
    recorded, _ = _fit(name, table, record_transcript=True)
    assert len(recorded.transcript_) == recorded.communication_["messages"]


def _fit_args(name: str, table: pd.DataFrame):
    if issubclass(type(ESTIMATORS[name]()), VERTICAL):
        return _vertical_parties(table), LABEL
    return _row_split(table, 2), LABEL


def test_classifier_and_regressor_are_recognised() -> None:
    for name, make in ESTIMATORS.items():
        model = make()
        assert is_classifier(model) == ("Classifier" in name)
        assert is_regressor(model) == ("Regressor" in name)


# -- not fitted: the same error from predict and predict_proba, scikit-learn's message -----------------
@pytest.mark.parametrize("name", ESTIMATORS)
def test_unfitted_predict_and_predict_proba_raise_the_same_not_fitted_error(name: str) -> None:
    model = ESTIMATORS[name]()
    X = _vertical_parties(_table(10)) if isinstance(model, VERTICAL) else _table(10).drop(columns=LABEL)
    with pytest.raises(SklearnNotFittedError) as sklearn_error:
        check_is_fitted(model)
    methods = ["predict", "predict_proba"] if hasattr(model, "predict_proba") else ["predict"]
    for method in methods:
        with pytest.raises(NotFittedError) as raised:
            getattr(model, method)(X)
        assert isinstance(raised.value, ValueError) and isinstance(raised.value, AttributeError)
        assert isinstance(raised.value, errors.NotFittedError)
        assert str(raised.value) == str(sklearn_error.value)
    for attribute in ("n_features_in_", "feature_names_in_", "feature_importances_", "params_"):
        assert not hasattr(model, attribute)
    if is_classifier(model):
        assert not hasattr(model, "classes_")
    with pytest.raises(NotFittedError):
        model.score(X, np.zeros(10))


# -- score -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ESTIMATORS)
def test_score_is_accuracy_or_r2_of_predict(name: str) -> None:
    model = ESTIMATORS[name]()
    table = _table(task="classification" if is_classifier(model) else "regression")
    model, X = _fit(name, table)
    y = table[LABEL]
    weight = np.random.default_rng(1).random(len(y))
    reference = accuracy_score if is_classifier(model) else r2_score
    assert model.score(X, y) == pytest.approx(reference(y, model.predict(X)), rel=1e-12)
    assert model.score(X, y, sample_weight=weight) == pytest.approx(
        reference(y, model.predict(X), sample_weight=weight), rel=1e-12)
    assert model.n_features_in_ == 4
    assert sorted(model.feature_names_in_) == ["noise", "noise2", "signal", "weak"]


def test_r2_is_well_conditioned_and_matches_scikit_learn_on_constant_targets() -> None:
    rng = np.random.default_rng(0)
    y = rng.normal(size=1000)
    p = y + 0.1 * rng.normal(size=1000)
    assert r2(y + 1e8, p + 1e8) == pytest.approx(r2_score(y, p), rel=1e-6)
    assert r2(np.full(5, 3.0), np.full(5, 3.0)) == r2_score(np.full(5, 3.0), np.full(5, 3.0)) == 1.0
    assert r2(np.full(5, 3.0), np.arange(5.0)) == r2_score(np.full(5, 3.0), np.arange(5.0)) == 0.0
    with pytest.raises(errors.InputError, match="y has 5 values but there are 4 predictions"):
        r2(np.zeros(5), np.zeros(4))


# -- feature importances ------------------------------------------------------------------------------
def _sklearn_nodes(forest) -> dict[str, np.ndarray]:
    """A fitted scikit-learn forest's nodes in fedcore's layout.

    Sorted by (tree, node), with per-tree child ids.
    """
    trees = [e.tree_ for e in forest.estimators_]
    value = np.concatenate([t.value[:, 0, :] for t in trees])
    if is_classifier(forest):
        # class fractions (as scikit-learn >= 1.4 stores them)
        value = value / value.sum(axis=1, keepdims=True)
    return {
        "tree": np.concatenate([np.full(t.node_count, i) for i, t in enumerate(trees)]),
        "left": np.concatenate([t.children_left for t in trees]),
        "right": np.concatenate([t.children_right for t in trees]),
        "weight": np.concatenate([t.weighted_n_node_samples for t in trees]),
        "value": value,
        "feature": np.concatenate([np.where(t.children_left >= 0, t.feature, -1) for t in trees]),
    }


@pytest.mark.parametrize(("forest", "criterion"), [
    (RandomForestClassifier, "gini"), (RandomForestClassifier, "entropy"),
    (RandomForestClassifier, "log_loss"), (ExtraTreesClassifier, "gini"),
    (RandomForestRegressor, "squared_error"),
])
def test_importances_equal_scikit_learns_on_the_same_trees(forest, criterion: str) -> None:
    table = _table(200, seed=3, task="regression" if forest is RandomForestRegressor else "classification")
    X, y = table.drop(columns=LABEL).to_numpy(), table[LABEL].to_numpy()
    reference = forest(n_estimators=6, criterion=criterion, max_depth=5, random_state=0).fit(X, y)
    n = _sklearn_nodes(reference)
    decrease = node_impurity_decrease(n["tree"], n["left"], n["right"], n["weight"], n["value"], criterion, 6)
    ours = impurity_importances(decrease, n["tree"], 6, n["feature"], X.shape[1])
    np.testing.assert_allclose(ours, reference.feature_importances_, rtol=1e-10, atol=1e-14)


def test_the_decrease_equals_the_difference_of_weighted_gini_impurities_on_a_vertical_forest() -> None:
    model, _ = _fit("FederatedForestClassifier", _table(), n_estimators=4, max_depth=4)
    s = model.master_.structure
    gini = 1.0 - (s.value ** 2).sum(axis=1)
    offsets = s.tree_offsets()[s.tree]
    split = s.left >= 0
    left, right = (offsets + s.left)[split], (offsets + s.right)[split]
    expected = s.weight[split] * gini[split] - s.weight[left] * gini[left] - s.weight[right] * gini[right]
    decrease = node_impurity_decrease(s.tree, s.left, s.right, s.weight, s.value, "gini", s.n_trees)
    np.testing.assert_allclose(decrease[split], expected, rtol=1e-9, atol=1e-9)
    assert np.all(decrease[~split] == 0)


def _assert_importance_properties(importances: pd.Series) -> None:
    assert np.all(importances >= 0) and importances.sum() == pytest.approx(1.0, abs=1e-12)
    assert importances["signal"] > 0.5
    assert importances["noise"] < 0.1 * importances["signal"]
    assert importances["noise2"] < 0.1 * importances["signal"]


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_vertical_importances_per_party_assemble_to_the_single_party_vector(task: str) -> None:
    name = "FederatedForestClassifier" if task == "classification" else "FederatedForestRegressor"
    table = _table(task=task)
    federated, _ = _fit(name, table, n_parties=3, n_estimators=5, max_depth=4)
    single, _ = _fit(name, table, n_parties=1, n_estimators=5, max_depth=4)
    per_party = federated.feature_importances_
    assert list(per_party) == [p.name for p in federated.parties_]
    for party in federated.parties_:
        assert list(per_party[party.name].index) == party.model.column_names  # each party: its own columns
    assembled = pd.concat(per_party.values())
    assert list(assembled.index) == list(federated.feature_names_in_)
    (whole,) = single.feature_importances_.values()
    pd.testing.assert_series_equal(assembled.sort_index(), whole.sort_index(), rtol=1e-12)
    _assert_importance_properties(assembled)


@pytest.mark.parametrize("name",
                         ["FederatedExtraTreesClassifier", "FederatedExtraTreesRegressor",
                          "PPDERTClassifier"])
def test_horizontal_importances_are_one_vector_equal_for_any_split_of_the_rows(name: str) -> None:
    task = "classification" if "Classifier" in name else "regression"
    table = _table(task=task)
    federated, _ = _fit(name, table, n_parties=3, n_estimators=8, max_depth=4)
    single, _ = _fit(name, table, n_parties=1, n_estimators=8, max_depth=4)
    importances = federated.feature_importances_
    assert isinstance(importances, np.ndarray) and importances.shape == (federated.n_features_in_,)
    np.testing.assert_allclose(importances, single.feature_importances_, rtol=1e-12)
    _assert_importance_properties(pd.Series(importances, index=federated.feature_names_in_))


def test_a_loaded_vertical_model_has_the_fitted_attributes(tmp_path) -> None:
    table = _table()
    model, X = _fit("FederatedForestClassifier", table, n_parties=3)
    model.save(tmp_path / "model")
    loaded = FederatedForestClassifier.load(tmp_path / "model")
    check_is_fitted(loaded)
    assert loaded.params_ == model.params_ and loaded.get_params() == model.get_params()
    assert loaded.n_features_in_ == 4 and list(loaded.feature_names_in_) == list(model.feature_names_in_)
    for name, importances in model.feature_importances_.items():
        pd.testing.assert_series_equal(loaded.feature_importances_[name], importances)
    assert loaded.score(X, table[LABEL]) == model.score(X, table[LABEL])


@pytest.mark.parametrize("name", [n for n in ESTIMATORS if "Classifier" in n])
def test_a_decision_threshold_decides_the_positive_class_at_or_above_it(name: str) -> None:
    model, X = _fit(name, _table())
    assert_decides_at_thresholds(model, X)
