"""Horizontal training survives a crash.

The master checkpoints every finished tree batch, every institution its own per-batch state, and a session
interrupted mid-training resumes after the last batch all of them completed, ending with the forest, byte for
byte, of an uninterrupted run (FET in every privacy mode, PPD-ERT with secure aggregation).
"""

from __future__ import annotations

import pandas as pd
import pytest

from fedcore.agents.data import InstitutionData
from fedcore.checkpoints import CHECKPOINTS, CheckpointStore
from fedcore.contracts.model import infer_contract
from fedcore.data.datasets import make_waveform
from fedcore.data.split import split_horizontal
from fedcore.errors import PartyUnavailable
from fedcore.horizontal.agent import NOISE_SEEDS, HorizontalInstitutionAgent
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.session import HorizontalSession
from fedcore.models.artifacts import table_file_bytes
from fedcore.privacy.keyauth import ephemeral_identities
from fedcore.protocol.messages import Message
from fedcore.transport.inprocess import InProcessTransport

NAMES = ("north", "south", "east")
PARAMS = ExtraTreesParams(n_estimators=8, max_depth=6, tree_batch_size=2, random_state=4)
RUN = "run-7"
FIRST_REQUEST = {"extra-trees": "fet_ranges", "ppd-ert": "ppdert_cells", "ppd-ert domain": "ppdert_level"}
"""The first request of every tree batch."""


def _first_request(algorithm: str, privacy: dict | None) -> str:
    domain = (privacy or {}).get("thresholds") == "domain" or (privacy or {}).get("mode") == "secagg-dp"
    return FIRST_REQUEST[f"{algorithm} domain" if domain else algorithm]


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    frame = make_waveform(900, random_state=3)
    frame["class"] = frame["class"].map({0: "a", 1: "b", 2: "c"})
    frame.insert(0, "patient_id", [f"P{i:05d}" for i in range(len(frame))])
    return frame


def _agents(table: pd.DataFrame, root) -> dict[str, HorizontalInstitutionAgent]:
    contract = infer_contract(table, "waveform", id_column="patient_id", label="class")
    identities = ephemeral_identities(NAMES)  # sign PPD-ERT's secure-aggregation keys (no certificates here)
    return {name: HorizontalInstitutionAgent(InstitutionData(
        name=name, frame=part, id_column="patient_id", label="class", registry=root / "registry" / name,
        predictions_dir=root / "predictions" / name, contract=contract), identity=identities[name])
        for name, part in zip(NAMES, split_horizontal(table, 3, seed=1), strict=True)}


class Crash(PartyUnavailable):
    """Stands in for the process dying (the transport reports a lost party as PartyUnavailable)."""


def _crashing(agent: HorizontalInstitutionAgent, kind: str, at: int):
    """The agent's handler, dying on the `at`-th `kind` request (batch at - 1 starting), before it sees it."""
    seen = [0]

    def handle(message: Message) -> Message:
        if message.kind == kind and message.header.get("new_batch"):
            seen[0] += 1
            if seen[0] == at:
                raise Crash(f"institution {agent.name!r}: connection lost")
        return agent.handle(message)
    return handle


def _session(agents, algorithm, privacy=None, handlers=None, seeds=None) -> HorizontalSession:
    """A session up to the agreed schema.

    `seeds` fixes the parties' secret noise seeds (DP modes), as a deployment's own secrets would be, so that
    two runs can be compared.
    """
    transport = InProcessTransport(handlers or {n: a.handle for n, a in agents.items()})
    transport.exchange({n: Message("validation_report") for n in agents})
    session = HorizontalSession(transport, PARAMS, algorithm=algorithm, privacy=privacy, holdout_fraction=0.2)
    session.agree_schema()
    for name, seed in (seeds or {}).items():  # secagg-dp: the seed of the party's share of the noise
        party = agents[name].party
        (party.noise if getattr(party, "noise", None) is not None else party).noise_seed = seed
    return session


def _model_bytes(session: HorizontalSession, agents) -> dict[str, bytes]:
    out = {"master": table_file_bytes(session.model.to_table())}
    out.update({n: table_file_bytes(a.model.to_table()) for n, a in agents.items()})
    return out


