"""Horizontal boosting with the parties' rows on a Dask cluster grows the in-process model (issues #29, #32).

Blocks of 40 rows give each party several blocks per worker; each loss is compared, byte for byte, with the
same estimator in process and the same seed, under secure aggregation or plain.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.compute.dask_boosting import DaskBoostingRows
from fedcore.compute.dask_rows import DaskPartyRows
from tests.compute.workers import losable_cluster, lose_a_worker_on_call
from tests.horizontal.common import horizontal_table, split_rows
from tests.horizontal.test_boosting import CASES

BLOCK = 40


def _fit(case: str, n_parties: int = 3, **extra):
    cls, table_args, params = CASES[case]
    table = horizontal_table(seed=5, n_rows=400, **table_args)
    model = cls(**params, allow_data_ranges=True, random_state=3, **extra)
    return model.fit(split_rows(table, n_parties, seed=n_parties), label="target")


def _assert_same_model(expected, got) -> None:
    assert got.model_.same_as(expected.model_)
    assert got.model_.combination == expected.model_.combination
    np.testing.assert_array_equal(got.feature_importances_, expected.feature_importances_)


@pytest.mark.parametrize(("case", "secure", "workers"), [
    ("logistic", True, "three_workers"),
    pytest.param("logistic", False, "one_worker", marks=pytest.mark.slow),
    pytest.param("softmax", True, "three_workers", marks=pytest.mark.slow),
    pytest.param("squared error", False, "three_workers", marks=pytest.mark.slow),
    pytest.param("squared error", True, "one_worker", marks=pytest.mark.slow),
])
def test_boosting_on_dask_is_the_in_process_model(case, secure, workers, request, monkeypatch) -> None:
    client = request.getfixturevalue(workers)
    made = []
    original = DaskBoostingRows.of.__func__  # type: ignore[attr-defined]

    def recorded(cls, rows, bins):  # the parties' rows on the cluster, and their blocks' tasks run shuffled
        rows.submit_order = list(np.random.default_rng(len(rows.blocks)).permutation(len(rows.blocks)))
        made.append(original(cls, rows, bins))
        return made[-1]

    monkeypatch.setattr(DaskBoostingRows, "of", classmethod(recorded))
    rounds_trees = _rounds_trees(monkeypatch)
    expected = _fit(case, secure_aggregation=secure)
    got = _fit(case, secure_aggregation=secure, compute=client, block_rows=BLOCK)
    # 400 rows over the 3 parties, each in several blocks of at most 40
    assert sum(rows.n_rows for rows in made) == 400 and min(len(rows.blocks) for rows in made) >= 2
    _assert_same_model(expected, got)
    assert got.privacy_report_ == expected.privacy_report_
    # each of the 3 parties' rounds after the first: its blocks' tasks took the round before's trees as one
    # future (not pickled into every task)
    assert rounds_trees == ["none"] * 3 + ["future"] * (3 * (got.n_estimators - 1))


def _rounds_trees(monkeypatch) -> list[str]:
    """What each `start_round`'s block tasks are given as the round before's trees: none, or a future."""
    from distributed import Future

    seen: list[str] = []
    original = DaskPartyRows._map

    def recorded(self, func, *per_block, **shared):
        if func.__name__ == "_round":
            trees = shared["trees"]
            seen.append("none" if trees is None else "future" if isinstance(trees, Future) else "inline")
        return original(self, func, *per_block, **shared)

    monkeypatch.setattr(DaskPartyRows, "_map", recorded)
    return seen


@pytest.mark.timeout(180)
def test_a_worker_lost_mid_boosting_still_gives_the_same_model(monkeypatch) -> None:
    """The lost blocks' margins are rebuilt from lineage: the rounds replayed from the base score."""
    with losable_cluster() as (cluster, client):
        # round 3 of 4 (4 levels a round): the margins have two rounds of trees to replay
        lost = lose_a_worker_on_call(monkeypatch, DaskPartyRows, "start_level", 10, cluster, client)
        got = _fit("logistic", compute=client, block_rows=BLOCK)
        assert lost and len(client.scheduler_info()["workers"]) == 2
    _assert_same_model(_fit("logistic"), got)


@pytest.mark.slow
def test_a_run_killed_mid_training_resumes_on_dask_to_the_same_model(tmp_path, three_workers) -> None:
    """North's margins on its blocks go into its round checkpoints and back into its blocks on resume."""
    from fedcore.compute.cluster import Cluster
    from tests.horizontal.test_boosting_session import killed_and_resumed

    compute = {"dask": {"address": three_workers.scheduler.address, "block_rows": 100}}
    killed_and_resumed(tmp_path, "classification", compute, Cluster(three_workers, []))


@pytest.mark.slow
def test_simulate_boosting_on_dask_says_single_party_identical(tmp_path, capsys) -> None:
    """`fedforest simulate --setting horizontal --algorithm boosting --dask local:2`: single-party model."""
    import json

    from fedcore.cli import main

    path = tmp_path / "table.csv"
    horizontal_table(seed=6, n_rows=600).to_csv(path, index=False)
    assert main(["simulate", "--data", str(path), "--label", "target", "--setting", "horizontal",
                 "--algorithm", "boosting", "--parties", "3", "--trees", "4", "--max-depth", "3",
                 "--dask", "local:2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["algorithm"] == "boosting" and result["compute"] == "local:2"
    assert result["single_party_identical"] is True
