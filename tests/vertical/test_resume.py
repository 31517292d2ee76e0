"""Training survives a crash.

Completed tree batches are checkpointed at the master and at every party, and a run interrupted mid-training
resumes from the last batch all of them completed, ending with the same model, byte for byte, as an
uninterrupted run.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.agents.data import InstitutionData
from fedcore.checkpoints import CheckpointStore, resume_point
from fedcore.data.scenario import make_vertical_scenario
from fedcore.errors import ArtifactError
from fedcore.models.artifacts import table_file_bytes
from fedcore.models.tables import master_table, party_table
from fedcore.protocol.messages import Message
from fedcore.transport.inprocess import InProcessTransport
from fedcore.trees.params import ForestParams
from fedcore.vertical.agent import VerticalInstitutionAgent
from fedcore.vertical.session import VerticalSession

KEY = b"resume-consortium-key-0123456789"
PARAMS = ForestParams(n_estimators=8, max_depth=5, tree_batch_size=2, random_state=6)
RUN = "run-42"


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> dict:
    return make_vertical_scenario(tmp_path_factory.mktemp("scenario"), n_customers=1200, seed=9)


def _agents(scenario, root) -> dict[str, VerticalInstitutionAgent]:
    import pandas as pd

    return {name: VerticalInstitutionAgent(InstitutionData(
        name=name, frame=pd.read_parquet(files["train"]), id_column=scenario["id_column"],
        label=scenario["label"] if name == scenario["label_holder"] else None,
        registry=root / "registry" / name, predictions_dir=root / "predictions" / name), KEY)
            for name, files in scenario["institutions"].items()}


class Crash(Exception):
    """Stands in for the process dying."""


def _crashing(agent: VerticalInstitutionAgent, at_begin_batch: int):
    """The agent's handler, dying when the master starts the given batch (before it saves anything)."""
    seen = [0]

    def handle(message: Message) -> Message:
        if message.kind == "begin_batch":
            seen[0] += 1
            if seen[0] == at_begin_batch:
                raise Crash("kill -9")
        return agent.handle(message)
    return handle


def _session(agents, handlers=None) -> VerticalSession:
    transport = InProcessTransport(handlers or {n: a.handle for n, a in agents.items()})
    transport.exchange({n: Message("validation_report") for n in agents})
    session = VerticalSession(transport, PARAMS, min_overlap=100)
    session.align()
    return session


def _model_bytes(session: VerticalSession, agents) -> dict[str, bytes]:
    out = {"master": table_file_bytes(master_table(session.master.structure))}
    out.update({n: table_file_bytes(party_table(a.party.model)) for n, a in agents.items()})
    return out


def test_a_run_killed_mid_training_resumes_to_the_same_model(scenario, tmp_path) -> None:
    reference_agents = _agents(scenario, tmp_path / "reference")
    reference = _session(reference_agents)
    reference.train()
    expected = _model_bytes(reference, reference_agents)

    agents = _agents(scenario, tmp_path / "crash")
    handlers = {n: a.handle for n, a in agents.items()}
    handlers["insurer"] = _crashing(agents["insurer"], at_begin_batch=3)  # dies as batch 2 starts
    checkpoints = tmp_path / "crash" / "master-checkpoints"
    with pytest.raises(Crash):
        _session(agents, handlers).train(checkpoints, RUN)
    assert CheckpointStore(checkpoints, RUN, "").completed() == []  # another context sees nothing...
    restarted = _agents(scenario, tmp_path / "crash")  # fresh processes: nothing survives in memory
    session = _session(restarted)
    session.train(checkpoints, RUN)
    assert session.facts.resumed_batches == 1  # the insurer saved batch 0 only; batch 1 is grown again
    assert _model_bytes(session, restarted) == expected

    session.drop_checkpoints()
    assert not (checkpoints / RUN).exists()
    assert not any((tmp_path / "crash" / "registry").rglob("batch-*.arrow"))


def test_an_uninterrupted_run_with_checkpoints_trains_the_same_model(scenario, tmp_path) -> None:
    plain_agents = _agents(scenario, tmp_path / "plain")
    plain = _session(plain_agents)
    plain.train()
    agents = _agents(scenario, tmp_path / "checkpointed")
    session = _session(agents)
    session.train(tmp_path / "ckpt", RUN)
    assert session.facts.resumed_batches == 0
    assert _model_bytes(session, agents) == _model_bytes(plain, plain_agents)
    assert CheckpointStore(tmp_path / "ckpt", RUN, session._context()).completed() == [0, 1, 2, 3]


def test_a_corrupt_checkpoint_is_refused(tmp_path) -> None:
    store = CheckpointStore(tmp_path, RUN, "ctx")
    store.save(0, {"x": np.arange(5)})
    assert store.completed() == [0] and list(store.load(0)["x"]) == [0, 1, 2, 3, 4]
    path = tmp_path / RUN / "batch-00000.arrow"
    path.write_bytes(path.read_bytes()[:-1] + b"\x01")
    with pytest.raises(ArtifactError, match=r"checkpoint run-42/batch 0 is corrupt \(SHA-256 mismatch\)"):
        store.load(0)
    assert CheckpointStore(tmp_path, RUN, "another context").completed() == []


def test_resume_point_is_the_first_batch_someone_lacks() -> None:
    assert resume_point([0, 1, 2], [0, 1], [0, 1, 2, 3]) == 2
    assert resume_point([0, 1, 2], [1, 2]) == 0
    assert resume_point([], [0]) == 0
