"""FET-GDP's leaf-release plan (issue #31): drawn structure, one noisy leaf release a tree, the default."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.errors import ParameterError, ProtocolError
from fedcore.horizontal.boxes import rank_usable
from fedcore.horizontal.estimators import FederatedExtraTreesClassifier
from fedcore.horizontal.fet.party import HorizontalParty
from fedcore.horizontal.fet.plans import (
    GdpPlan,
    choose_gdp_plan,
    fill_random_nodes,
    leaf_depth,
)
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.plan import gaussian_plan, gdp_terms, leaf_sigma
from fedcore.horizontal.validation import build_schema
from fedcore.protocol.messages import Message
from tests.horizontal.common import horizontal_table, split_rows

TREES, DEPTH = 4, 5


class _UniformThresholds(FederatedExtraTreesClassifier):
    """Plan leaves without marginal histograms: a structure that depends on the seed and domains alone."""

    def _make_master(self, transport, schema):
        master = super()._make_master(transport, schema)
        master.plan_terms = gdp_terms(TREES, 0, True, master.k, "classification", schema.n_features, 0)
        master.plan = gaussian_plan(master.plan.epsilon, master.plan.delta, master.plan_terms)
        return master


def _fit(parties: int, epsilon: float) -> FederatedExtraTreesClassifier:
    table = horizontal_table(seed=5, n_rows=400)
    privacy = {"mode": "gdp", "epsilon": epsilon, "plan": "leaves"}
    model = _UniformThresholds(TREES, max_depth=DEPTH, privacy=privacy, allow_data_ranges=True,
                               random_state=3)
    return model.fit(split_rows(table, parties) if parties > 1 else [table], "target")


def test_one_two_or_three_parties_draw_the_same_structure_and_release_each_leaf_once() -> None:
    """The drawn splits depend on the seed and the declared domains only: the same for 1, 2 or 3 parties.

    At a large budget (a leaf count's noise sigma about 0.35) each leaf's released size is within 5 noise
    scales of the number of pooled rows the model routes there, so every row was counted in its one leaf per
    tree; every party's ledger charged one release per tree (plus the row count), within the budget.
    """
    table = horizontal_table(seed=5, n_rows=400)
    models = {p: _fit(p, 50.0) for p in (1, 2, 3)}
    first = models[1].model_
    internal = first.feature >= 0
    assert internal.sum() == TREES * (2 ** DEPTH - 1)  # complete trees: every drawn node splits
    for parties, model in models.items():
        forest = model.model_
        np.testing.assert_array_equal(forest.feature, first.feature)
        np.testing.assert_array_equal(forest.threshold, first.threshold)
        leaves = model.model_.apply(model.schema_.encode(table))
        exact = np.zeros(len(forest.weight))
        np.add.at(exact, leaves.reshape(-1), 1)
        sigma = leaf_sigma(model.parties_[0].ledger.plan) * np.sqrt(parties * model.schema_.n_classes)
        assert 0.3 < sigma < 2.0  # of a leaf's size: its classes' counts summed over the parties
        counted = ~internal & (exact >= 6 * sigma)  # far enough from 0 that the size is not clamped
        assert counted.sum() > 20
        assert np.abs(forest.weight[counted] - exact[counted]).max() < 5 * sigma
        # the drawn nodes' weights are their leaves' sums (post-processing)
        assert np.abs(forest.weight[forest.depth == 0] - len(table)).max() < 5 * sigma * 2 ** (DEPTH / 2)
        for party in model.parties_:
            spent = party.privacy_spent()
            assert spent["releases_per_row"] == spent["planned_releases_per_row"] == TREES + 1
            assert 49.9 < spent["epsilon_total"] <= 50.0
        report = model.privacy_report_
        assert report["plan"]["plan"] == "leaves" and report["epsilon_total"] <= 50.0


def test_a_party_under_plan_splits_refuses_a_drawn_level() -> None:
    table = horizontal_table(seed=5, n_rows=200)
    model = FederatedExtraTreesClassifier(2, max_depth=3, privacy={"mode": "gdp", "plan": "splits"},
                                          allow_data_ranges=True).fit(split_rows(table, 2), "target")
    party: HorizontalParty = model.parties_[0]
    assert party.ledger_terms["leaf_release"] == 0
    party.machine.state = "counted"
    with pytest.raises(ProtocolError) as refused:
        party.handle(Message("fet_split", {"depth": 1, "n_trees": 2}, {
            "features": np.zeros((2, 1), np.int32), "thresholds": np.zeros((2, 1))}))
    assert str(refused.value) == ("party 'party0': 'fet_split' belongs to gdp's plan 'leaves'; this "
                                  "session's plan releases no leaves")


def test_a_master_asking_for_more_leaf_releases_than_the_plan_is_refused_before_any_is_drawn() -> None:
    """A party planned for one tree answers one leaf release; a second tree's leaves would pass its plan."""
    table = horizontal_table(seed=5, n_rows=120)
    schema = build_schema({"a": table}, "target", "classification")
    party = HorizontalParty("a", table, schema, privacy="gdp", epsilon=1.0, noise_seed=7)
    terms = gdp_terms(1, 0, True, 2, "classification", schema.n_features, 0)
    party.handle(Message("hello", {"algorithm": "extra-trees", "schema": schema.fingerprint(),
                                   "privacy": "gdp", "task": "classification", **terms}))

    def one_tree() -> Message:
        party.handle(Message("fet_split", {"depth": 0, "n_trees": 1, "new_batch": True},
                             {"features": np.zeros((1, 1), np.int32), "thresholds": np.zeros((1, 1))}))
        decisions = {"chosen": np.zeros(1, np.int32), "next_pos": np.arange(2, dtype=np.int32)}
        return party.handle(Message("fet_leaves", {"depth": 1, "n_leaves": 2}, decisions))

    counts = one_tree().arrays["counts"]
    assert counts.shape == (2, schema.n_classes) and abs(counts.sum() - len(table)) < 60
    assert party.ledger is not None and party.ledger.releases_per_row == party.ledger.plan.releases == 1 + 1
    reports = party.reports
    with pytest.raises(ProtocolError, match=r"the privacy budget \(epsilon 1, delta 1e-06\) is spent: a row "
                                            r"would take part in 3 releases, its plan has 2"):
        one_tree()
    assert party.reports == reports and party.ledger.releases_per_row == 2  # nothing drawn, nothing charged


@pytest.mark.parametrize(("n_classes", "epsilon", "max_depth", "task", "expected"), [
    (26, 4.0, None, "classification", GdpPlan(True, 0, 100, None)),  # only epsilon: leaves, 100 trees
    (6, 1.0, None, "classification", GdpPlan(True, 0, 100, None)),
    (2, 1.0, None, "classification", GdpPlan(True, 0, 100, None)),
    (2, 4.0, None, "classification", GdpPlan(False, 8, 50, 8)),  # two classes, a large budget: splits
    (26, 4.0, 6, "classification", GdpPlan(False, 6, 20, 6)),  # a depth given: the paper's plan
    (1, 4.0, 6, "regression", GdpPlan(False, 6, 20, 6)),
])
def test_plan_auto_follows_the_measured_rule(n_classes, epsilon, max_depth, task, expected) -> None:
    params = ExtraTreesParams(n_estimators=20, max_depth=max_depth, task=task,
                              criterion="gini" if task == "classification" else "squared_error")
    assert choose_gdp_plan("auto", 0, epsilon, n_classes, params) == expected


def test_plans_that_cannot_run_are_refused() -> None:
    params = ExtraTreesParams(n_estimators=20, max_depth=3)
    with pytest.raises(ParameterError, match=r"split_levels 3 needs a max_depth above it \(got 3\)"):
        choose_gdp_plan("leaves", 3, 1.0, 3, params)
    with pytest.raises(ParameterError, match="needs a bounded depth"):
        choose_gdp_plan("splits", 0, 1.0, 3, ExtraTreesParams(n_estimators=20))
    with pytest.raises(ParameterError, match="plan 'leaves' releases class counts"):
        choose_gdp_plan("leaves", 0, 1.0, 1, ExtraTreesParams(n_estimators=20, task="regression",
                                                              criterion="squared_error"))


def test_leaf_depth_follows_the_rows_within_its_bounds_and_the_values_cap() -> None:
    assert [leaf_depth(rows, 100, 6) for rows in (10, 455, 3680, 12800, 1e6)] == [6, 9, 12, 12, 12]
    assert leaf_depth(12800, 100, 26) == 12 and leaf_depth(12800, 1000, 26) == 9  # 2**25 values at most


def test_drawn_nodes_take_their_leaves_weights_and_weighted_values() -> None:
    records = {"tree": np.zeros(5, np.int32), "node": np.arange(5, dtype=np.int32),
               "left": np.array([1, 3, -1, -1, -1], np.int32),
               "right": np.array([2, 4, -1, -1, -1], np.int32),
               "depth": np.array([0, 1, 1, 2, 2], np.int16),
               "weight": np.array([0.0, 0.0, 2.0, 3.0, 1.0]),
               "value": np.array([[0.5, 0.5], [0.5, 0.5], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])}
    fill_random_nodes(records, 1)  # the root (depth 0) was chosen: it keeps its own
    np.testing.assert_array_equal(records["weight"], [0.0, 4.0, 2.0, 3.0, 1.0])
    np.testing.assert_array_equal(records["value"][:2], [[0.5, 0.5], [0.75, 0.25]])
    fill_random_nodes(records, 0)
    assert records["weight"][0] == 6.0 and np.allclose(records["value"][0], [0.5, 0.5])


def test_a_config_check_refuses_what_the_master_would_refuse_after_the_agents_connect() -> None:
    from fedcore.horizontal.plan import check_params
    from fedcore.privacy.settings import parse_privacy

    regression = ExtraTreesParams(n_estimators=20, task="regression", criterion="squared_error")
    with pytest.raises(ParameterError, match="needs a bounded depth"):  # auto: a regression takes splits
        check_params(parse_privacy({"mode": "gdp", "epsilon": 1.0}, "extra-trees"), regression)
    with pytest.raises(ParameterError, match="plan 'leaves' releases class counts"):
        check_params(parse_privacy({"mode": "gdp", "epsilon": 1.0, "plan": "leaves"}, "extra-trees"),
                     regression)
    with pytest.raises(ParameterError, match=r"split_levels 3 needs a max_depth above it \(got 3\)"):
        check_params(parse_privacy({"mode": "gdp", "epsilon": 1.0, "plan": "leaves", "split_levels": 3},
                                   "extra-trees"), ExtraTreesParams(n_estimators=20, max_depth=3))
    check_params(parse_privacy({"mode": "gdp", "epsilon": 1.0}, "extra-trees"),
                 ExtraTreesParams(n_estimators=20))


def test_chosen_levels_deeper_than_the_row_counts_depth_set_the_depth() -> None:
    """400 rows give depth 9 (`leaf_depth`); 10 chosen levels need 11: the trees' depth is 11, not more."""
    table = horizontal_table(seed=5, n_rows=400)
    assert leaf_depth(400, 2, 2) == 9
    model = FederatedExtraTreesClassifier(2, privacy={"mode": "gdp", "epsilon": 4.0, "plan": "leaves",
                                                      "split_levels": 10},
                                          allow_data_ranges=True, random_state=3)
    model.fit(split_rows(table, 2), "target")
    assert model.privacy_report_["plan"]["max_depth"] == 11
    assert int(model.model_.depth.max()) <= 11


def test_a_second_hello_with_other_terms_of_the_same_release_count_is_refused() -> None:
    """8 chosen levels and no leaf release, then 7 and a leaf release: the same count, spent elsewhere.

    A party's ledger outlives a session (a new session starts with hello again), so its terms must too.
    """
    table = horizontal_table(seed=5, n_rows=120)
    schema = build_schema({"a": table}, "target", "classification")
    party = HorizontalParty("a", table, schema, privacy="gdp", epsilon=1.0, noise_seed=7)
    first_state = party.machine.state

    def hello(split_levels: int, leaf_release: bool) -> Message:
        party.machine.state = first_state  # a new session: hello is in order again
        terms = gdp_terms(1, split_levels, leaf_release, 2, "classification", schema.n_features, 0)
        return party.handle(Message("hello", {"algorithm": "extra-trees", "schema": schema.fingerprint(),
                                              "privacy": "gdp", "task": "classification", **terms}))

    hello(8, False)
    hello(8, False)  # the same terms again (a resumed master): accepted
    with pytest.raises(ProtocolError, match=r"party 'a' planned its releases under other terms "
                                            r"\(leaf_release, split_levels changed\)"):
        hello(7, True)
    assert party.ledger_terms["leaf_release"] == 0


def test_a_drawn_node_takes_the_rank_th_of_its_usable_features() -> None:
    """The rank is floor(u x usable count), below the count; feature 0 where none is usable (a point box)."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        n, d = int(rng.integers(1, 200)), int(rng.integers(1, 40))
        usable = rng.random((n, d)) < rng.random()
        u = rng.random(n)
        u[:3] = np.nextafter(1.0, 0.0)  # the largest uniform: the last usable feature, never past it
        expected = [0 if not row.any() else
                    int(np.flatnonzero(row)[min(int(x * row.sum()), int(row.sum()) - 1)])
                    for row, x in zip(usable, u, strict=True)]
        assert [rank_usable(row, x) for row, x in zip(usable, u, strict=True)] == expected
