"""Production shape, end to end.

A real `prefect server start` on loopback, one process work pool and worker per institution plus the master's,
everything deployed from prefect.yaml by deployments/deploy.sh, and `retrain/weekly` triggered as the schedule
would. Asserts where each flow run ran, the artifacts, the registered version and where predictions landed;
stops every process it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fedcore.models.registry import ModelRegistry
from flows.demos.workspace import free_port
from tests.federations import small_federation

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
INSTITUTIONS = ("bank", "ecommerce", "insurer")
MODEL = "retail-response"


def _registry(work, name: str = "master") -> ModelRegistry:
    """A registry of the demo federation in `work`, trusting the master's public key as institutions do."""
    return ModelRegistry(work / "registry" / name, public_key=work / "keys" / "master.key.pub")


class Processes:
    """Processes started in their own session, so stopping one stops its flow-run children too."""

    def __init__(self, logs: Path, env: dict[str, str]) -> None:
        self.logs, self.env, self.started = logs, env, []

    def start(self, name: str, *argv: str) -> subprocess.Popen:
        with open(self.logs / f"{name}.log", "ab") as log:
            process = subprocess.Popen(list(argv), cwd=REPO, env=self.env, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        for process in reversed(self.started):
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for process in reversed(self.started):
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
            _signal_group(process, signal.SIGKILL)  # flow-run children a worker left behind

    def tail(self, name: str, lines: int = 40) -> str:
        path = self.logs / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _wait_healthy(api_url: str, server: subprocess.Popen, processes: Processes,
                  timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"prefect server exited with {server.returncode}:\n{processes.tail('server')}")
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(1)
    pytest.fail(f"prefect server not healthy after {timeout_s} s:\n{processes.tail('server')}")


@pytest.fixture(scope="module")
def deployed(tmp_path_factory) -> Iterator[dict]:
    """Server, pools, deployments and one worker per pool; yields the handles the tests need."""
    root = tmp_path_factory.mktemp("deployed")
    config_path, scenario = small_federation(root / "federation", 1200, seed=8,
                                             params={"n_estimators": 8, "max_depth": 5})
    (root / "logs").mkdir()
    api_url = f"http://127.0.0.1:{free_port()}/api"
    env = {**os.environ, "PREFECT_HOME": str(root / "prefect-home"), "PREFECT_API_URL": api_url,
           "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{root / 'prefect.db'}",
           "PREFECT_UI_ENABLED": "false", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
           "GX_ANALYTICS_ENABLED": "false", "PREFECT_WORKER_QUERY_SECONDS": "2",
           "NUMBA_CACHE_DIR": str(REPO / ".numba_cache"), "FEDFOREST_HOME": str(REPO),
           "FEDFOREST_CONFIG": str(config_path), "PYTHON": sys.executable,
           "PATH": f"{BIN}:{os.environ['PATH']}"}
    processes = Processes(root / "logs", env)
    try:
        server = processes.start("server", str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                                 "--port", api_url.split(":")[2].split("/")[0])
        _wait_healthy(api_url, server, processes)
        deploy = subprocess.run(["bash", "deployments/deploy.sh"], cwd=REPO, env=env, capture_output=True,
                                text=True, timeout=300)
        assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
        for pool in ("master", *INSTITUTIONS):
            processes.start(f"worker-{pool}", str(BIN / "prefect"), "worker", "start", "--pool", pool)
        yield {"root": root, "config": config_path, "scenario": scenario, "api_url": api_url,
               "processes": processes, "deploy_output": deploy.stdout}
    finally:
        groups = [p.pid for p in processes.started]
        processes.stop_all()
        leftovers = [g for g in groups if _group_alive(g)]
        assert leftovers == [], f"process groups still alive after cleanup: {leftovers}"


@pytest.fixture(scope="module")
def weekly_run(deployed) -> dict:
    """Trigger retrain/weekly as its schedule would and wait for it (and its agents) to finish."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: deployed["api_url"]}):
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name("retrain/weekly")
            run = client.create_flow_run_from_deployment(deployment.id)
            deadline = time.monotonic() + 600
            while not (run := client.read_flow_run(run.id)).state.is_final():
                if time.monotonic() > deadline:
                    pytest.fail("retrain/weekly did not finish within 600 s:\n"
                                + "\n".join(deployed["processes"].tail(f"worker-{p}")
                                            for p in ("master", *INSTITUTIONS)))
                time.sleep(2)
            time.sleep(3)  # the agents' runs finish just after the master closes the session
            runs = client.read_flow_runs()
            artifacts = client.read_artifacts()
            logs = client.read_logs()
            pools = {p.name: p for p in client.read_work_pools()}
    if not run.state.is_completed():
        pytest.fail(f"retrain/weekly ended {run.state.name}: {run.state.message}\n"
                    + deployed["processes"].tail("worker-master", 80))
    return {"run": run, "runs": runs, "artifacts": artifacts, "logs": logs, "pools": pools}


def test_deploy_script_creates_a_process_pool_per_institution_and_the_master(deployed, weekly_run) -> None:
    pools = weekly_run["pools"]
    roles = ("master", *INSTITUTIONS)
    assert {name: pools[name].type for name in roles} == dict.fromkeys(roles, "process")


def test_each_institution_agent_ran_on_its_own_pool_under_the_master_run(weekly_run) -> None:
    master = weekly_run["run"]
    assert master.work_pool_name == "master" and master.deployment_id is not None
    agents = [r for r in weekly_run["runs"] if r.parameters.get("institution") in INSTITUTIONS]
    assert sorted((r.parameters["institution"], r.work_pool_name, r.state.name) for r in agents) == [
        (name, name, "Completed") for name in INSTITUTIONS]
    assert all(r.parent_task_run_id is not None for r in agents), "agent runs show as subflows of retrain"


def test_artifacts_model_version_and_predictions(deployed, weekly_run) -> None:
    keys = {a.key for a in weekly_run["artifacts"]}
    assert {"validation-bank", "validation-ecommerce", "validation-insurer", "contract-bank",
            "contract-ecommerce", "contract-insurer", "id-overlap", "training-progress", "model-version",
            "model-card", "batch-prediction"} <= keys
    work = deployed["config"].parent
    manifest, tables = _registry(work).load(MODEL, "production")
    assert manifest["version"] == "v0001" and manifest["signature"]["algorithm"] == "ed25519"
    for name in INSTITUTIONS:
        local, _ = _registry(work, name).load(MODEL, "v0001")
        assert local["master_manifest"]["version"] == "v0001"
    files = sorted((work / "predictions").rglob("*.parquet"))
    assert [f.parent.name for f in files] == ["bank"]
    assert len(pd.read_parquet(files[0])) == deployed["scenario"]["overlap"]["new"]


def test_no_raw_value_reaches_the_prefect_server(deployed, weekly_run) -> None:
    scenario = deployed["scenario"]
    bank = pd.read_parquet(scenario["institutions"]["bank"]["train"])
    needles = (list(bank[scenario["id_column"]].iloc[::40])
               + [f"{v:.2f}" for v in bank["income"].dropna().iloc[::40]])
    text = (" ".join(str(a.data) for a in weekly_run["artifacts"])
            + " ".join(m.message for m in weekly_run["logs"]))
    text += " ".join(str(r.parameters) for r in weekly_run["runs"])
    assert [n for n in needles if n in text] == []


def test_runs_are_named_after_the_version_and_say_how_good(weekly_run) -> None:
    run = weekly_run["run"]
    assert run.name == f"retrain {MODEL} v0001"
    assert run.state.message.startswith(f"{MODEL} v0001: accuracy 0.") and run.state.message.endswith(
        "on held-out rows; promoted to production")


def test_each_agent_run_logs_the_version_it_stored_and_the_predictions_it_wrote(deployed, weekly_run) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    agents = {r.parameters["institution"]: r.id for r in weekly_run["runs"]
              if r.parameters.get("institution") in INSTITUTIONS}
    with temporary_settings({PREFECT_API_URL: deployed["api_url"]}):
        with get_client(sync_client=True) as client:
            said = {name: [log.message for log in client.read_logs(LogFilter(
                flow_run_id=LogFilterFlowRunId(any_=[run_id])))] for name, run_id in agents.items()}
    work = deployed["config"].parent
    for name, messages in said.items():
        folder = work / "registry" / name / MODEL / "v0001"
        assert [m for m in messages if m.startswith(f"{name}: stored {MODEL} v0001 (signed by the master; ")
                and m.endswith(f" in {folder}")], messages
    rows = deployed["scenario"]["overlap"]["new"]
    assert [name for name, messages in said.items()
            if any(" predictions to " in m for m in messages)] == ["bank"]
    assert any(m.startswith(f"bank: wrote {rows} predictions to {work / 'predictions' / 'bank'}")
               for m in said["bank"])


def test_an_agent_whose_config_is_broken_fails_the_master_at_once_with_its_error(deployed,
                                                                                 weekly_run) -> None:
    """The insurer's agent run has its consortium key in an environment variable its worker lacks.

    As a worker started without it would: the master fails as soon as that run ends, quoting its error,
    instead of waiting out its connect timeouts ("is the agent running?"), and cancels the other agents' runs.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import DeploymentUpdate
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    config = deployed["config"]
    raw = yaml.safe_load(config.read_text())
    raw["consortium_key"] = {"env": "FEDFOREST_KEY_NOT_IN_WORKERS"}
    broken = config.with_name("broken-insurer.yaml")
    broken.write_text(yaml.safe_dump(raw))
    connect_timeout_s = raw["training"]["connect_timeout_s"]
    with temporary_settings({PREFECT_API_URL: deployed["api_url"]}):
        with get_client(sync_client=True) as client:
            agent = client.read_deployment_by_name("institution-agent/insurer")
            client.update_deployment(agent.id, DeploymentUpdate(parameters={**agent.parameters,
                                                                            "config_path": str(broken)}))
            try:
                retrain = client.read_deployment_by_name("retrain/weekly")
                run = client.create_flow_run_from_deployment(retrain.id)
                started = time.monotonic()
                while not (run := client.read_flow_run(run.id)).state.is_final():
                    assert time.monotonic() - started < 600, deployed["processes"].tail("worker-master", 80)
                    time.sleep(1)
            finally:
                client.update_deployment(agent.id, DeploymentUpdate(parameters=agent.parameters))
            earlier = {r.id for r in weekly_run["runs"]}
            agents = {r.parameters["institution"]: r.state for r in client.read_flow_runs()
                      if r.id not in earlier and r.parameters.get("institution") in INSTITUTIONS}
            logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
            said = [log.message for log in logs]
    # the agents that came up are not left serving until their idle timeout: no session will come
    assert {name: state.name for name, state in agents.items()} == {"bank": "Cancelled",
                                                                    "ecommerce": "Cancelled",
                                                                    "insurer": "Failed"}
    assert len([m for m in said if m.startswith("cancelled agent flow run ")
                and m.endswith("the master could not reach every agent of this session (its run says why), "
                               "so no session will come")]) == 2
    assert run.state.name == "Failed"
    assert "institution 'insurer': its agent flow run" in run.state.message
    assert "environment variable FEDFOREST_KEY_NOT_IN_WORKERS is not set" in run.state.message
    assert "is the agent running" not in run.state.message
    # without watching the agent runs the master could not fail before its connect timeout
    assert (run.end_time - run.start_time).total_seconds() < connect_timeout_s, (run.start_time, run.end_time)
    assert _registry(config.parent).versions(MODEL) == ["v0001"]
