"""kill -9 of an institution's agent halfway through training: the retrain flow starts the session again,
training resumes from the last tree batch everyone checkpointed, and the registered model is byte for
byte the one an uninterrupted run registers."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
import yaml

from flows.retrain import retrain
from tests.federations import small_federation

pytestmark = pytest.mark.slow
MODEL = "retail-response"
PARAMS = {"n_estimators": 24, "max_depth": 6, "tree_batch_size": 2}


def _agent_pids(config_path: Path, institution: str) -> list[int]:
    """Processes of `fedforest agent serve --config <config_path> --institution <institution>`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in argv]
        if "serve" in text and str(config_path) in text and institution in text:
            pids.append(int(entry.name))
    return pids


def _kill_when_checkpointed(work: Path, config_path: Path, institution: str, batch: int, done: dict) -> None:
    """Watch the institution's checkpoints; SIGKILL its agent once it has checkpointed `batch`."""
    deadline = time.monotonic() + 240
    pattern = f".checkpoints/*/batch-{batch:05d}.sha256"
    while time.monotonic() < deadline and not done.get("stop"):
        if list((work / "registry" / institution).glob(pattern)):
            for pid in _agent_pids(config_path, institution):
                os.kill(pid, signal.SIGKILL)
                done.setdefault("killed", []).append(pid)
            return
        time.sleep(0.005)


def _version_tables(work: Path) -> dict[str, bytes]:
    files = {}
    for folder in sorted((work / "registry").glob(f"*/{MODEL}/v0001")):
        for table in folder.glob("*.arrow"):
            files[f"{folder.parents[1].name}/{table.name}"] = table.read_bytes()
    return files


def test_a_killed_agent_is_restarted_and_training_resumes_to_the_same_model(tmp_path) -> None:
    reference_work, crash_work = tmp_path / "reference", tmp_path / "crash"
    config_path, _ = small_federation(reference_work, 1500, seed=5, params=PARAMS)
    shutil.copytree(reference_work, crash_work)  # same data, keys and certificates
    crash_config = crash_work / "federation.yaml"
    raw = yaml.safe_load(crash_config.read_text())
    for institution in raw["institutions"]:  # other ports than the reference run's agents
        from flows.demo import free_port

        institution["endpoint"] = f"grpc+tls://127.0.0.1:{free_port()}"
    crash_config.write_text(yaml.safe_dump(raw))

    reference = retrain(str(config_path), agents="local")
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
    assert _version_tables(crash_work) == _version_tables(reference_work)
    assert not list((crash_work / "registry").rglob("batch-*.arrow")), "checkpoints are removed once stored"
