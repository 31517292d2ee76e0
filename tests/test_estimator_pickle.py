"""Every fitted estimator, in every privacy mode, pickles and unpickles to the same model (issue #28).

pickle and joblib (which MLflow and Prefect result persistence use) round trips give the same predictions
and the same fitted attributes, and `clone` still makes an unfitted copy. What serves only one training
session (progress bar, signing identities, sealing and masking keys, encrypted-label worker processes) is
not pickled.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable

import joblib
import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone

from fedcore.data.split import split_horizontal, split_vertical
from fedcore.estimator_api import ClassifierMixin
from fedcore.horizontal import FederatedExtraTreesClassifier, FederatedExtraTreesRegressor, PPDERTClassifier
from fedcore.models.artifacts import table_sha256
from fedcore.models.tables import master_table, party_table
from fedcore.privacy.schemes import scheme
from fedcore.vertical.estimators import FederatedForestClassifier, FederatedForestRegressor
from fedcore.vertical.party import VerticalParty
from tests.conftest import mixed_table

SMALL = {"n_estimators": 2, "max_depth": 3}
VERTICAL = (FederatedForestClassifier, FederatedForestRegressor)


def _key(mode: str):
    return scheme(mode).generate(1024, insecure_for_tests=True)


CASES: dict[str, Callable[[], object]] = {
    "forest classifier": lambda: FederatedForestClassifier(**SMALL, progress=True, record_payloads=True),
    "forest regressor": lambda: FederatedForestRegressor(**SMALL),
    "forest classifier paillier": lambda: FederatedForestClassifier(**SMALL, privacy="paillier",
                                                                    label_key=_key("paillier")),
    "forest regressor ou": lambda: FederatedForestRegressor(**SMALL, privacy="ou", label_key=_key("ou")),
    "extra-trees classifier": lambda: FederatedExtraTreesClassifier(**SMALL, progress=True,
                                                                    record_transcript=True),
    "extra-trees classifier ldp": lambda: FederatedExtraTreesClassifier(**SMALL, privacy="ldp",
                                                                        allow_data_ranges=True),
    "extra-trees classifier gdp": lambda: FederatedExtraTreesClassifier(**SMALL, privacy="gdp", epsilon=2.0,
                                                                        allow_data_ranges=True),
    "extra-trees regressor": lambda: FederatedExtraTreesRegressor(**SMALL),
    "extra-trees regressor gdp": lambda: FederatedExtraTreesRegressor(**SMALL, privacy="gdp",
                                                                      allow_data_ranges=True),
    "ppd-ert histogram": lambda: PPDERTClassifier(**SMALL, allow_data_ranges=True, progress=True),
    "ppd-ert domain": lambda: PPDERTClassifier(**SMALL, allow_data_ranges=True, thresholds="domain"),
    "ppd-ert plain counts": lambda: PPDERTClassifier(**SMALL, allow_data_ranges=True,
                                                     secure_aggregation=False),
}

OBJECTS = {"master_", "parties_", "transport_", "model_", "schema_", "label_holder_"}
"""Fitted attributes that are the simulation's objects: compared through the model tables and predictions."""


def _table(estimator) -> pd.DataFrame:
    task = "classification" if isinstance(estimator, ClassifierMixin) else "regression"
    table = mixed_table(n_rows=160, seed=5, task=task, n_classes=2)
    if not isinstance(estimator, VERTICAL):  # horizontal: one agreed category list per string column
        strings = table["cat_str"]
        table["cat_str"] = pd.Categorical(strings, categories=sorted(strings.dropna().unique()))
    return table


def _fit(estimator, table: pd.DataFrame):
    """The fitted estimator and what its predict takes."""
    if isinstance(estimator, VERTICAL):
        parties = split_vertical(table, 2, label="target", seed=1)
        return estimator.fit(parties, label="target"), [p.drop(columns="target", errors="ignore")
                                                        for p in parties]
    return estimator.fit(split_horizontal(table, 2, seed=1), label="target"), table.drop(columns="target")


