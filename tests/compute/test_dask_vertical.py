"""Vertical Federated Forest parties on a Dask cluster grow exactly the in-process forest (issue #29).

Blocks of 70 rows give each party several blocks per worker (the bootstrap's canonical chunks are 2**16 rows,
so the small tables here also check that a block draws only its own rows of a chunk); every case is
compared with the same estimator in process: the forest array by array, and, where payloads are recorded,
every message that crossed the transport byte for byte. Regression too: its targets on their grid
(`fixed_targets`) make every block's sums of (w, wy) add up exactly to the in-process ones.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.compute.dask_vertical import (
    DaskVerticalRows,
    block_major,
    compact_labels,
    node_major,
)
from fedcore.data.split import split_vertical
from fedcore.trees.partition import pack_nodes, unpack_nodes
from fedcore.vertical.estimators import FederatedForestClassifier, FederatedForestRegressor
from tests.compute.workers import losable_cluster, lose_a_worker_on_call
from tests.conftest import mixed_table

BLOCK = 70


def _parties(seed: int = 1, n_parties: int = 3, **table):
    return split_vertical(mixed_table(seed=seed, **table), n_parties, label="target", seed=7, label_party=0)


def _forest(task: str = "classification", **kwargs) -> FederatedForestClassifier | FederatedForestRegressor:
    forest = FederatedForestClassifier if task == "classification" else FederatedForestRegressor
    return forest(**{"n_estimators": 4, "max_depth": 6, "random_state": 3, **kwargs})


def _arrays(model) -> dict[str, np.ndarray]:
    s = model.master_.structure
    out = {f: getattr(s, f) for f in ("tree", "node", "left", "right", "depth", "owner", "weight", "value")}
    for party in model.parties_:
        for field in ("feature", "threshold", "missing_left", "is_categorical", "cat_bits"):
            out[f"{party.name}.{field}"] = np.asarray(getattr(party.model, field))
    return out


def assert_same_forest(expected, got) -> None:
    a, b = _arrays(expected), _arrays(got)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].tobytes() == b[name].tobytes(), name


def _payloads(model) -> list[tuple[str, str, str, bytes]]:
    """Every message that crossed, but setup replies: they report the memory available at that moment."""
    return [(e.sender, e.receiver, e.kind, e.payload) for e in model.transcript_ if e.kind != "setup_reply"]


@pytest.mark.parametrize("workers", ["one_worker", "three_workers"])
@pytest.mark.parametrize("bootstrap", [True, False], ids=["bootstrap", "all rows"])
@pytest.mark.parametrize("task", ["classification", "regression"])
def test_the_forest_on_dask_is_the_in_process_forest(workers, bootstrap, task, request) -> None:
    client = request.getfixturevalue(workers)
    parties = _parties(task=task)
    expected = _forest(task, bootstrap=bootstrap, record_payloads=True).fit(parties, label="target")
    got = _forest(task, bootstrap=bootstrap, record_payloads=True, compute=client,
                  block_rows=BLOCK).fit(parties, label="target")
    assert_same_forest(expected, got)
    sent, received = _payloads(expected), _payloads(got)
    bits = [p for p in sent if p[2] == "partition_bits"]
    assert len(bits) > 10 and [p for p in received if p[2] == "partition_bits"] == bits
    assert received == sent  # every other message, byte for byte
    assert all(type(p.rows).__name__ == "LocalRows" for p in got.parties_)  # the rows left the cluster
    assert all(p._y.size == 0 for p in got.parties_)  # no party keeps a label copy beside its rows (#29)
    predict = "predict_proba" if task == "classification" else "predict"
    np.testing.assert_array_equal(getattr(got, predict)(parties), getattr(expected, predict)(parties))


@pytest.mark.parametrize(("task", "table"), [("classification", {"n_classes": 2}), ("regression", {})])
def test_batches_max_samples_and_two_classes_on_dask(three_workers, task, table) -> None:
    parties = _parties(seed=5, n_parties=2, task=task, **table)
    make = lambda **kw: _forest(task, tree_batch_size=3, max_samples=0.6,  # noqa: E731
                                feature_sampling="tree", min_samples_leaf=2, n_estimators=5, **kw)
    assert_same_forest(make().fit(parties, label="target"),
                       make(compute=three_workers, block_rows=45).fit(parties, label="target"))


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_blocks_submitted_in_any_order_give_the_same_forest(three_workers, monkeypatch, task) -> None:
    made = DaskVerticalRows.__init__

    def shuffled(self, *args, **kwargs):
        made(self, *args, **kwargs)
        self.submit_order = list(np.random.default_rng(len(self.blocks)).permutation(len(self.blocks)))
        assert self.submit_order != sorted(self.submit_order)

    monkeypatch.setattr(DaskVerticalRows, "__init__", shuffled)
    parties = _parties(seed=2, task=task)
    assert_same_forest(_forest(task).fit(parties, label="target"),
                       _forest(task, compute=three_workers, block_rows=BLOCK).fit(parties, label="target"))


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_larger_children_are_derived_on_dask_and_give_the_same_forest(three_workers, monkeypatch,
                                                                     task) -> None:
    """Every feature a candidate: the blocks compute the smaller children, the agent subtracts (#29).

    Classification derives the larger children's histograms from the kept level (the in-process rule);
    regression's float sums are never subtracted. Either way the forest is the in-process one.
    """
    derived: list[int] = []
    close = DaskVerticalRows.close

    def recorded(self):
        derived.append(self.pairs_derived)
        close(self)

    monkeypatch.setattr(DaskVerticalRows, "close", recorded)
    parties = _parties(seed=6, n_parties=2, task=task)
    assert_same_forest(_forest(task, max_features=None).fit(parties, label="target"),
                       _forest(task, max_features=None, compute=three_workers, block_rows=BLOCK).fit(
                           parties, label="target"))
    assert len(derived) == 2
    assert (min(derived) > 50) if task == "classification" else (derived == [0, 0])


def test_block_and_node_order_round_trip() -> None:
    counts = np.array([[2, 0, 3], [1, 4, 0]])
    blocks = [np.array([1, 0, 1, 1, 0]), np.array([0, 1, 1, 0, 1])]  # node 0: 1 0 | 0, node 1: 1 1 0 1, ...
    blobs = [pack_nodes(bits, c) for bits, c in zip(blocks, counts, strict=True)]
    nodes = node_major(blobs, counts)
    assert unpack_nodes(nodes, counts.sum(axis=0)).tolist() == [1, 0, 0, 1, 1, 0, 1, 1, 1, 0]
    back, ones = block_major(nodes, counts)
    assert [b.tobytes() for b in back] == [b.tobytes() for b in blobs]
    assert ones.tolist() == [[1, 0, 2], [0, 3, 0]]


@pytest.mark.parametrize("seed", range(6))
def test_bits_regrouped_in_place_are_those_of_unpacking(seed) -> None:
    """`node_major`/`block_major` move packed runs: the bits and padding of unpacking, regrouping, packing."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 100, size=(rng.integers(1, 6), rng.integers(1, 9)))
    counts[rng.random(counts.shape) < 0.2] = 0
    bits = [rng.integers(0, 2, c.sum()).astype(np.uint8) for c in counts]
    starts = np.cumsum(counts, axis=1) - counts  # each node's first bit in its block
    by_node = np.concatenate([np.zeros(0, np.uint8)] + [bits[b][starts[b, j]:starts[b, j] + counts[b, j]]
                                                       for j in range(counts.shape[1])
                                                       for b in range(len(counts))])
    expected = pack_nodes(by_node, counts.sum(axis=0))
    nodes = node_major([pack_nodes(b, c) for b, c in zip(bits, counts, strict=True)], counts)
    assert nodes.tobytes() == expected.tobytes()
    back, ones = block_major(expected, counts)
    blobs = [pack_nodes(b, c).tobytes() for b, c in zip(bits, counts, strict=True)]
    assert [b.tobytes() for b in back] == blobs
    assert ones.tolist() == [[int(bits[b][starts[b, j]:starts[b, j] + counts[b, j]].sum())
                              for j in range(counts.shape[1])] for b in range(len(counts))]


@pytest.mark.parametrize(("values", "dtype"), [
    (np.array([0.0, 3, 255, 1]), np.uint8), (np.array([0.0, 256, 65_535]), np.uint16),
    (np.array([0.0, 65_536]), np.float64), (np.array([0.0, 1.5]), np.float64),
    (np.array([-1.0, 2]), np.float64), (np.array([0.0, np.nan]), np.float64),
    (np.array([], np.float64), np.uint8)])
def test_labels_travel_in_the_narrowest_exact_type(values, dtype) -> None:
    narrow = compact_labels(values)
    assert narrow.dtype == dtype
    np.testing.assert_array_equal(narrow.astype(np.float64), values)


def test_a_dask_party_keeps_its_labels_only_on_the_workers_one_byte_a_row(one_worker) -> None:
    """Issue #29: the label codes go to the blocks at once as uint8; the party keeps no copy of them."""
    parties = _parties(n_parties=2)
    rows = DaskVerticalRows(parties[1].drop(columns=["id"], errors="ignore"), one_worker, BLOCK)
    codes = np.arange(rows.n_rows, dtype=np.int32) % 5
    assert not rows.labelled
    rows.set_labels(codes)
    assert rows.labelled and len(rows.labels) == len(rows.blocks) > 2
    blocks = one_worker.gather(rows.labels)
    assert all(b.dtype == np.uint8 for b in blocks)
    assert np.concatenate(blocks).tolist() == codes.tolist()
    assert not [v for v in vars(rows).values() if isinstance(v, np.ndarray) and v.size >= rows.n_rows]
    rows.close()


def test_a_second_split_before_the_first_is_applied_is_refused(one_worker) -> None:
    """The last level's splits wait for the next level's tasks; another split() would overwrite them."""
    from fedcore.compute.dask_vertical import PENDING_SPLITS
    from fedcore.trees.partition import node_byte_lengths, offsets_from_lengths

    parties = _parties(n_parties=2)
    rows = DaskVerticalRows(parties[1].drop(columns=["id"], errors="ignore"), one_worker, BLOCK)
    rows.set_labels(np.zeros(rows.n_rows, np.int64))
    rows.begin_batch(seed=0, trees=[0], n_draws=None)

    def all_left() -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # every open node splits, its rows left
        sizes = rows.node_sizes()
        lengths = node_byte_lengths(0, sizes)
        bits = [np.packbits(np.ones(n, bool)) for n in sizes]
        return np.ones(len(sizes), bool), np.concatenate(bits), offsets_from_lengths(lengths)

    rows.split(*all_left())
    assert rows.node_sizes().tolist() == [rows.n_rows, 0]
    with pytest.raises(RuntimeError) as error:
        rows.split(*all_left())
    assert str(error.value) == PENDING_SPLITS
    assert rows.node_sizes().tolist() == [rows.n_rows, 0]  # refused before anything changed
    rows._applied()  # the pending splits applied: the next level's split is taken
    rows.split(*all_left())
    assert rows.node_sizes().tolist() == [rows.n_rows, 0, 0, 0]
    rows.close()


@pytest.mark.timeout(120)
def test_a_worker_lost_mid_forest_still_gives_the_same_forest(monkeypatch) -> None:
    parties = _parties(seed=4)
    with losable_cluster() as (cluster, client):
        # past the first levels: the partitions have a lineage to replay
        lost = lose_a_worker_on_call(monkeypatch, DaskVerticalRows, "best_splits", 12, cluster, client)
        got = _forest(compute=client, block_rows=BLOCK).fit(parties, label="target")
        assert lost and len(client.scheduler_info()["workers"]) == 2
    assert_same_forest(_forest().fit(parties, label="target"), got)


def test_regression_targets_far_from_one_are_exact_on_dask(three_workers) -> None:
    """Targets of 1e12 and above, and of 1e-9, each table on its own grid: the same forest on Dask."""
    for scale in (1e12, 1e-9):
        parties = _parties(seed=8, n_parties=2, task="regression")
        parties[0]["target"] = parties[0]["target"] * scale + 3 * scale
        assert_same_forest(_forest("regression").fit(parties, label="target"),
                           _forest("regression", compute=three_workers, block_rows=BLOCK).fit(
                               parties, label="target"))


@pytest.mark.parametrize(("mode", "workers", "task"), [
    ("paillier", "three_workers", "classification"), ("ou", "three_workers", "classification"),
    ("ou", "one_worker", "classification"), ("ou", "three_workers", "regression"),
    ("paillier", "one_worker", "regression")])
def test_encrypted_labels_on_dask_grow_the_in_process_forest(mode, workers, task, request) -> None:
    """Encrypted bin sums per block, multiplied together at the agent, are the in-process ones.

    So the forest is the same (the ciphertexts themselves are fresh per run, so the messages differ).
    """
    from fedcore.privacy.schemes import scheme

    client = request.getfixturevalue(workers)

    key = scheme(mode).generate(1024, insecure_for_tests=True)
    parties = _parties(seed=11, n_parties=3, n_rows=200, task=task)
    make = lambda **kw: _forest(task, n_estimators=2, max_depth=4, privacy=mode, label_key=key,  # noqa: E731
                                **kw)
    expected = make().fit(parties, label="target")
    got = make(compute=client, block_rows=45).fit(parties, label="target")
    assert_same_forest(expected, got)
    passive = [p for p in got.parties_ if not p.is_label_holder]
    assert passive and all(p._passive_crypto is not None and p._passive_crypto.pairs_computed > 0
                           for p in passive)


@pytest.mark.parametrize(("privacy", "boosting"), [("none", False), ("ou", False), ("none", True)],
                         ids=["forest", "forest ou", "boosting"])
def test_agents_with_compute_dask_train_the_in_process_model(tmp_path, privacy, boosting) -> None:
    """Every institution's own config puts its party on a local cluster: the session's model is unchanged."""
    from fedcore.compute.cluster import DaskCompute, hold_shared
    from fedcore.data.scenario import make_vertical_scenario
    from fedcore.transport.inprocess import InProcessTransport
    from fedcore.trees.boosting import BoostingParams
    from fedcore.trees.params import ForestParams
    from fedcore.vertical.session import VerticalSession
    from tests.vertical.test_session import _agents

    scenario = make_vertical_scenario(tmp_path / "scenario", n_customers=700, seed=3)
    models = []
    for on_dask in (False, True):
        settings = {"compute": DaskCompute(workers=2, processes=False, block_rows=90)} if on_dask else {}
        agents = _agents(scenario, tmp_path / str(on_dask), new_batch=False, **settings)
        release = hold_shared(settings["compute"]) if on_dask else None  # as an agent server holds it
        transport = InProcessTransport({n: a.handle for n, a in agents.items()})
        params = (BoostingParams(n_estimators=3, max_depth=4, subsample=0.8, random_state=1) if boosting
                  else ForestParams(n_estimators=4 if privacy == "none" else 2, max_depth=5, random_state=1,
                                    privacy=privacy, key_bits=None if privacy == "none" else 2048))
        session = VerticalSession(transport, params,
                                  holdout_fraction=0.25, min_overlap=100)
        session.align()
        session.train()
        s = session.master.structure
        arrays = {f: getattr(s, f) for f in ("tree", "node", "left", "right", "owner", "weight", "value")}
        for name, agent in agents.items():
            for field in ("feature", "threshold", "missing_left", "cat_bits"):
                arrays[f"{name}.{field}"] = np.asarray(getattr(agent.party.model, field))
        if on_dask:
            assert all(type(a.party.rows).__name__ == "DaskVerticalRows" and len(a.party.rows.blocks) > 2
                       for a in agents.values())
            passive = [a.party for a in agents.values() if not a.party.is_label_holder]
            assert all((p._passive_crypto is not None and p._passive_crypto.pairs_computed > 0)
                       == (privacy == "ou") for p in passive)
            assert len({id(a.party.rows.client) for a in agents.values()}) == 1  # one cluster per setting
        if release is not None:
            release()
        session.close()
        models.append(arrays)
    assert models[0].keys() == models[1].keys()
    for name in models[0]:
        assert models[0][name].tobytes() == models[1][name].tobytes(), name


def test_simulate_on_dask_reports_the_single_party_run_identical(three_workers) -> None:
    from fedcore.simulation import simulate_vertical

    table = mixed_table(seed=6)
    result = simulate_vertical(table, "target", parties=3, trees=3, max_depth=4, compute=three_workers)
    assert result["single_party_identical"] is True
    regression = simulate_vertical(mixed_table(seed=6, task="regression"), "target", task="regression",
                                   trees=2, compute=three_workers)
    assert regression["single_party_identical"] is True
    boosted = simulate_vertical(table, "target", trees=2, max_depth=3, algorithm="boosting",
                                compute=three_workers)
    assert boosted["single_party_identical"] is True