CASES = [
    pytest.param("extra-trees", None, id="fet-none"),
    pytest.param("ppd-ert", None, id="ppdert-secagg"),
    pytest.param("ppd-ert", {"mode": "secagg", "thresholds": "domain"}, id="ppdert-secagg-domain"),
    pytest.param("extra-trees", {"mode": "gdp", "epsilon": 2.0}, id="fet-gdp"),
    # plan leaves: a chosen level, drawn levels, one leaf release per tree keyed by the queries answered
    pytest.param("extra-trees", {"mode": "gdp", "epsilon": 2.0, "plan": "leaves", "split_levels": 1},
                 id="fet-gdp-leaves"),
    # plan marginals: the master's class weights start again from the boxes at a resumed batch's first
    # drawn level (below a chosen one)
    pytest.param("extra-trees", {"mode": "gdp", "epsilon": 2.0, "plan": "marginals", "split_levels": 1},
                 id="fet-gdp-marginals"),
    # noise keyed by round id (restored) and the restored seed; the ledger restored before hello
    pytest.param("ppd-ert", {"mode": "secagg-dp", "epsilon": 2.0}, id="ppdert-secagg-dp"),
    pytest.param("extra-trees", {"mode": "ldp"}, id="fet-ldp"),  # "auto": one report per row
    # fresh instant reports keyed by each party's count of answered queries
    pytest.param("extra-trees", {"mode": "ldp", "mechanism": "bloom"}, id="fet-ldp-bloom"),
]


@pytest.mark.parametrize(("algorithm", "privacy"), CASES)
def test_a_run_killed_mid_training_resumes_to_the_same_model(table, tmp_path, algorithm, privacy) -> None:
    reference_agents = _agents(table, tmp_path / "reference")
    seeds = {n: 1000 + i for i, n in enumerate(NAMES)}
    reference = _session(reference_agents, algorithm, privacy, seeds=seeds)
    reference.train()
    expected = _model_bytes(reference, reference_agents)
    spent = {n: a.party.privacy_spent() for n, a in reference_agents.items()}

    agents = _agents(table, tmp_path / "crash")
    handlers = {n: a.handle for n, a in agents.items()}
    # south dies as batch 3 starts: it has saved batches 0 and 1 (batch 2 is saved on batch 3's request)
    handlers["south"] = _crashing(agents["south"], _first_request(algorithm, privacy), at=4)
    checkpoints = tmp_path / "crash" / "master-checkpoints"
    with pytest.raises(Crash):
        _session(agents, algorithm, privacy, handlers, seeds=seeds).train(checkpoints, RUN)
    saved = {n: sorted(p.name for p in (tmp_path / "crash" / "registry" / n / CHECKPOINTS / RUN)
                       .glob("*.sha256")) for n in NAMES}
    # north got batch 3's first request (and saved batch 2) before south died; east never got it
    assert saved["south"] == saved["east"] == ["batch-00000.sha256", "batch-00001.sha256"]
    assert saved["north"] == [*saved["south"], "batch-00002.sha256"]
    assert len(list((checkpoints / RUN).glob("batch-*.sha256"))) == 3  # the master finished batch 2

    restarted = _agents(table, tmp_path / "crash")  # fresh processes: nothing survives in memory
    other = {n: 5000 + i for i, n in enumerate(NAMES)}  # a restarted agent draws a new secret seed
    session = _session(restarted, algorithm, privacy, seeds=other)
    session.train(checkpoints, RUN)
    assert session.facts.resumed_batches == 2  # the last batch south completed; batch 2 is grown again
    assert session.facts.rounds < reference.facts.rounds  # batches 0 and 1 were not grown again
    assert _model_bytes(session, restarted) == expected
    assert {n: a.party.privacy_spent() for n, a in restarted.items()} == spent
    if privacy and privacy["mode"] in ("gdp", "secagg-dp"):  # batch 2 charged once: within the budget
        assert all(0 < s["epsilon_total"] <= 2.0 and s["releases_per_row"] <= s["planned_releases_per_row"]
                   for s in spent.values())

    session.drop_checkpoints()
    assert not (checkpoints / RUN).exists()
    assert not any((tmp_path / "crash" / "registry").rglob("batch-*.arrow"))


def test_an_uninterrupted_run_with_checkpoints_trains_the_same_model(table, tmp_path) -> None:
    plain_agents = _agents(table, tmp_path / "plain")
    plain = _session(plain_agents, "ppd-ert")
    plain.train()
    agents = _agents(table, tmp_path / "checkpointed")
    session = _session(agents, "ppd-ert")
    session.train(tmp_path / "ckpt", RUN)
    assert session.facts.resumed_batches == 0
    assert session.facts.rounds == plain.facts.rounds + 2  # resume_status and resume
    assert _model_bytes(session, agents) == _model_bytes(plain, plain_agents)
    assert CheckpointStore(tmp_path / "ckpt", RUN, session._context()).completed() == [0, 1, 2, 3]
    for name in NAMES:  # the final `model` message made every institution save the last batch
        folder = tmp_path / "checkpointed" / "registry" / name / CHECKPOINTS / RUN
        assert sorted(p.name for p in folder.glob("*.sha256")) == [f"batch-{b:05d}.sha256" for b in range(4)]


