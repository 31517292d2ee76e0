"""A vertical party's prediction batch in blocks on its Dask workers answers as in process (issue #29).

The new batch is three Parquet files the agents never read (the workers hash, align and encode its blocks
of 40 rows); every prediction message an institution answers and the delivered predictions are the
in-process agent's, byte for byte, with one-round row batches that cut across blocks and node-by-node routing.
The held-out rows stay in their blocks too, and the evaluation is the in-process one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcore.compute.cluster import Cluster, DaskCompute
from fedcore.compute.dask_table import open_parquet, profile
from fedcore.compute.dask_vertical_predict import DaskPredictionRows, _bits, _words, join_row_sets
from fedcore.data.scenario import make_vertical_scenario
from fedcore.models.registry import ModelRegistry
from fedcore.protocol.messages import Message
from fedcore.transport.base import Transport
from fedcore.transport.inprocess import InProcessTransport
from fedcore.trees.params import ForestParams
from fedcore.vertical import session as session_module
from fedcore.vertical.agent import VerticalInstitutionAgent
from fedcore.vertical.session import VerticalSession
from tests.compute.federation import refuse_readers
from tests.compute.test_vertical_parquet import BLOCK_ROWS, _parquet_agents, _train, _write
from tests.compute.workers import losable_cluster, lose_a_worker_on_call
from tests.keys import master_key
from tests.vertical.test_session import _agents

PREDICTION_KINDS = {"load_holdout", "batch_hashes", "align_batch", "predict_leaves", "route",
                    "deliver_predictions"}


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> dict:
    return make_vertical_scenario(tmp_path_factory.mktemp("scenario"), n_customers=600, n_new=300, seed=3)


@pytest.fixture(scope="module")
def in_process_evaluation(scenario, tmp_path_factory) -> tuple[dict, tuple]:
    """The in-process agents' replies (`_recorded`) and `_train`'s forest and held-out evaluation."""
    local = _agents(scenario, tmp_path_factory.mktemp("local"), new_batch=False)
    seen = _recorded(local)
    return seen, _train(local, "none")


@pytest.fixture(scope="module")
def in_process_prediction(scenario, tmp_path_factory) -> tuple:
    """`_predict` of the in-process agents: what the Dask runs must give (read only, computed once)."""
    return _predict(_agents(scenario, tmp_path_factory.mktemp("local-predict")), scenario)


def _dask_agents(scenario: dict, root: Path, client) -> dict[str, VerticalInstitutionAgent]:
    """`_parquet_agents` whose new batch is Parquet blocks the workers read (as `_open_batch` opens them)."""
    return _with_parquet_batch(_parquet_agents(scenario, root, client), scenario, root, client)


def _with_parquet_batch(agents: dict, scenario: dict, root: Path,
                        client) -> dict[str, VerticalInstitutionAgent]:
    """`agents` whose new batch is Parquet blocks the workers of `client` read."""
    for name, agent in agents.items():
        files = _write(pd.read_parquet(scenario["institutions"][name]["new"]), root / "new" / name)
        what = f"institution {name!r} prediction data"
        agent.data.open_batch = (lambda files=files, what=what: profile(
            client, open_parquet(files, what, BLOCK_ROWS), [scenario["id_column"]]))
        agent.data.cluster = Cluster(client, [])
    return agents


def _recorded(agents: dict) -> dict[str, list]:
    """Every prediction reply of each agent: (request kind, reply kind, header, arrays' dtype and bytes)."""
    seen: dict[str, list] = {name: [] for name in agents}
    for name, agent in agents.items():
        handle = agent.handle

        def record(message: Message, name=name, handle=handle) -> Message:
            reply = handle(message)
            if message.kind in PREDICTION_KINDS:
                arrays = {k: (v.dtype.str, v.shape, v.tobytes()) for k, v in reply.arrays.items()}
                header = {k: v for k, v in reply.header.items() if k != "path"}
                seen[name].append((message.kind, reply.kind, header, arrays))
            return reply

        agent.handle = record  # type: ignore[method-assign]
    return seen


def _predict(agents: dict, scenario: dict, monkeypatch=None, alignment: str = "hash",
             transport: Callable[[dict], Transport] = InProcessTransport) -> tuple:
    """Train (hash alignment), predict the batch aligned by `alignment`, again in row batches of 100.

    The predictions are delivered to the label holder.
    """
    seen = _recorded(agents)
    session = VerticalSession(transport({n: a.handle for n, a in agents.items()}),
                              ForestParams(n_estimators=3, max_depth=4, random_state=1),
                              holdout_fraction=0.25, min_overlap=100)
    session.align()
    session.train()
    metrics = session.evaluate()  # the held-out rows: in their blocks on Dask
    session.alignment = alignment
    if monkeypatch is not None:
        refuse_readers(monkeypatch)  # no agent reads a batch row: the threaded workers read with pyarrow
    result = session.batch_predict(scenario["label_holder"])
    values = [session.master.predict_values(result["rows"], method, batch_rows=100)
              for method in ("one-round", "node-by-node")]
    if monkeypatch is not None:
        monkeypatch.undo()
    delivered = pd.read_parquet(result["path"])
    session.close()
    return seen, delivered, values, metrics


@pytest.mark.slow  # 11-16 s on 2 cores: an end-to-end run, in CI's slow pass (make test-slow)
def test_a_batch_on_the_workers_answers_as_the_in_process_agent(scenario, tmp_path, three_workers,
                                                                 in_process_prediction, monkeypatch) -> None:
    expected = in_process_prediction
    agents = _dask_agents(scenario, tmp_path / "dask", three_workers)
    got = _predict(agents, scenario, monkeypatch)
    assert got[0] == expected[0]
    kinds = [kind for kind, *_ in got[0][scenario["label_holder"]]]
    # the held-out rows, the batch in one row batch, then in row batches of 100
    assert kinds.count("predict_leaves") == 2 + -(-len(got[1]) // 100) and "route" in kinds
    pd.testing.assert_frame_equal(got[1], expected[1])
    assert len(got[1]) > 2 * BLOCK_ROWS
    for g, e in zip(got[2], expected[2], strict=True):
        assert g.tobytes() == e.tobytes()
    assert got[3] == expected[3] and set(got[3]) >= {"accuracy"}
    for agent in agents.values():
        rows = agent.party._prediction
        assert isinstance(rows, DaskPredictionRows) and len(rows.blocks) > 2


@pytest.mark.slow  # 11-16 s on 2 cores: an end-to-end run, in CI's slow pass (make test-slow)
def test_a_batch_whose_positions_are_read_part_by_part_answers_as_the_in_process_agent(
        scenario, tmp_path, three_workers, in_process_prediction, monkeypatch) -> None:
    from tests.compute.test_streamed_align import PartedTransport

    monkeypatch.setattr(session_module, "ALIGN_PART_ROWS", 64)  # the ~150 common batch rows: 3 parts
    agents = _dask_agents(scenario, tmp_path / "dask", three_workers)
    transports: list[PartedTransport] = []

    def parted(handlers: dict) -> PartedTransport:
        transports.append(PartedTransport(handlers, agents))
        return transports[-1]

    got = _predict(agents, scenario, transport=parted)
    assert got[0] == in_process_prediction[0]
    pd.testing.assert_frame_equal(got[1], in_process_prediction[1])
    parted_kinds = [(kind, n) for kind, n in transports[0].parted if kind == "align_batch"]
    assert len(parted_kinds) == 3 and all(n >= 3 for _, n in parted_kinds), transports[0].parted


@pytest.mark.slow
def test_psi_on_a_batch_on_the_workers_delivers_the_in_process_predictions(scenario, tmp_path,
                                                                           three_workers) -> None:
    """PSI blinds afresh each session, so the messages and the rows' order differ; each ID's prediction not.

    (Both sessions train on hash alignment: PSI's fresh order would give each its own holdout and forest.)
    """
    expected = _predict(_agents(scenario, tmp_path / "local"), scenario, alignment="psi")
    got = _predict(_dask_agents(scenario, tmp_path / "dask", three_workers), scenario, alignment="psi")
    by_id = [frame.sort_values(scenario["id_column"], ignore_index=True) for frame in (got[1], expected[1])]
    pd.testing.assert_frame_equal(*by_id)
    assert got[3] == expected[3]
    assert not got[1].equals(by_id[0])  # the canonical order is not the IDs' (it is a blinded shuffle)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_lost_during_prediction_gives_the_same_answer(scenario, tmp_path, in_process_prediction,
                                                               monkeypatch) -> None:
    expected = in_process_prediction
    with losable_cluster() as (cluster, client):
        lost = lose_a_worker_on_call(monkeypatch, DaskPredictionRows, "split_sets", 2, cluster, client)
        got = _predict(_dask_agents(scenario, tmp_path / "dask", client), scenario)
        assert lost and len(client.scheduler_info()["workers"]) == 2
    assert got[0] == expected[0] and got[3] == expected[3]
    pd.testing.assert_frame_equal(got[1], expected[1])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("call", [pytest.param(1, marks=pytest.mark.slow), 3])
def test_a_worker_lost_during_the_held_out_evaluation_gives_the_in_process_answers(scenario, tmp_path,
                                                                                   in_process_evaluation,
                                                                                   monkeypatch, call) -> None:
    """The held-out blocks and their codes are made by tasks: a lost worker's are read, cut and encoded again.

    The worker goes after the first institution's held-out split sets (call 1: the others' blocks are rebuilt
    to answer) or after the last one's (call 3: the label holder's held-out labels are rebuilt to score).
    """
    expected_seen, expected = in_process_evaluation
    with losable_cluster() as (cluster, client):
        lost = lose_a_worker_on_call(monkeypatch, DaskPredictionRows, "split_sets", call, cluster, client)
        agents = _parquet_agents(scenario, tmp_path / "dask", client)
        seen = _recorded(agents)
        got = _train(agents, "none")
        assert lost and len(client.scheduler_info()["workers"]) == 2
    assert [kind for kind, *_ in seen[scenario["label_holder"]]] == ["load_holdout", "predict_leaves"]
    assert seen == expected_seen
    assert got == expected and set(got[1]) >= {"accuracy"}


def test_a_loaded_model_predicts_a_batch_on_the_workers_as_the_training_session(scenario, tmp_path,
                                                                                 three_workers) -> None:
    """The predict flow's path: fresh Dask agents load their stored partial models, then predict in blocks."""
    holder = scenario["label_holder"]
    agents = _agents(scenario, tmp_path)
    session = VerticalSession(InProcessTransport({n: a.handle for n, a in agents.items()}),
                              ForestParams(n_estimators=3, max_depth=4, random_state=1), min_overlap=100)
    session.align()
    session.train()
    registry = ModelRegistry(tmp_path / "registry" / "master", signing_key=master_key(tmp_path))
    version = registry.register("demo", {"task": "classification",
                                         "parties": session.manifest_entries()["parties"]},
                                session.master_tables())
    session.store_at_institutions("demo", version, registry.read_manifest("demo", version))
    trained = pd.read_parquet(session.batch_predict(holder)["path"])
    session.close()

    fresh = _dask_agents(scenario, tmp_path, three_workers)  # the same registries
    transport = InProcessTransport({n: a.handle for n, a in fresh.items()})
    transport.exchange({n: Message("validation_report") for n in fresh})
    loaded = VerticalSession(transport, ForestParams(), min_overlap=100)
    assert loaded.load_model(registry, "demo", "latest") == version
    pd.testing.assert_frame_equal(pd.read_parquet(loaded.batch_predict(holder)["path"]), trained)
    assert all(isinstance(a.party._prediction, DaskPredictionRows) for a in fresh.values())
    loaded.close()


def test_a_csv_trained_party_with_a_parquet_batch_uses_one_cluster(scenario, tmp_path, three_workers,
                                                                   in_process_prediction) -> None:
    """Training rows from the agent (CSV) and a batch the workers read: the same cluster, one connection."""
    expected = in_process_prediction
    in_agent = _agents(scenario, tmp_path / "mixed", compute=DaskCompute(block_rows=BLOCK_ROWS))
    agents = _with_parquet_batch(in_agent, scenario, tmp_path / "mixed", three_workers)
    got = _predict(agents, scenario)
    assert got[0] == expected[0] and got[3] == expected[3]
    pd.testing.assert_frame_equal(got[1], expected[1])
    for agent in agents.values():
        assert agent.party.rows.client is three_workers
        assert isinstance(agent.party._prediction, DaskPredictionRows)


@pytest.mark.parametrize("cuts", [[0], [1], [63], [64], [100], [203], [64, 128], [40, 80, 120, 160]])
def test_row_sets_cut_at_any_row_join_to_the_whole_sets(cuts) -> None:
    """Whole words side by side (cuts at multiples of 64) or bits repacked: the sets of all 203 rows."""
    rng = np.random.default_rng(0)
    bits = (rng.random((5, 203)) < 0.5).astype(np.uint8)
    words = _words(bits)
    assert words.dtype == np.uint64 and words.shape == (5, 4)
    assert int(words[0, 0]) == sum(int(b) << i for i, b in enumerate(bits[0, :64]))
    edges = [0, *cuts, 203]
    parts = [_words(bits[:, a:b]) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    for part, a, b in zip(parts, edges[:-1], edges[1:], strict=True):
        assert _bits(part, b - a).tobytes() == bits[:, a:b].tobytes()
    joined = join_row_sets(parts, np.diff(edges).tolist(), 5)
    assert joined.dtype == np.uint64 and joined.tobytes() == words.tobytes()
