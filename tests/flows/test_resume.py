"""kill -9 of an institution's agent halfway through training.

The retrain flow starts the session again, training resumes from the last tree batch everyone checkpointed,
and the registered model is byte for byte the one an uninterrupted run registers (vertical and horizontal).
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from flows.retrain import retrain
from tests.federations import copy_of
from tests.flows.crashes import agent_pids, version_tables, wait_for_file

pytestmark = pytest.mark.slow


def _kill_when_checkpointed(work: Path, config_path: Path, institution: str, batch: int, done: dict) -> None:
    """Watch the institution's checkpoints; SIGKILL its agent once it has checkpointed `batch`."""
    if wait_for_file(work / "registry" / institution, f".checkpoints/*/batch-{batch:05d}.sha256", 240, done):
        for pid in agent_pids(config_path, institution):
            os.kill(pid, signal.SIGKILL)
            done.setdefault("killed", []).append(pid)


def test_a_killed_agent_is_restarted_and_training_resumes_to_the_same_model(tmp_path,
                                                                            crash_reference) -> None:
    crash_work = tmp_path / "crash"
    crash_config = copy_of(crash_reference.pristine, crash_work).config_path

    # the uninterrupted run of the same federation (tests/flows/conftest.py)
    reference = crash_reference.result
    assert reference["training"]["resumed_batches"] == 0

    watcher_state: dict = {}
    watcher = threading.Thread(target=_kill_when_checkpointed,
                               args=(crash_work, crash_config, "insurer", 4, watcher_state), daemon=True)
    watcher.start()
    try:
        resumed = retrain(str(crash_config), agents="local")
    finally:
        watcher_state["stop"] = True
        watcher.join(timeout=10)
    assert watcher_state.get("killed"), "the agent was never killed: training finished before batch 4"
    assert resumed["training"]["resumed_batches"] >= 4
    assert resumed["version"] == reference["version"] == "v0001"
    assert version_tables(crash_work) == crash_reference.tables
    assert not list((crash_work / "registry").rglob("batch-*.arrow")), "checkpoints are removed once stored"


def _hospital_tables(work: Path) -> dict[str, bytes]:
    """The Arrow tables of the horizontal demo's v0001 at the master and every hospital."""
    return {f"{t.parents[2].name}/{t.name}": t.read_bytes()
            for t in sorted((work / "registry").glob("*/readmission/v0001/*.arrow"))}


def _uninterrupted_horizontal_model(config_path: Path) -> bytes:
    """The model file an uninterrupted session of this federation trains, in process.

    With the same agents and session code (a third flow run would add a minute of agent start-ups).
    """
    from fedcore.agents.data import institution_from_config
    from fedcore.config import load_config
    from fedcore.horizontal.agent import HorizontalInstitutionAgent
    from fedcore.horizontal.session import HorizontalSession
    from fedcore.models.artifacts import table_file_bytes
    from fedcore.protocol.messages import Message
    from fedcore.transport.inprocess import InProcessTransport

    config = load_config(config_path)
    agents = {i.name: HorizontalInstitutionAgent(institution_from_config(config, i.name))
              for i in config.institutions}
    transport = InProcessTransport({name: agent.handle for name, agent in agents.items()})
    transport.exchange({name: Message("validation_report") for name in agents})
    session = HorizontalSession(transport, config.params, algorithm=config.algorithm, privacy=config.privacy,
                                holdout_fraction=config.training.holdout)
    session.agree_schema()
    session.train()
    return table_file_bytes(session.model.to_table())


def test_horizontal_training_resumes_to_the_same_model_after_a_killed_agent(tmp_path) -> None:
    """Federated Extra-Trees over Flight: a hospital's agent is killed once it checkpointed batch 3 of 8."""
    import yaml

    from flows.demos.horizontal import prepare_horizontal_workspace

    work = tmp_path / "hospitals"
    params = {"n_estimators": 16, "max_depth": 6, "tree_batch_size": 2, "random_state": 0}
    config_path, _ = prepare_horizontal_workspace(work, n_patients=1500, seed=2, params=params)
    raw = yaml.safe_load(config_path.read_text())
    raw["training"]["connect_timeout_s"] = 90
    config_path.write_text(yaml.safe_dump(raw))
    expected = _uninterrupted_horizontal_model(config_path)

    watcher_state: dict = {}
    watcher = threading.Thread(target=_kill_when_checkpointed,
                               args=(work, config_path, "lakeside", 3, watcher_state), daemon=True)
    watcher.start()
    try:
        resumed = retrain(str(config_path), agents="local", predict=False)
    finally:
        watcher_state["stop"] = True
        watcher.join(timeout=10)
    assert watcher_state.get("killed"), "the agent was never killed: training finished before batch 3"
    assert resumed["training"]["resumed_batches"] >= 3
    tables = _hospital_tables(work)
    assert sorted(tables) == ["hillcrest/model.arrow", "lakeside/model.arrow", "master/model.arrow",
                              "riverside/model.arrow"]
    assert all(data == expected for data in tables.values())
    assert not list((work / "registry").rglob("batch-*.arrow")), "checkpoints are removed once stored"