def test_a_completed_run_resumes_without_growing_anything(table, tmp_path) -> None:
    """Every batch checkpointed everywhere (a crash after training).

    The forest comes from the checkpoints alone, with no level exchanged.
    """
    first_agents = _agents(table, tmp_path)
    first = _session(first_agents, "extra-trees")
    first.train(tmp_path / "ckpt", RUN)
    agents = _agents(table, tmp_path)
    session = _session(agents, "extra-trees")
    session.train(tmp_path / "ckpt", RUN)
    assert session.facts.resumed_batches == 4 and session.master.levels == first.master.levels
    assert session.facts.rounds == 4  # resume_status, resume, hello, model
    assert _model_bytes(session, agents) == _model_bytes(first, first_agents)


def test_an_institution_whose_rows_changed_makes_the_run_start_over(table, tmp_path) -> None:
    first = _session(_agents(table, tmp_path), "extra-trees")
    first.train(tmp_path / "ckpt", RUN)
    agents = _agents(table, tmp_path)
    frame = agents["east"].data.frame
    frame.loc[frame.index[0], "x1"] += 1.0  # same row count, other data: only east can tell
    session = _session(agents, "extra-trees")
    session.train(tmp_path / "ckpt", RUN)
    assert session.facts.resumed_batches == 0


def test_dp_noise_seeds_are_kept_per_run_and_dropped_with_the_checkpoints(table, tmp_path) -> None:
    agents = _agents(table, tmp_path)
    privacy = {"mode": "gdp", "epsilon": 1.0}
    session = _session(agents, "extra-trees", privacy, seeds={n: 77 for n in NAMES})
    session.train(tmp_path / "ckpt", RUN)
    seeds = tmp_path / "registry" / "north" / CHECKPOINTS / NOISE_SEEDS / RUN
    assert sorted(p.name for p in seeds.iterdir()) == ["batch-00000.arrow", "batch-00000.sha256", "context"]
    again = _agents(table, tmp_path)
    _session(again, "extra-trees", privacy, seeds={n: 99 for n in NAMES}).train(tmp_path / "ckpt", RUN)
    assert {a.party.noise_seed for a in again.values()} == {77}  # the run's seed, not the new process's
    session.drop_checkpoints()
    assert not seeds.exists()


def _recording(agent: HorizontalInstitutionAgent, rounds: list[int]):
    def handle(message: Message) -> Message:
        if message.kind in ("ppdert_cells", "ppdert_counts"):  # two masked rounds per level
            rounds.append(int(message.header["round_id"]))
        return agent.handle(message)
    return handle


def test_resumed_ppd_ert_levels_keep_their_secure_aggregation_round_ids(table, tmp_path) -> None:
    reference_agents = _agents(table, tmp_path / "reference")
    expected: list[int] = []
    handlers = {n: a.handle for n, a in reference_agents.items()}
    handlers["north"] = _recording(reference_agents["north"], expected)
    reference = _session(reference_agents, "ppd-ert", handlers=handlers)
    reference.train()
    assert expected == list(range(1, len(expected) + 1))

    agents = _agents(table, tmp_path / "crash")
    handlers = {n: a.handle for n, a in agents.items()}
    handlers["east"] = _crashing(agents["east"], "ppdert_cells", at=3)
    with pytest.raises(Crash):
        _session(agents, "ppd-ert", handlers=handlers).train(tmp_path / "ckpt", RUN)
    restarted = _agents(table, tmp_path / "crash")
    resumed: list[int] = []
    handlers = {n: a.handle for n, a in restarted.items()}
    handlers["north"] = _recording(restarted["north"], resumed)
    session = _session(restarted, "ppd-ert", handlers=handlers)
    session.train(tmp_path / "ckpt", RUN)
    assert session.facts.resumed_batches == 1  # east died as batch 2 started, before saving batch 1
    assert resumed and resumed == expected[-len(resumed):]  # batches 1-3, numbered as without the crash
    assert session.master.levels == reference.master.levels