def _fitted_attributes(model) -> dict[str, object]:
    """Every public fitted attribute (set by fit, or a property of the fitted model) but the objects."""
    names = {n for n in vars(model) if n.endswith("_") and not n.startswith("_")}
    names |= {n for n in dir(type(model)) if n.endswith("_") and not n.startswith("_")}
    values = {}
    for name in sorted(names - OBJECTS):
        try:
            values[name] = getattr(model, name)
        except AttributeError:  # e.g. transcript_ when none was recorded
            continue
    return values


def _assert_equal(name: str, a, b) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), name
        for key in a:
            _assert_equal(f"{name}[{key!r}]", a[key], b[key])
    elif isinstance(a, pd.Series):
        pd.testing.assert_series_equal(a, b)
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=name)
    elif isinstance(a, list) and a and not isinstance(a[0], (int, float, str)):
        assert len(a) == len(b), name
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_equal(f"{name}[{i}]", vars(x) if hasattr(x, "__dict__") else x,
                          vars(y) if hasattr(y, "__dict__") else y)
    else:
        assert a == b, name


def _model_digests(model) -> list[str]:
    """Digests of the learned model's tables: the master's and every party's (vertical), or the forest's."""
    if isinstance(model, VERTICAL):
        tables = [master_table(model.master_.structure)] + [party_table(p.model) for p in model.parties_]
    else:
        tables = [model.model_.to_table()]
    return [table_sha256(table) for table in tables]


@pytest.fixture(scope="module", params=list(CASES))
def fitted(request):
    estimator = CASES[request.param]()
    table = _table(estimator)
    return _fit(estimator, table)


@pytest.mark.parametrize("round_trip", ["pickle", "joblib"])
def test_a_fitted_estimator_unpickles_to_the_same_model(fitted, round_trip: str, tmp_path) -> None:
    model, X = fitted
    if round_trip == "pickle":
        loaded = pickle.loads(pickle.dumps(model))
    else:
        joblib.dump(model, tmp_path / "model.joblib")
        loaded = joblib.load(tmp_path / "model.joblib")
    assert type(loaded) is type(model) and loaded.get_params().keys() == model.get_params().keys()
    assert _model_digests(loaded) == _model_digests(model)
    methods = ["predict", "predict_proba"] if hasattr(model, "predict_proba") else ["predict"]
    for method in methods:  # vertical prediction crosses each one's own in-process transport
        np.testing.assert_array_equal(getattr(loaded, method)(X), getattr(model, method)(X))
    before, after = _fitted_attributes(model), _fitted_attributes(loaded)
    assert {"communication_", "rounds_", "fit_seconds_", "feature_importances_"} <= set(before)
    assert list(after) == list(before)
    for name in before:
        _assert_equal(name, after[name], before[name])
    copy = clone(loaded)
    assert type(copy) is type(model) and not copy.__sklearn_is_fitted__()
    assert copy.get_params().keys() == model.get_params().keys()


def test_session_secrets_are_not_pickled(fitted) -> None:
    model, _ = fitted
    loaded = pickle.loads(pickle.dumps(model))
    assert loaded.master_.progress is None and loaded.master_.grower.progress is None
    for party in loaded.parties_:
        assert getattr(party, "identity", None) is None  # FET's parties have none
        if isinstance(party, VerticalParty):
            assert (party._sealing, party._label_crypto, party._passive_crypto) == (None, None, None)
        elif isinstance(model, PPDERTClassifier):
            assert party.aggregator is None and party._secret == b""


def test_an_estimator_whose_passive_party_keeps_worker_processes_pickles(monkeypatch) -> None:
    """Encrypted labels over worker processes: the pickle leaves them out; the original keeps its own."""
    from fedcore.privacy import gmp_workers

    monkeypatch.setattr(gmp_workers, "MIN_ROWS", 1)
    monkeypatch.setattr(gmp_workers.os, "cpu_count", lambda: 2)
    model = FederatedForestClassifier(n_estimators=1, max_depth=2, privacy="paillier",
                                      label_key=_key("paillier"))
    model, X = _fit(model, _table(model))
    passive = next(p for p in model.parties_ if not p.is_label_holder)
    assert passive._passive_crypto is not None and passive._passive_crypto.pool is not None
    loaded = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(loaded.predict_proba(X), model.predict_proba(X))
    assert passive._passive_crypto.pool is not None  # the fitted estimator's own state is untouched
    passive._passive_crypto.close()
