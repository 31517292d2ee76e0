"""A vertical party whose Parquet table never passes its agent trains the in-process forest (issue #29).

Every institution's table is rewritten as three Parquet files of row groups of 70 rows, cut into blocks of
40; the agent holds their metadata, its workers hash, align, fit the binner and bin. The forest, the
held-out evaluation and the `id_hashes` answer are the in-process agent's, byte for byte.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcore.agents.data import InstitutionData
from fedcore.compute import dask_alignment
from fedcore.compute.blocks import rebuildable
from fedcore.compute.cluster import Cluster, DaskCompute
from fedcore.compute.dask_binning import fit_on_blocks
from fedcore.compute.dask_table import open_parquet, profile
from fedcore.data.binning import PartyBinner
from fedcore.data.scenario import make_vertical_scenario
from fedcore.errors import DataReadError, InputError, ProtocolError
from fedcore.protocol.messages import Message, unpack_bits
from fedcore.transport.inprocess import InProcessTransport
from fedcore.trees.params import ForestParams
from fedcore.vertical.agent import VerticalInstitutionAgent
from fedcore.vertical.alignment import align_frame
from fedcore.vertical.session import VerticalSession
from tests.compute.federation import refuse_readers
from tests.compute.workers import losable_cluster, lose_a_worker_on_call
from tests.conftest import mixed_table
from tests.keys import master_public_key
from tests.vertical.test_session import KEY, _agents

GROUP_ROWS, BLOCK_ROWS = 70, 40


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> dict:
    return make_vertical_scenario(tmp_path_factory.mktemp("scenario"), n_customers=600, seed=3)


def _write(frame: pd.DataFrame, folder: Path, n_files: int = 3) -> list[str]:
    """`frame` as `n_files` Parquet files of row groups of GROUP_ROWS rows, in the order they concatenate."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i, part in enumerate(np.array_split(np.arange(len(frame)), n_files)):
        path = folder / f"part-{i}.parquet"
        pq.write_table(pa.Table.from_pandas(frame.iloc[part], preserve_index=False), path,
                       row_group_size=GROUP_ROWS)
        files.append(str(path))
    return files


def _parquet_agents(scenario: dict, root: Path, client) -> dict[str, VerticalInstitutionAgent]:
    """The scenario's institutions as agents whose workers (on `client`) read their Parquet files."""
    agents = {}
    for name, files in scenario["institutions"].items():
        what = f"institution {name!r}"
        table = profile(client, open_parquet(_write(pd.read_parquet(files["train"]), root / "data" / name),
                                             what, BLOCK_ROWS), [scenario["id_column"]])
        label = scenario["label"] if name == scenario["label_holder"] else None
        data = InstitutionData(
            name=name, frame=pd.DataFrame(columns=list(table.columns)), id_column=scenario["id_column"],
            label=label, registry=root / "registry" / name, predictions_dir=root / "predictions" / name,
            master_key=master_public_key(root), compute=DaskCompute(block_rows=BLOCK_ROWS), table=table,
            cluster=Cluster(client, []))
        agents[name] = VerticalInstitutionAgent(data, KEY)
    return agents


def _train(agents: dict, privacy: str, alignment: str = "hash",
           **params) -> tuple[dict[str, bytes], dict[str, float]]:
    """The forest a session trains over `agents` (every array's bytes) and its held-out evaluation."""
    session = VerticalSession(InProcessTransport({n: a.handle for n, a in agents.items()}),
                              ForestParams(n_estimators=3 if privacy == "none" else 2, max_depth=4,
                                           random_state=1, privacy=privacy,
                                           key_bits=None if privacy == "none" else 2048, **params),
                              holdout_fraction=0.25, min_overlap=100, alignment=alignment)
    session.align()
    session.train()
    metrics = session.evaluate()
    s = session.master.structure
    arrays = {f: np.asarray(getattr(s, f)).tobytes() for f in ("tree", "node", "left", "right", "owner",
                                                                "weight", "value")}
    for name, agent in agents.items():
        for field in ("feature", "threshold", "missing_left", "is_categorical", "cat_bits"):
            arrays[f"{name}.{field}"] = np.asarray(getattr(agent.party.model, field)).tobytes()
    session.close()
    return arrays, metrics


