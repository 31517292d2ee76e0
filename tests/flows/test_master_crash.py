"""kill -9 of the MASTER halfway through training, then a Prefect retry of its flow run.

The agents the master started stop by themselves once it is gone, the retried flow run (same flow-run id,
hence the same training run id) resumes from the last tree batch the master and every institution checkpointed
without growing those batches again, and it registers the model an uninterrupted run registers, byte for byte.

The master runs `fedforest retrain --agents local` in its own process against this session's Prefect
test server, so that killing it kills nothing of the test. The retry is what `prefect flow-run retry
<id> --entrypoint flows/retrain.py:retrain` does: the killed run is marked Crashed (as its worker would),
scheduled again and executed here with its stored parameters.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.flow_engine import run_flow
from prefect.settings import PREFECT_API_URL
from prefect.states import Crashed, Scheduled

from fedcore.checkpoints import CHECKPOINTS, resume_point
from flows.retrain import retrain
from tests.federations import copy_of
from tests.flows.crashes import PARAMS, agent_pids, version_tables, wait_for_file

KILL_AFTER_BATCH = 3  # of the 12 batches of crashes.PARAMS
INSTITUTIONS = ("bank", "ecommerce", "insurer")
REPO = Path(__file__).resolve().parents[2]


def _completed(folder: Path) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in folder.glob("batch-*.sha256"))


def _start_master(config_path: Path, log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "fedcore.cli", "retrain", "--config", str(config_path),
                                 "--agents", "local", "--no-predict"],
                                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def _kill_master_when_checkpointed(master: subprocess.Popen, checkpoints: Path, config_path: Path,
                                   state: dict) -> None:
    """SIGKILL the master once it has checkpointed batch KILL_AFTER_BATCH; note its agents' pids."""
    if wait_for_file(checkpoints, f"*/batch-{KILL_AFTER_BATCH:05d}.sha256", 240, state):
        state["agents"] = agent_pids(config_path)
        master.send_signal(signal.SIGKILL)
        state["killed"] = True


def _running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (an orphan that stopped waits there for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _alive(pids: list[int], timeout_s: float) -> list[int]:
    """The pids still running after up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if _running(pid)]
    return alive


def _retry_flow_run(flow_run_id: str) -> dict:
    """What a worker and `prefect flow-run retry` do with a master killed mid-run.

    Mark the run Crashed, schedule it again and execute the same flow run (same id) with its stored
    parameters.
    """
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(UUID(flow_run_id))
        assert run.state is not None and run.state.is_running(), run.state  # nobody reported the kill
        client.set_flow_run_state(run.id, Crashed(message="master process killed (SIGKILL)"), force=True)
        client.set_flow_run_state(run.id, Scheduled(message="retried after a crash"), force=True)
        run = client.read_flow_run(run.id)
    state = run_flow(flow=retrain, flow_run=run, parameters=run.parameters, return_type="state")
    assert state.is_completed(), state
    return state.result()


@pytest.mark.slow
def test_a_killed_master_is_retried_and_resumes_to_the_same_model(tmp_path, crash_reference) -> None:
    crash_work = tmp_path / "crash"
    crash_config = copy_of(crash_reference.pristine, crash_work).config_path
    master_checkpoints = crash_work / "registry" / "master" / CHECKPOINTS
    # the uninterrupted run of the same federation (tests/flows/conftest.py)
    reference = crash_reference.result

    master = _start_master(crash_config, crash_work / "master.log")
    state: dict = {}
    killer = threading.Thread(target=_kill_master_when_checkpointed,
                              args=(master, master_checkpoints, crash_config, state), daemon=True)
    killer.start()
    try:
        killer.join(timeout=240)
        master.wait(timeout=30)
        log = (crash_work / "master.log").read_text(errors="replace")
        assert state.get("killed"), f"the master never checkpointed batch {KILL_AFTER_BATCH}:\n{log[-3000:]}"
        assert master.returncode == -signal.SIGKILL, f"training ended before the kill:\n{log[-3000:]}"
        assert len(state["agents"]) == len(INSTITUTIONS), state
        # The agents the master started watch it: once it is gone they stop and free their ports.
        assert not _alive(state["agents"], 15), "agents of the killed master are still running"
    finally:
        state["stop"] = True
        if master.poll() is None:
            master.kill()
        for pid in agent_pids(crash_config):
            os.kill(pid, signal.SIGKILL)
    assert reference["training"]["resumed_batches"] == 0
    for name in INSTITUTIONS:
        agent_log = (crash_work / "logs" / f"agent-{name}.log").read_text(errors="replace")
        assert "the process that started it" in agent_log and "is gone" in agent_log, agent_log[-2000:]

    # The training run id is the flow-run id; only what every role completed can be resumed.
    (run_folder,) = master_checkpoints.iterdir()
    done = [_completed(run_folder)] + [_completed(crash_work / "registry" / n / CHECKPOINTS / run_folder.name)
                                       for n in INSTITUTIONS]
    assert KILL_AFTER_BATCH in done[0], done
    expected = resume_point(*done)
    n_batches = -(-PARAMS["n_estimators"] // PARAMS["tree_batch_size"])
    assert KILL_AFTER_BATCH - 1 <= expected < n_batches, done

    resumed = _retry_flow_run(run_folder.name)
    assert resumed["training"]["resumed_batches"] == expected  # loaded from checkpoints, not grown again
    assert resumed["training"]["rounds"] < reference["training"]["rounds"]
    assert resumed["version"] == reference["version"] == "v0001"
    assert version_tables(crash_work) == crash_reference.tables
    assert not list((crash_work / "registry").rglob("batch-*.arrow")), "checkpoints are removed once stored"
    assert not agent_pids(crash_config), "the retried run stops the agents it started"


def test_retrain_command_passes_the_run_id_to_resume(monkeypatch, tmp_path, capsys) -> None:
    """`fedforest retrain --run-id ID` (a new flow run resuming a crashed run's checkpoints)."""
    import flows.retrain
    from fedcore.cli import main

    calls = []
    monkeypatch.setattr(flows.retrain, "retrain", lambda *args, **kwargs: calls.append((args, kwargs)) or {})
    config = tmp_path / "federation.yaml"
    assert main(["retrain", "--config", str(config), "--agents", "local", "--run-id", "run-7"]) == 0
    assert main(["retrain", "--config", str(config)]) == 0
    assert [kwargs["run_id"] for _, kwargs in calls] == ["run-7", None]
    assert calls[0][0] == (str(config.resolve()),)
