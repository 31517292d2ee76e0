"""Tree batches sized from memory budgets: the plan, its bounds, and that batching leaves models unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.data.split import split_vertical
from fedcore.errors import ParameterError
from fedcore.trees.budget import BYTES_PER_TREE_ROW, MIB, available_bytes, resolve_budget, trees_per_batch
from fedcore.vertical.estimators import FederatedForestClassifier
from tests.conftest import mixed_table


def test_the_plan_is_the_largest_batch_every_role_can_hold() -> None:
    assert trees_per_batch(100, [(10, 1000), (20, 1000)]) == 50
    assert trees_per_batch(100, [(10, 10_000)]) == 100  # never more than the forest
    assert trees_per_batch(100, [(10, 5)]) == 1  # one tree even when it exceeds the budget
    assert trees_per_batch(7, []) == 7
    # one process: costs add up
    assert trees_per_batch(100, [(10, 1000), (20, 1000)], shared_budget=1500) == 50


def test_budgets_are_configured_in_mib_or_default_to_a_share_of_available_memory() -> None:
    assert resolve_budget(3) == 3 * MIB
    assert 0 < resolve_budget(None) <= available_bytes()
    for bad in (0, -1, 1.5, True, "1"):
        with pytest.raises(ParameterError, match=r"memory_budget_mb must be a positive integer \(MiB\)"):
            resolve_budget(bad)
    with pytest.raises(ParameterError, match="memory_budget_mb must be an integer >= 1, got 0"):
        FederatedForestClassifier(memory_budget_mb=0).fit(split_vertical(mixed_table(n_rows=40), 2,
                                                                         label="target"),
                                                          label="target")


def test_a_small_budget_grows_the_same_forest_in_several_batches(capsys) -> None:
    table = mixed_table(n_rows=600, seed=5)
    parties = split_vertical(table, 3, label="target", seed=1, label_party=0)
    whole = FederatedForestClassifier(n_estimators=30, max_depth=5,
                                      random_state=2).fit(parties, label="target")
    small = FederatedForestClassifier(n_estimators=30, max_depth=5, random_state=2, memory_budget_mb=1,
                                      progress=True).fit(parties, label="target")
    assert len(whole.master_.grower.batches()) == 1
    # 1 MiB shared by every role of the simulation: 3 parties x 600 rows x 40 bytes per tree, and the
    # master's 2^5 open nodes x 256 bytes
    per_tree = 3 * 600 * BYTES_PER_TREE_ROW["vertical"] + 32 * 256
    assert sum(cost for cost, _ in small.master_.memory_costs()) == per_tree
    assert small.master_.grower.batch_size == MIB // per_tree == 13
    assert len(small.master_.grower.batches()) == 3
    assert "in 3 batches" in capsys.readouterr().err
    for field in ("tree", "node", "left", "right", "owner", "weight", "value"):
        np.testing.assert_array_equal(getattr(whole.master_.structure, field),
                                      getattr(small.master_.structure, field))


def test_horizontal_batches_follow_the_budget_and_leave_plain_fet_unchanged() -> None:
    from fedcore.horizontal import FederatedExtraTreesClassifier
    from tests.horizontal.common import horizontal_table, split_rows

    parties = split_rows(horizontal_table(seed=4), 3)
    whole = FederatedExtraTreesClassifier(n_estimators=6, max_depth=10,
                                          random_state=1).fit(parties, label="target")
    small = FederatedExtraTreesClassifier(n_estimators=6, max_depth=10, random_state=1,
                                          memory_budget_mb=1).fit(parties, label="target")
    master = small.master_
    # the parties' partitions (600 rows x 16 bytes) and the master's level state, min(2^10, 600 / 2) open
    # nodes
    per_tree = 600 * BYTES_PER_TREE_ROW["horizontal"] + 300 * master.k * 2 * master.n_stats * 8 * (3 + 3)
    assert sum(cost for cost, _ in master.memory_costs()) == per_tree
    assert master.grower.batch_size == MIB // per_tree < 6
    assert len(whole.master_.grower.batches()) == 1
    for name, values in whole.model_.arrays().items():
        np.testing.assert_array_equal(values, small.model_.arrays()[name], err_msg=name)


def test_each_party_budget_bounds_the_batch_when_roles_run_apart() -> None:
    """Agents on their own machines: the master plans with each party's reported budget (hello)."""
    from fedcore.horizontal.fet.master import FederatedExtraTreesMaster
    from fedcore.horizontal.fet.party import HorizontalParty
    from fedcore.horizontal.params import ExtraTreesParams
    from fedcore.horizontal.validation import build_schema
    from fedcore.transport.inprocess import InProcessTransport
    from tests.horizontal.common import horizontal_table, split_rows

    frames = dict(zip(["a", "b"], split_rows(horizontal_table(seed=6), 2), strict=True))
    schema = build_schema(frames, "target", "classification", None)
    small = 3 * len(frames["b"]) * BYTES_PER_TREE_ROW["horizontal"]  # room for 3 trees of b's rows
    parties = [HorizontalParty("a", frames["a"], schema, noise_seed=1),
               HorizontalParty("b", frames["b"], schema, noise_seed=2, memory_budget=small)]
    master = FederatedExtraTreesMaster(InProcessTransport({p.name: p.handle for p in parties}),
                                       ExtraTreesParams(n_estimators=8, max_depth=4), schema,
                                       memory_budget=1 << 30)
    master.fit()
    assert master.party_budgets["b"] == small and master.party_budgets["a"] > small  # a: its default share
    assert master.grower.batch_size == 3 and len(master.grower.batches()) == 3