@pytest.mark.parametrize("workers", ["one_worker", "three_workers"])
def test_agents_on_parquet_blocks_train_the_in_process_forest(scenario, tmp_path, workers, request,
                                                              monkeypatch) -> None:
    client = request.getfixturevalue(workers)
    expected = _train(_agents(scenario, tmp_path / "local", new_batch=False), "none")
    agents = _parquet_agents(scenario, tmp_path / "dask", client)
    refuse_readers(monkeypatch)  # no agent reads a row: the threaded workers read with pyarrow
    got = _train(agents, "none")
    monkeypatch.undo()
    assert got[1] == expected[1]
    assert got[0].keys() == expected[0].keys()
    for name in expected[0]:
        assert got[0][name] == expected[0][name], name
    for agent in agents.values():
        rows = agent.party.rows
        assert type(rows).__name__ == "DaskVerticalRows" and rows.features is None
        assert len(rows.blocks) == -(-rows.n_rows // BLOCK_ROWS) > 2 and agent.aligned_ids is None
        held = agent.party._prediction  # the held-out rows were evaluated in their blocks
        assert type(held).__name__ == "DaskPredictionRows"
        assert len(held.blocks) == -(-held.n_rows // BLOCK_ROWS) > 1


def test_an_encrypted_session_on_parquet_blocks_trains_the_in_process_forest(scenario, tmp_path,
                                                                             three_workers) -> None:
    expected = _train(_agents(scenario, tmp_path / "local", new_batch=False), "ou")
    got = _train(_parquet_agents(scenario, tmp_path / "dask", three_workers), "ou")
    assert got[1] == expected[1]
    for name in expected[0]:
        assert got[0][name] == expected[0][name], name


@pytest.mark.parametrize("privacy", ["none", pytest.param("ou", marks=pytest.mark.slow)])
def test_a_regression_session_on_parquet_blocks_trains_the_in_process_forest(scenario, tmp_path,
                                                                            three_workers, privacy) -> None:
    """Regression on Dask (issue #29): the bank's tenure as the label; the same forest and held-out scores."""
    regression = {**scenario, "label": "tenure_years"}
    params = {"task": "regression", "criterion": "squared_error"}
    expected = _train(_agents(regression, tmp_path / "local", new_batch=False), privacy, **params)
    got = _train(_parquet_agents(regression, tmp_path / "dask", three_workers), privacy, **params)
    assert got[1] == expected[1] and {"rmse", "r2", "mae"} <= set(got[1])
    assert got[0].keys() == expected[0].keys()
    for name in expected[0]:
        assert got[0][name] == expected[0][name], name


def _aligned_rows(agent: VerticalInstitutionAgent, client) -> pd.DataFrame:
    """A Dask agent's training rows, gathered from its blocks in order (to compare; the agent never does)."""
    return pd.concat(client.gather(agent.party.rows.frames), ignore_index=True)


def test_blocks_aligned_on_the_workers_are_align_frames_rows(tmp_path, three_workers) -> None:
    """Random positions and holdout: the training blocks in order, the held-out rows: `align_frame`'s."""
    frame = mixed_table(n_rows=300, seed=5).drop(columns=["target"])
    frame.insert(0, "id", [f"C{i}" for i in range(300)])
    table = profile(three_workers, open_parquet(_write(frame, tmp_path), "institution 'north'", BLOCK_ROWS))
    rng = np.random.default_rng(0)
    positions = rng.permutation(300)[:220]
    holdout = rng.random(220) < 0.3
    aligned = dask_alignment.align_blocks(three_workers, table, positions, holdout, "id", 37)
    expected = align_frame(frame, positions).drop(columns=["id"])
    assert aligned.sizes == [37] * 4 + [int((~holdout).sum()) - 148]
    pd.testing.assert_frame_equal(pd.concat(three_workers.gather(aligned.frames), ignore_index=True),
                                  expected[~holdout].reset_index(drop=True))
    held = int(holdout.sum())
    assert aligned.held.sizes == [37] * (held // 37) + [held % 37] * (held % 37 > 0)
    pd.testing.assert_frame_equal(pd.concat(three_workers.gather(aligned.held.frames), ignore_index=True),
                                  expected[holdout].reset_index(drop=True))


def test_psi_alignment_aligns_the_blocks_as_the_in_process_agent(scenario, tmp_path, three_workers,
                                                                 monkeypatch) -> None:
    """PSI blinds in the agent (the ID column is gathered there); the rows it aligns are `align_frame`'s.

    Blinding secrets are fresh per session, so the canonical order is too: each agent's own row numbers
    (after PSI) and the holdout bits it was sent are recorded, and the in-process alignment compared.
    """
    seen: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    mapped = VerticalInstitutionAgent._rows

    def record(self, positions):
        rows = mapped(self, positions)
        seen[self.name] = rows, self._align_holdout
        return rows

    agents = _parquet_agents(scenario, tmp_path / "dask", three_workers)
    for agent in agents.values():
        handle = agent.handle

        def remember(message, agent=agent, handle=handle):
            if message.kind == "align":
                bits = unpack_bits(message.arrays["holdout"], message.header["rows"])
                agent._align_holdout = bits.astype(bool)
            return handle(message)

        agent.handle = remember  # type: ignore[method-assign]
    monkeypatch.setattr(VerticalInstitutionAgent, "_rows", record)
    _train(agents, "none", "psi")
    for name, agent in agents.items():
        rows, holdout = seen[name]
        frame = pd.read_parquet(scenario["institutions"][name]["train"])
        expected = align_frame(frame, rows).drop(columns=[scenario["id_column"]])
        assert 0 < holdout.sum() < len(holdout)
        pd.testing.assert_frame_equal(_aligned_rows(agent, three_workers),
                                      expected[~holdout].reset_index(drop=True))
        held = pd.concat(three_workers.gather(agent._holdout.frames), ignore_index=True)
        pd.testing.assert_frame_equal(held, expected[holdout].reset_index(drop=True))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_lost_mid_forest_rebuilds_the_aligned_blocks(scenario, tmp_path, monkeypatch) -> None:
    """The aligned blocks and their codes are made by tasks: a lost worker's are read and cut again."""
    from fedcore.compute.dask_vertical import DaskVerticalRows

    expected = _train(_agents(scenario, tmp_path / "local", new_batch=False), "none")
    with losable_cluster() as (cluster, client):
        lost = lose_a_worker_on_call(monkeypatch, DaskVerticalRows, "best_splits", 8, cluster, client)
        got = _train(_parquet_agents(scenario, tmp_path / "dask", client), "none")
        assert lost and len(client.scheduler_info()["workers"]) == 2
    assert got == expected


@pytest.mark.timeout(120)
@pytest.mark.parametrize("alignment", ["hash", "psi"])
def test_a_worker_lost_while_the_ids_are_hashed_gives_the_in_process_answer(scenario, tmp_path, monkeypatch,
                                                                            alignment) -> None:
    """Each block's digests (PSI: blinded IDs) are a task over its file: a lost worker's are made again.

    The worker goes once the first institution's blocks have all been hashed (blinded), before the agent
    gathers them; every institution's answer is still the in-process one, byte for byte.
    """
    from fedcore.compute import dask_psi
    from fedcore.privacy.psi import PSIParty

    local = _agents(scenario, tmp_path / "local", new_batch=False)
    secret = bytes(range(32))
    with losable_cluster() as (cluster, client):
        dask = _parquet_agents(scenario, tmp_path / "dask", client)
        lost = lose_a_worker_on_call(monkeypatch, dask_alignment if alignment == "hash" else dask_psi,
                                     "submit_blocks", 1, cluster, client, settle=True)
        for name, agent in dask.items():
            assert agent.data.table is not None and len(agent.data.table.blocks) > 3
            if alignment == "hash":
                expected, got = (a[name].handle(Message("id_hashes")) for a in (local, dask))
                assert got.header == expected.header
                expected_bytes, got_bytes = (m.arrays["hashes"].tobytes() for m in (expected, got))
            else:
                ids = pd.read_parquet(scenario["institutions"][name]["train"])[scenario["id_column"]]
                expected_bytes = PSIParty(name, ids, key=KEY, secret=secret).outgoing().tobytes()
                party = dask_psi.BlockPSIParty(client, name, agent.data.table, scenario["id_column"], KEY,
                                               secret, BLOCK_ROWS)
                got_bytes = b"".join(part.tobytes() for part in party.outgoing())
            assert got_bytes == expected_bytes, name
        assert lost and len(client.scheduler_info()["workers"]) == 2


def test_the_id_hashes_answer_is_the_in_process_one(scenario, tmp_path, three_workers) -> None:
    local = _agents(scenario, tmp_path / "local", new_batch=False)
    dask = _parquet_agents(scenario, tmp_path / "dask", three_workers)
    for name in local:
        expected, got = (agents[name].handle(Message("id_hashes")) for agents in (local, dask))
        assert got.header == expected.header
        assert got.arrays["hashes"].dtype == expected.arrays["hashes"].dtype == np.uint8
        assert got.arrays["hashes"].tobytes() == expected.arrays["hashes"].tobytes()


def test_an_id_repeated_in_two_blocks_is_refused(tmp_path, three_workers) -> None:
    frame = pd.DataFrame({"id": [f"C{i}" for i in range(100)], "x": np.arange(100.0)})
    frame.loc[90, "id"] = " c3"  # the same ID as row 3 once normalised, in another file
    table = open_parquet(_write(frame, tmp_path), "institution 'north'", BLOCK_ROWS)
    with pytest.raises(InputError) as refused:
        dask_alignment.block_hashes(three_workers, table, "id", KEY)
    assert str(refused.value) == ("institution 'north': ID column 'id' has 1 IDs that occur more than once "
                                  "after normalisation (in different blocks of its files); each row needs a "
                                  "unique ID")


def _blocks(client, frame: pd.DataFrame, sizes: list[int]) -> list:
    ends = np.cumsum([0, *sizes])
    return [client.submit(rebuildable, frame.iloc[a:b].reset_index(drop=True), pure=False)
            for a, b in zip(ends[:-1], ends[1:], strict=True)]


@pytest.mark.parametrize("subsample", [150, 100_000])
def test_the_binner_fitted_over_blocks_is_party_binner_fit(three_workers, subsample) -> None:
    """NaNs, few distinct values, an empty column, more rows than `subsample` (150) or fewer (100,000)."""
    frame = mixed_table(n_rows=500, seed=4).drop(columns=["target"])
    frame["few"] = np.where(np.arange(500) % 7 == 0, np.nan, np.arange(500) % 3)
    frame["empty"] = np.nan
    frame["spiky"] = np.round(np.random.default_rng(2).exponential(size=500), 1)
    columns = list(frame.columns)
    sizes = [0, 130, 1, 200, 169]  # uneven, one block empty
    for max_bins in (4, 32):
        expected = PartyBinner(max_bins=max_bins, subsample=subsample, random_state=7).fit(frame)
        got = fit_on_blocks(PartyBinner(max_bins=max_bins, subsample=subsample, random_state=7),
                            three_workers, _blocks(three_workers, frame, sizes), columns)
        assert [c.name for c in got.columns] == columns
        for e, g in zip(expected.columns, got.columns, strict=True):
            assert g.is_categorical == e.is_categorical and g.categories == e.categories, e.name
            if not e.is_categorical:
                assert g.edges is not None and e.edges is not None
                assert g.edges.dtype == e.edges.dtype and g.edges.tobytes() == e.edges.tobytes(), e.name
        assert sum(len(c.edges) for c in got.columns if c.edges is not None) > 10


def test_a_worker_side_read_error_is_one_line_naming_the_file(tmp_path, three_workers) -> None:
    frame = pd.DataFrame({"id": [f"C{i}" for i in range(100)], "x": np.arange(100.0)})
    files = _write(frame, tmp_path)
    table = open_parquet(files, "institution 'north'", BLOCK_ROWS)
    Path(files[1]).write_bytes(b"not a parquet file any more")  # replaced after the agent opened it
    with pytest.raises(DataReadError) as refused:
        dask_alignment.block_hashes(three_workers, table, "id", KEY)
    assert str(refused.value) == (f"cannot read {files[1]!r}: ArrowInvalid: Parquet magic bytes not found in "
                                  "footer. Either the file is corrupted or this is not a parquet file.")
    assert re.fullmatch(r"[^\n]+", str(refused.value))


def test_psi_blinded_per_block_is_the_in_process_message(scenario, three_workers, tmp_path) -> None:
    """One secret: the blocks' blinded IDs, sorted in key ranges on the workers, are `PSIParty.outgoing`.

    Byte for byte, streamed one range at a time; positions map to the same rows, and a peer's list re-blinded
    in chunks of 4 on the workers is the in-process re-blinding.
    """
    from fedcore.compute.dask_psi import BlockPSIParty
    from fedcore.privacy.psi import PSIParty

    frame = pd.read_parquet(scenario["institutions"]["bank"]["train"])
    table = open_parquet(_write(frame, tmp_path), "institution 'bank'", BLOCK_ROWS)
    secret = bytes(range(32))
    expected = PSIParty("bank", frame[scenario["id_column"]], key=KEY, secret=secret)
    got = BlockPSIParty(three_workers, "bank", table, scenario["id_column"], KEY, secret, 4)
    parts = list(got.outgoing())
    assert len(table.blocks) > 3 and len(parts) == len(table.blocks) and got.n_rows == len(frame)
    assert all(p.dtype == np.uint8 and p.shape[1] == 32 for p in parts)
    assert b"".join(p.tobytes() for p in parts) == expected.outgoing().tobytes()
    positions = np.random.default_rng(3).permutation(len(frame))[:40]
    assert got.rows_from_positions(positions).tolist() == expected.rows_from_positions(positions).tolist()
    peer = expected.outgoing()[:9]
    reblinded = list(got.reblind([peer]))
    assert [len(p) for p in reblinded] == [4, 4, 1]
    assert b"".join(p.tobytes() for p in reblinded) == expected.reblind(peer).tobytes()
    with pytest.raises(ProtocolError) as refused:
        got.rows_from_positions(np.array([3, 3]))
    assert str(refused.value) == "PSI party 'bank': positions repeat a row"


def test_an_id_repeated_in_two_blocks_is_refused_by_psi_as_in_process(tmp_path, three_workers) -> None:
    from fedcore.compute.dask_psi import BlockPSIParty
    from fedcore.errors import ParameterError
    from fedcore.privacy.psi import PSIParty

    frame = pd.DataFrame({"id": [f"C{i}" for i in range(100)], "x": np.arange(100.0)})
    frame.loc[90, "id"] = " c3"  # the same ID as row 3 once normalised, in another file
    table = open_parquet(_write(frame, tmp_path), "institution 'north'", BLOCK_ROWS)
    secret = bytes(32)
    with pytest.raises(ParameterError) as expected:
        PSIParty("north", frame["id"], key=KEY, secret=secret)
    with pytest.raises(ParameterError) as refused:
        BlockPSIParty(three_workers, "north", table, "id", KEY, secret, BLOCK_ROWS)
    assert str(refused.value) == str(expected.value) == (
        "PSI party 'north' has 1 duplicate IDs among 100 rows (after normalisation); each row needs a "
        "unique ID")
