"""Accuracy sanity against scikit-learn's ExtraTrees, and the noisy modes.

They run, are reproducible under the same seed, report their budget and stay reasonably accurate on easy data.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes, load_wine
from sklearn.ensemble import ExtraTreesClassifier, ExtraTreesRegressor
from sklearn.metrics import r2_score
from sklearn.model_selection import train_test_split

from fedcore.horizontal import FederatedExtraTreesClassifier, FederatedExtraTreesRegressor, PPDERTClassifier
from tests.horizontal.common import assert_same_forest, horizontal_table, split_rows

SEEDS = (0, 1)


def _data(loader):
    frame = loader(as_frame=True).frame
    stratify = frame["target"] if loader is not load_diabetes else None
    return train_test_split(frame, test_size=0.3, random_state=0, stratify=stratify)


def _accuracy(model, test) -> float:
    return float((model.predict(test) == test["target"].to_numpy()).mean())


def _sklearn_accuracy(train, test) -> float:
    X, y = train.drop(columns="target"), train["target"]
    return float(np.mean([(ExtraTreesClassifier(40, random_state=s).fit(X, y)
                            .predict(test.drop(columns="target")) == test["target"]).mean() for s in SEEDS]))


@pytest.mark.parametrize("loader", [load_breast_cancer, load_wine])
def test_fet_matches_sklearn_accuracy(loader) -> None:
    train, test = _data(loader)
    ours = np.mean([_accuracy(FederatedExtraTreesClassifier(40, random_state=s)
                              .fit(split_rows(train, 3), "target"), test) for s in SEEDS])
    reference = _sklearn_accuracy(train, test)
    assert ours >= reference - 0.03, (ours, reference)


def test_ppdert_matches_sklearn_accuracy() -> None:
    train, test = _data(load_breast_cancer)
    ours = np.mean([_accuracy(PPDERTClassifier(40, allow_data_ranges=True, random_state=s).fit(
        split_rows(train, 3), "target"), test) for s in SEEDS])
    assert ours >= _sklearn_accuracy(train, test) - 0.04


def test_fet_regression_matches_sklearn() -> None:
    train, test = _data(load_diabetes)
    ours = FederatedExtraTreesRegressor(40, random_state=0).fit(split_rows(train, 3), "target")
    reference = ExtraTreesRegressor(40, random_state=0).fit(train.drop(columns="target"), train["target"])
    ours_r2 = r2_score(test["target"], ours.predict(test))
    assert ours_r2 >= r2_score(test["target"], reference.predict(test.drop(columns="target"))) - 0.05
    assert ours_r2 > 0.25


@pytest.mark.parametrize("privacy", ["gdp", "ldp"])
def test_noisy_modes_are_reproducible_and_accurate(privacy: str) -> None:
    train, test = _data(load_breast_cancer)
    parties = split_rows(train, 3)
    # gdp: the whole model's budget, spread over 30 trees x 4 levels
    budget = {"epsilon": 8.0, "max_depth": 4} if privacy == "gdp" else {}
    def fit(seed: int, mode: str = privacy):
        return FederatedExtraTreesClassifier(30, privacy=mode, random_state=seed, allow_data_ranges=True,
                                             **(budget if mode == privacy else {})).fit(parties, "target")

    first, again = fit(4), fit(4)
    assert_same_forest(first.model_, again.model_)
    plain = fit(4, "none")
    assert not np.array_equal(first.model_.value, plain.model_.value)  # the noise is real
    other = fit(5)
    assert not np.array_equal(first.model_.threshold, other.model_.threshold, equal_nan=True)
    assert _accuracy(first, test) >= 0.88
    report = first.privacy_report_
    assert report["mode"] == privacy and report["queries"] == first.master_.levels
    if privacy == "gdp":
        assert 0 < report["epsilon_total"] <= 8.0
    else:
        assert report["epsilon_total"] > 0


def test_gdp_spends_at_most_the_model_budget() -> None:
    table = horizontal_table(seed=6)
    model = FederatedExtraTreesClassifier(4, max_depth=3, privacy="gdp", epsilon=0.5, max_features=2,
                                          allow_data_ranges=True).fit(
        split_rows(table, 2), "target")
    report = model.privacy_report_
    assert "epsilon_per_query" not in report and "composed_epsilon" not in report
    # the noisy row count (1 release) and the marginal histograms (charged as ceil(0.1 x 12 / 0.9) = 2),
    # then at most one release per tree and level (4 x 3); this much noise stops some rows' trees earlier
    for ledger in report["parties"].values():
        assert 3 < ledger["releases_per_row"] <= ledger["planned_releases_per_row"] == 1 + 2 + 4 * 3
        assert ledger["l2_sensitivity"] == pytest.approx(np.sqrt(2))  # k = 2 candidates per release
        assert 0 < ledger["epsilon_total"] <= 0.5 and ledger["delta"] == 1e-6
    assert report["epsilon_total"] == max(p["epsilon_total"] for p in report["parties"].values())
    # smaller epsilon -> more noise: leaf values further from the plain run
    plain = FederatedExtraTreesClassifier(4, max_depth=3, max_features=2).fit(split_rows(table, 2), "target")
    strong = FederatedExtraTreesClassifier(4, max_depth=3, privacy="gdp", epsilon=50.0, max_features=2,
                                           allow_data_ranges=True).fit(
        split_rows(table, 2), "target")
    def root_error(run):  # every root holds all 600 rows
        return np.abs(run.model_.weight[run.model_.tree_offsets()[:-1]] - 600).mean()

    assert root_error(plain) == 0 and 0 < root_error(strong) < root_error(model)
    # a row in every tree at each of the 3 levels (depth 3 on 600 rows, little noise): the whole budget
    for ledger in strong.privacy_report_["parties"].values():
        assert ledger["releases_per_row"] == ledger["planned_releases_per_row"] == 1 + 2 + 4 * 3
        assert 50.0 * 0.99 < ledger["epsilon_total"] <= 50.0


@pytest.mark.parametrize("mechanism", ["bloom", "oue"])
def test_ldp_report_and_permanent_bits_fixed_once(mechanism: str) -> None:
    """Each row's epsilon is its one randomized response's, however many reports repeat it.

    (Bloom: the permanent one bounds its instant reports.) The report states that, with delta 0, not a
    composition.
    """
    table = horizontal_table(seed=6)
    privacy = {"mode": "ldp", "mechanism": mechanism}
    model = FederatedExtraTreesClassifier(3, max_depth=2, privacy=privacy, allow_data_ranges=True).fit(
        split_rows(table, 2), "target")
    report = model.privacy_report_
    epsilon = model.parties_[0].label_ldp().epsilon()["permanent"]
    assert epsilon == (2.0 if mechanism == "oue" else pytest.approx(8.788898309344878, rel=1e-12))
    assert (report["mechanism"], report["epsilon"], report["epsilon_total"], report["delta"]) == \
        (mechanism, epsilon, epsilon, 0.0)
    assert report["setting"]["mechanism"] == report["ldp_mechanism"]["mechanism"] == mechanism
    assert report["reports_per_row"] == 3 * 2  # one report per tree and level a row is active in
    party = model.parties_[0]
    kept = party.rows.permanent.copy()
    model2 = FederatedExtraTreesClassifier(3, max_depth=2, privacy=privacy, allow_data_ranges=True).fit(
        split_rows(table, 2), "target")
    np.testing.assert_array_equal(kept, model2.parties_[0].rows.permanent)


def test_gdp_regression_runs_and_is_reproducible() -> None:
    table = horizontal_table(seed=7, task="regression")
    parties = split_rows(table, 2)
    options = {"privacy": "gdp", "epsilon": 2.0, "max_depth": 4, "allow_data_ranges": True,
               "min_samples_leaf": 20}
    a = FederatedExtraTreesRegressor(5, **options).fit(parties, "target")
    b = FederatedExtraTreesRegressor(5, **options).fit(parties, "target")
    assert_same_forest(a.model_, b.model_)
    prediction = a.predict(table)
    assert np.isfinite(prediction).all()
    assert np.abs(prediction).max() <= 2 * np.abs(table["target"]).max()
