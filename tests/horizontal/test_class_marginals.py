"""FET-GDP plan marginals: class-conditional DP marginals, released once, choose each drawn node's split."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.errors import ParameterError, ProtocolError
from fedcore.horizontal import FederatedExtraTreesClassifier
from fedcore.horizontal.fet.class_marginals import CLASS_MARGINAL_SHARE, ClassMarginals
from fedcore.horizontal.fet.marginals import histogram_counts, marginal_releases
from fedcore.horizontal.fet.party import HorizontalParty
from fedcore.horizontal.fet.plans import GdpPlan, choose_gdp_plan
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.plan import COUNT_RELEASES, gdp_terms, marginal_sigma
from fedcore.horizontal.validation import build_schema
from fedcore.protocol.messages import Message
from fedcore.randomness import stream
from tests.horizontal.common import horizontal_table, split_rows

TREES, DEPTH = 4, 5


def test_class_histograms_split_each_cell_by_class_and_skip_missing() -> None:
    X = np.array([[0.0, 5.0], [0.24, np.nan], [0.25, 5.0], [1.0, 5.0], [-3.0, 5.0], [7.0, 5.0]])
    y = np.array([1, 0, 1, 0, 0, 1])
    low, high = np.array([0.0, 5.0]), np.array([1.0, 5.0])
    counts = histogram_counts(X, low, high, 4, y, 2)
    assert counts.shape == (2, 4, 2)
    assert counts[0].tolist() == [[2, 1], [0, 1], [0, 0], [1, 1]]  # rows 0, 1, 4 | 2 | - | 3, 5
    assert counts[1].tolist() == [[2, 3], [0, 0], [0, 0], [0, 0]]  # the NaN of row 1 counts nowhere
    np.testing.assert_array_equal(counts.sum(axis=2), histogram_counts(X, low, high, 4))


def _separable() -> ClassMarginals:
    """Two classes, 8 cells of [0, 8] per feature: feature 0 separates them at 4, feature 1 does not."""
    hist = np.zeros((2, 8, 2))
    hist[0, :4, 0] = hist[0, 4:, 1] = 100.0
    hist[1, :, :] = 50.0
    return ClassMarginals(hist, np.zeros(2), np.full(2, 8.0))


def test_the_split_that_separates_the_classes_by_the_marginals_wins() -> None:
    marginals = _separable()
    weights = marginals.box_weights(np.zeros((1, 2)), np.full((1, 2), 8.0))
    np.testing.assert_allclose(weights, [[0.5, 0.5]], rtol=1e-12)  # the classes' rows: 400 and 400
    features = np.array([[1, 0, 0]])
    thresholds = np.array([[4.0, 2.0, 4.0]])  # feature 1 at 4, feature 0 at 2, feature 0 at 4
    low, high = np.zeros((1, 3)), np.full((1, 3), 8.0)
    best, children = marginals.choose_splits(weights, features, low, high, thresholds, np.ones((1, 3), bool))
    assert best.tolist() == [2]
    # the floor leaves 1% of a cell's mean mass in the other class's cells: nearly pure children
    assert children[0, 0, 0] > 0.99 and children[0, 1, 1] > 0.99
    # an unusable candidate is never chosen; with none usable, the first
    best, _ = marginals.choose_splits(weights, features, low, high, thresholds,
                                      np.array([[True, True, False]]))
    assert best.tolist() == [1]
    best, _ = marginals.choose_splits(weights, features, low, high, thresholds, np.zeros((1, 3), bool))
    assert best.tolist() == [0]


def test_a_nodes_box_weighs_its_classes_by_the_marginals() -> None:
    marginals = _separable()
    weights = marginals.box_weights(np.array([[4.0, 0.0]]), np.array([[8.0, 8.0]]))
    assert weights[0, 1] > 0.99  # the right half of feature 0 holds class 1


def _fit(epsilon: float, parties: int = 2) -> FederatedExtraTreesClassifier:
    table = horizontal_table(seed=5, n_rows=400)
    privacy = {"mode": "gdp", "epsilon": epsilon, "plan": "marginals"}
    model = FederatedExtraTreesClassifier(TREES, max_depth=DEPTH, privacy=privacy, allow_data_ranges=True,
                                          random_state=3, record_payloads=True)
    return model.fit(split_rows(table, parties), "target")


def test_each_party_releases_its_class_marginals_once_with_the_planned_noise_within_the_budget() -> None:
    """On the recorded transcript: each hello reply's class histograms are its exact counts plus noise.

    The party's own Gaussian draw of the planned sigma (nothing exact leaves it), charged at the class share
    once; every ledger and the report stay within the budget, and the model is plan marginals' complete trees.
    """
    model = _fit(2.0)
    hello = next(Message.from_bytes(e.payload) for e in model.transcript_ if e.kind == "hello")
    replies = [Message.from_bytes(e.payload) for e in model.transcript_ if e.kind == "hello_reply"]
    terms = {name: hello.header[name] for name in ("n_features", "marginal_bins", "marginal_releases",
                                                   "marginal_classes")}
    n_classes = model.schema_.n_classes
    assert terms["marginal_classes"] == n_classes == 3
    assert terms["marginal_releases"] == marginal_releases(TREES, CLASS_MARGINAL_SHARE)
    for party, reply in zip(model.parties_, replies, strict=True):
        exact = party.rows.marginal_histograms(hello.arrays["low"], hello.arrays["high"],
                                               terms["marginal_bins"], n_classes)
        assert exact.shape == (terms["n_features"], terms["marginal_bins"], n_classes)
        noise = stream(party.noise_seed, "gdp_marginals").standard_normal(exact.shape)
        sigma = marginal_sigma(party.ledger.plan, party.ledger_terms)
        assert sigma > 1.0
        np.testing.assert_array_equal(reply.arrays["marginals"], exact + noise * sigma)
        spent = party.privacy_spent()
        assert spent["releases_per_row"] == spent["planned_releases_per_row"] == (
            TREES + terms["marginal_releases"] + COUNT_RELEASES)
        assert 1.99 < spent["epsilon_total"] <= 2.0
    report = model.privacy_report_
    assert report["plan"]["plan"] == "marginals" and report["epsilon_total"] <= 2.0
    assert (model.model_.feature >= 0).sum() == TREES * (2 ** DEPTH - 1)


def test_plan_marginals_follows_the_labels_where_plan_leaves_cannot() -> None:
    """At a large budget the marginals' splits separate the classes better than drawn ones (test rows)."""
    table = horizontal_table(seed=5, n_rows=1200)
    train, test = table.iloc[:900], table.iloc[900:]
    scores = {}
    for plan in ("leaves", "marginals"):
        model = FederatedExtraTreesClassifier(20, max_depth=4, allow_data_ranges=True, random_state=3,
                                              privacy={"mode": "gdp", "epsilon": 200.0, "plan": plan})
        model.fit(split_rows(train.reset_index(drop=True), 2), "target")
        scores[plan] = float((model.predict(test.drop(columns="target")) == test["target"]).mean())
    assert scores["marginals"] > scores["leaves"] + 0.02, scores