def test_dp_models_do_not_follow_the_memory_a_machine_has_free(monkeypatch) -> None:
    """DP models depend on the configured batch plan only, never on the memory free at run time.

    FET-GDP/LDP noise is keyed by each party's count of answered queries, so the batch plan shapes the model:
    it comes from the configuration alone.
    """
    from fedcore.horizontal import FederatedExtraTreesClassifier
    from fedcore.trees import budget
    from tests.horizontal.common import horizontal_table, split_rows

    parties = split_rows(horizontal_table(seed=7), 3)

    def fit(privacy: str):
        model = FederatedExtraTreesClassifier(n_estimators=6, max_depth=10, random_state=3, privacy=privacy,
                                              allow_data_ranges=True)
        return model.fit(parties, label="target")

    roomy = {mode: fit(mode) for mode in ("none", "gdp")}
    monkeypatch.setattr(budget, "available_bytes", lambda: 2 * MIB)  # a machine with 2 MiB free
    tight = {mode: fit(mode) for mode in ("none", "gdp")}
    assert len(roomy["none"].master_.grower.batches()) == 1 < len(tight["none"].master_.grower.batches())
    assert len(tight["gdp"].master_.grower.batches()) == 1
    for mode in ("none", "gdp"):  # plain FET does not depend on batches; GDP is not batched by memory
        for name, values in roomy[mode].model_.arrays().items():
            np.testing.assert_array_equal(values, tight[mode].model_.arrays()[name], err_msg=f"{mode} {name}")


def test_a_reported_budget_must_be_a_byte_count() -> None:
    from fedcore.errors import ProtocolError
    from fedcore.trees.budget import reported_budget

    assert reported_budget("bank", {"memory_budget": 5 * MIB}) == 5 * MIB
    assert reported_budget("bank", {}) == 0  # none reported: planned with the master's
    for bad in ("8G", -1, 1.5, float("inf"), True, None):
        with pytest.raises(ProtocolError,
                           match=f"party 'bank' reported memory_budget {bad!r}; expected a number"):
            reported_budget("bank", {"memory_budget": bad})


def test_batch_costs_charge_parties_by_rows_and_the_master_by_open_nodes() -> None:
    from fedcore.trees.budget import batch_costs
    from fedcore.trees.params import ForestParams

    params = ForestParams(task="classification", max_depth=3, memory_budget_mb=8)
    costs = batch_costs("vertical", params, {"bank": 1000, "shop": 1000}, {"bank": 5 * MIB},
                        node_bound=500, master_bytes_per_node=256)
    per_row = BYTES_PER_TREE_ROW["vertical"]
    # the shop reported no budget: it is planned with the master's (8 MiB from the params)
    assert costs == [(1000 * per_row, 5 * MIB), (1000 * per_row, 8 * MIB), (2**3 * 256, 8 * MIB)]
    # a deep tree's open nodes are bounded by the rows; an explicit master budget wins over the params
    deep = ForestParams(task="classification", memory_budget_mb=8)
    assert batch_costs("horizontal", deep, {"bank": 10}, {}, node_bound=3, master_bytes_per_node=100,
                       own_budget=MIB) == [(10 * BYTES_PER_TREE_ROW["horizontal"], MIB), (300, MIB)]
    # what a party keeps per open node (PPD-ERT's node boxes) adds to its rows' share
    with_boxes = batch_costs("horizontal", deep, {"bank": 10}, {}, node_bound=3, master_bytes_per_node=100,
                             party_bytes_per_node=7, own_budget=MIB)
    assert with_boxes[0] == (10 * BYTES_PER_TREE_ROW["horizontal"] + 3 * 7, MIB)