def test_plan_marginals_refuses_a_regression_and_a_party_other_classes() -> None:
    params = ExtraTreesParams(task="regression", criterion="squared_error", n_estimators=4,
                              max_depth=None)
    with pytest.raises(ParameterError) as refused:
        choose_gdp_plan("marginals", 0, 1.0, 1, params)
    assert str(refused.value) == ("privacy 'gdp': plan 'marginals' releases class counts; a regression "
                                  "trains with plan 'splits' (or 'auto')")
    plan = choose_gdp_plan("marginals", 0, 1.0, 3, ExtraTreesParams(n_estimators=4, max_depth=None))
    assert plan == GdpPlan(True, 0, 4, None, class_marginals=True)
    table = horizontal_table(seed=5, n_rows=120)
    schema = build_schema({"a": table}, "target", "classification")
    party = HorizontalParty("a", table, schema, privacy="gdp", epsilon=1.0, noise_seed=7)
    terms = gdp_terms(TREES, 0, True, 2, "classification", schema.n_features, 8, 5)
    low, high = np.zeros(schema.n_features), np.ones(schema.n_features)
    hello = Message("hello", {"algorithm": "extra-trees", "schema": schema.fingerprint(), "privacy": "gdp",
                              "task": "classification", **terms}, {"low": low, "high": high})
    with pytest.raises(ProtocolError) as refused:
        party.handle(hello)
    assert str(refused.value) == ("party 'a': the master asks for marginal histograms per 5 classes, the "
                                  "schema has 3")
