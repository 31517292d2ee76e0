"""Production shape, end to end.

A real `prefect server start` on loopback, and a federation whose institutions are not the demo's: the demo's
generated tables, renamed lender, telco and grocer. `fedforest deploy` deploys a first version of its config
(with an institution that then leaves), `deployments/deploy.sh` the config as it ends up; one process worker
per pool. Then the flow of deployments/README.md's walk-through triggers `retrain/weekly` with
`run_deployment` and reads the summary the run returns. Asserts where each flow run ran, the artifacts, the
registered version, where predictions landed, what deploying twice left on the server, and that two runs of
one deployment at once do not collide on the agents' ports (the second waits, naming the first); stops
every process it started.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import json
import os
import re
import runpy
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as StillRunning
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fedcore.models.registry import ModelRegistry
from flows.demos.workspace import ensure_credentials, free_port
from tests.federations import small_federation
from tests.prefect_reads import all_artifacts, all_flow_runs, all_logs

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NAMES = {"bank": "lender", "ecommerce": "telco", "insurer": "grocer"}
"""The demo generator's institutions (their tables and scenario keep these names) and what this federation
calls them."""
INSTITUTIONS = tuple(NAMES.values())
LABEL_HOLDER = NAMES["bank"]
MODEL = "retail-response"
SCHEDULE = {"cron": "15 4 * * 2", "timezone": "Europe/Zurich"}


def _registry(work, name: str = "master") -> ModelRegistry:
    """A registry of the federation in `work`, trusting the master's public key as institutions do."""
    return ModelRegistry(work / "registry" / name, public_key=work / "keys" / "master.key.pub")


def _renamed(config_path: Path) -> dict:
    """The demo federation's config with the institutions renamed (NAMES), each with certificates of its name.

    Their tables and contracts stay where the demo wrote them; pools, registries, predictions and
    certificates take the new names. It gets a `deployments:` section with a schedule of its own.
    """
    raw = yaml.safe_load(config_path.read_text())
    for institution in raw["institutions"]:
        name = institution["name"] = NAMES[institution["name"]]
        institution.update(work_pool=name, registry=f"registry/{name}", predictions=f"predictions/{name}",
                           cert=f"certs/{name}.pem", key=f"certs/{name}.key")
    raw["training"]["predict_for"] = LABEL_HOLDER
    raw["deployments"] = {"schedule": SCHEDULE}
    ensure_credentials(config_path.parent, INSTITUTIONS)
    return raw


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


def _deploy(argv: list[str], env: dict[str, str], what: str) -> str:
    """Run a deploy command in the repository; its output (it must succeed)."""
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{what}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout


def _deploy_here(argv: list[str], api_url: str) -> str:
    """`fedforest <argv>` in this process (Prefect is imported already: seconds saved); its output."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from fedcore.cli import main

    said, environment = io.StringIO(), dict(os.environ)
    try:
        with temporary_settings({PREFECT_API_URL: api_url}), contextlib.redirect_stdout(said):
            assert main(argv) == 0, said.getvalue()
    finally:  # the command sets its Prefect environment defaults: not for the tests after it
        os.environ.clear()
        os.environ.update(environment)
    return said.getvalue()


@pytest.fixture(scope="module")
def deployed(tmp_path_factory) -> Iterator[dict]:
    """Server, pools, deployments (deployed twice) and one worker per pool; yields what the tests need."""
    root = tmp_path_factory.mktemp("deployed")
    demo_config, scenario = small_federation(root / "federation", 1200, seed=8,
                                             params={"n_estimators": 8, "max_depth": 5})
    raw = _renamed(demo_config)
    config_path = demo_config.with_name("federation.yaml")
    config_path.write_text(yaml.safe_dump(raw))
    # the federation as it was: with an institution that has left since, and weekly retraining on Sundays
    before = demo_config.with_name("before.yaml")
    departed = {**raw["institutions"][-1], "name": "departed", "work_pool": "departed"}
    before.write_text(yaml.safe_dump({**raw, "institutions": [*raw["institutions"], departed]}))
    (root / "logs").mkdir()
    api_url = f"http://127.0.0.1:{free_port()}/api"
    env = {**os.environ, "PREFECT_HOME": str(root / "prefect-home"), "PREFECT_API_URL": api_url,
           "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{root / 'prefect.db'}",
           "PREFECT_UI_ENABLED": "false", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
           "GX_ANALYTICS_ENABLED": "false", "PREFECT_WORKER_QUERY_SECONDS": "2",
           "NUMBA_CACHE_DIR": os.environ["NUMBA_CACHE_DIR"], "FEDFOREST_CONFIG": str(config_path),
           "PYTHON": sys.executable, "PATH": f"{BIN}:{os.environ['PATH']}"}
    processes = Processes(root / "logs", env)
    try:
        server = processes.start("server", str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                                 "--port", api_url.split(":")[2].split("/")[0])
        _wait_healthy(api_url, server, processes)
        first = _deploy_here(["deploy", "--config", str(before), "--cron", "0 5 * * 0"], api_url)
        again = _deploy(["bash", "deployments/deploy.sh"], env, "deployments/deploy.sh")
        for pool in ("master", *INSTITUTIONS):
            processes.start(f"worker-{pool}", str(BIN / "prefect"), "worker", "start", "--pool", pool)
        yield {"root": root, "config": config_path, "scenario": scenario, "api_url": api_url,
               "processes": processes, "first_deploy": first, "deploy_output": again}
    finally:
        groups = [p.pid for p in processes.started]
        processes.stop_all()
        leftovers = [g for g in groups if _group_alive(g)]
        assert leftovers == [], f"process groups still alive after cleanup: {leftovers}"


def _readers_flow(folder: Path):
    """The flow of deployments/README.md's walk-through: it runs retrain/weekly and reads what it returned."""
    text = (REPO / "deployments" / "README.md").read_text()
    found = re.search(r"```python\n(.*?def weekly_report\(.*?)```", text, re.S)
    assert found, "deployments/README.md has the weekly_report flow"
    script = folder / "weekly_report.py"
    script.write_text(textwrap.dedent(found.group(1)))
    return runpy.run_path(str(script))["weekly_report"]


def _drain_prefect_workers() -> None:
    """Send this process's pending Prefect events and logs to the e2e server while it still runs.

    The flow above ran in this process, so Prefect's event and log workers (process-wide singletons) hold
    connections to the e2e server; left running, they would keep retrying it after it stops, and every
    later test server's teardown (which drains them) would wait on events that can never be sent.
    """
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    EventsWorker.drain_all(timeout=30)
    APILogWorker.drain_all(timeout=30)


@pytest.fixture(scope="module")
def weekly_run(deployed) -> dict:
    """retrain/weekly, run by the README's own flow (run_deployment), and what the server then holds."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    weekly_report = _readers_flow(deployed["root"])
    with temporary_settings({PREFECT_API_URL: deployed["api_url"]}):
        with ThreadPoolExecutor(1) as pool:
            # in the thread too, the settings above: the e2e server, not a temporary one
            running = pool.submit(contextvars.copy_context().run, weekly_report)
            try:
                summary = running.result(timeout=600)
            except StillRunning:
                pytest.fail("retrain/weekly did not finish within 600 s:\n"
                            + "\n".join(deployed["processes"].tail(f"worker-{p}")
                                        for p in ("master", *INSTITUTIONS)))
            except Exception as error:  # noqa: BLE001 - the run failed: say why, with the master's log
                pytest.fail(f"retrain/weekly failed: {error}\n"
                            + deployed["processes"].tail("worker-master", 80))
            finally:
                _drain_prefect_workers()
        time.sleep(3)  # the agents' runs finish just after the master closes the session
        with get_client(sync_client=True) as client:
            retrain = client.read_deployment_by_name("retrain/weekly")
            runs = all_flow_runs(client)
            run = next(r for r in runs if r.deployment_id == retrain.id)
            artifacts = all_artifacts(client)
            logs = all_logs(client)
            pools = {p.name: p for p in client.read_work_pools()}
    return {"run": run, "summary": summary, "runs": runs, "artifacts": artifacts, "logs": logs,
            "pools": pools}


def test_deploy_creates_a_process_pool_per_institution_and_the_master(deployed, weekly_run) -> None:
    pools = weekly_run["pools"]
    roles = ("master", *INSTITUTIONS)
    assert {name: pools[name].type for name in roles} == dict.fromkeys(roles, "process")
    said = deployed["first_deploy"].splitlines()
    assert [line for line in said if line.startswith("fedforest deploy: work pool ")] == [
        f"fedforest deploy: work pool {pool} (process): created"
        for pool in ("master", *INSTITUTIONS, "departed")]
    assert ("fedforest deploy: concurrency limit fedforest:retail-demo: created (one retrain or "
            "batch-predict run of it at a time)") in said


def test_deploying_again_after_the_config_changed_updates_and_removes(deployed, weekly_run) -> None:
    """The second deploy (deploy.sh, the config as it ends up) leaves exactly the federation's deployments."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    config, said = deployed["config"], deployed["deploy_output"].splitlines()
    results = config.parent / ".prefect-results"
    assert [line.removeprefix("fedforest deploy: ") for line in said
            if line.startswith("fedforest deploy: deployment ")] == [
        *(f"deployment institution-agent/{name} on pool {name}: updated" for name in INSTITUTIONS),
        f"deployment retrain/weekly on pool master: updated; schedule 15 4 * * 2 (Europe/Zurich); results in "
        f"{results}",
        f"deployment batch-predict/on-demand on pool master: updated; results in {results}",
        "deployment institution-agent/departed: removed (not in federation.yaml any more)"]
    assert ("fedforest deploy: work pool departed: no deployment of 'retail-demo' uses it any more; once its "
            "worker is stopped, prefect work-pool delete departed") in said
    with temporary_settings({PREFECT_API_URL: deployed["api_url"]}):
        with get_client(sync_client=True) as client:
            flows = {f.id: f.name for f in client.read_flows()}
            deployments = {f"{flows[d.flow_id]}/{d.name}": d for d in client.read_deployments()}
    assert sorted(deployments) == sorted(["batch-predict/on-demand", "retrain/weekly",
                                          *(f"institution-agent/{name}" for name in INSTITUTIONS)])
    assert {d.parameters["config_path"] for d in deployments.values()} == {str(config)}
    assert {tuple(d.tags) for d in deployments.values()} == {("federation:retail-demo",)}
    weekly = deployments["retrain/weekly"]
    assert [(s.schedule.cron, s.schedule.timezone, s.active) for s in weekly.schedules] == [
        (SCHEDULE["cron"], SCHEDULE["timezone"], True)]
    assert weekly.job_variables == {"env": {"PREFECT_LOCAL_STORAGE_PATH": str(results)}}
    assert deployments["batch-predict/on-demand"].schedules == []


def test_the_callers_flow_reads_the_summary_the_run_returned(deployed, weekly_run) -> None:
    """run_deployment, then state.result(): version, metrics and promotion, kept beside the config."""
    summary = weekly_run["summary"]
    assert (summary["model"], summary["version"], summary["promoted"], summary["production"]) == (
        MODEL, "v0001", True, None)
    assert set(summary["metrics"]) == {"accuracy", "f1_macro", "balanced_accuracy", "base_rate", "roc_auc",
                                       "average_precision", "log_loss"}  # the vertical label holder's
    assert 0 < summary["metrics"]["accuracy"] <= 1
    assert summary["prediction"]["rows"] == deployed["scenario"]["overlap"]["new"]
    assert len(list((deployed["config"].parent / ".prefect-results").iterdir())) == 1


def test_each_institution_agent_ran_on_its_own_pool_under_the_master_run(weekly_run) -> None:
    master = weekly_run["run"]
    assert master.work_pool_name == "master" and master.deployment_id is not None
    agents = [r for r in weekly_run["runs"] if r.parameters.get("institution") in INSTITUTIONS]
    assert sorted((r.parameters["institution"], r.work_pool_name, r.state.name) for r in agents) == [
        (name, name, "Completed") for name in sorted(INSTITUTIONS)]
    assert all(r.parent_task_run_id is not None for r in agents), "agent runs show as subflows of retrain"


def test_artifacts_model_version_and_predictions(deployed, weekly_run) -> None:
    keys = {a.key for a in weekly_run["artifacts"]}
    # each agent run: its own importances and its batch drift (issue #33), not in the master run
    assert {*(f"{kind}-{name}" for kind in ("validation", "contract", "importances", "drift")
              for name in INSTITUTIONS), "id-overlap", "training-progress", "model-version", "model-card",
            "batch-prediction", "importance-shares", "model-pictures"} <= keys
    work = deployed["config"].parent
    manifest, tables = _registry(work).load(MODEL, "production")
    assert manifest["version"] == "v0001" and manifest["signature"]["algorithm"] == "ed25519"
    for name in INSTITUTIONS:
        local, _ = _registry(work, name).load(MODEL, "v0001")
        assert local["master_manifest"]["version"] == "v0001"
        (table,) = [a.data for a in weekly_run["artifacts"] if a.key == f"importances-{name}"]
        shown = {row["feature"]: row["importance"] for row in json.loads(table)}
        assert shown == {f: round(v, 6) for f, v in local["importances"].items()}
    files = sorted((work / "predictions").rglob("*.parquet"))
    assert [f.parent.name for f in files] == [LABEL_HOLDER]
    assert len(pd.read_parquet(files[0])) == deployed["scenario"]["overlap"]["new"]


def test_no_raw_value_reaches_the_prefect_server(deployed, weekly_run) -> None:
    scenario = deployed["scenario"]
    lender = pd.read_parquet(scenario["institutions"]["bank"]["train"])  # the demo's name for its table
    needles = (list(lender[scenario["id_column"]].iloc[::40])
               + [f"{v:.2f}" for v in lender["income"].dropna().iloc[::40]])
    text = (" ".join(str(a.data) for a in weekly_run["artifacts"])
            + " ".join(m.message for m in weekly_run["logs"]))
    text += " ".join(str(r.parameters) for r in weekly_run["runs"])
    assert [n for n in needles if n in text] == []


def test_runs_are_named_after_the_version_and_say_how_good(weekly_run) -> None:
    run = weekly_run["run"]
    assert run.name == f"retrain {MODEL} v0001"
    assert run.state.message.startswith(f"{MODEL} v0001: log_loss 0.") and run.state.message.endswith(
        "on held-out rows; promoted to production")


def test_each_agent_run_logs_the_version_it_stored_and_the_predictions_it_wrote(deployed, weekly_run) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    agents = {r.parameters["institution"]: r.id for r in weekly_run["runs"]
              if r.parameters.get("institution") in INSTITUTIONS}
    with temporary_settings({PREFECT_API_URL: deployed["api_url"]}):
        with get_client(sync_client=True) as client:
            said = {name: [log.message for log in all_logs(client, LogFilter(
                flow_run_id=LogFilterFlowRunId(any_=[run_id])))] for name, run_id in agents.items()}
    work = deployed["config"].parent
    for name, messages in said.items():
        folder = work / "registry" / name / MODEL / "v0001"
        assert [m for m in messages if m.startswith(f"{name}: stored {MODEL} v0001 (signed by the master; ")
                and m.endswith(f" in {folder}")], messages
    rows = deployed["scenario"]["overlap"]["new"]
    assert [name for name, messages in said.items()
            if any(" predictions to " in m for m in messages)] == [LABEL_HOLDER]
    predictions = work / "predictions" / LABEL_HOLDER
    assert any(m.startswith(f"{LABEL_HOLDER}: wrote {rows} predictions to {predictions}")
               for m in said[LABEL_HOLDER])


@pytest.fixture(scope="module")
def broken_retrains(deployed, weekly_run) -> dict:
    """Two retrain/weekly runs triggered at once while the grocer's agent run has a broken config.

    The grocer's agent run has its consortium key in an environment variable its worker lacks, as a worker
    started without it would. Both runs need the same agents' ports: one holds the federation and fails at
    once, quoting that error; the other waits for it, naming it, then does the same. Returns the holder and
    the waiter, each with its logs and agent runs.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import DeploymentUpdate
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    config = deployed["config"]
    raw = yaml.safe_load(config.read_text())
    raw["consortium_key"] = {"env": "FEDFOREST_KEY_NOT_IN_WORKERS"}
    broken = config.with_name("broken-grocer.yaml")
    broken.write_text(yaml.safe_dump(raw))
    with temporary_settings({PREFECT_API_URL: deployed["api_url"]}):
        with get_client(sync_client=True) as client:
            agent = client.read_deployment_by_name("institution-agent/grocer")
            client.update_deployment(agent.id, DeploymentUpdate(parameters={**agent.parameters,
                                                                            "config_path": str(broken)}))
            try:
                retrain = client.read_deployment_by_name("retrain/weekly")
                runs = [client.create_flow_run_from_deployment(retrain.id) for _ in range(2)]
                started = time.monotonic()
                while not all(client.read_flow_run(r.id).state.is_final() for r in runs):
                    assert time.monotonic() - started < 600, deployed["processes"].tail("worker-master", 80)
                    time.sleep(1)
            finally:
                client.update_deployment(agent.id, DeploymentUpdate(parameters=agent.parameters))
            time.sleep(3)  # the agents' runs finish just after their master's run
            runs = [client.read_flow_run(r.id) for r in runs]
            said = {r.id: [log.message for log in all_logs(client, LogFilter(
                flow_run_id=LogFilterFlowRunId(any_=[r.id])))] for r in runs}
            agents: dict = {r.id: {} for r in runs}  # each master run's agent runs, by institution
            earlier = {r.id for r in weekly_run["runs"]}
            for run in all_flow_runs(client):
                if run.id not in earlier and run.parameters.get("institution") in INSTITUTIONS:
                    master = client.read_task_run(run.parent_task_run_id).flow_run_id
                    agents.setdefault(master, {})[run.parameters["institution"]] = run
    waiting = {r.id: [m for m in said[r.id] if m.startswith("waiting for federation 'retail-demo': ")]
               for r in runs}
    assert sorted(len(lines) for lines in waiting.values()) == [0, 1], waiting
    waiter, holder = sorted(runs, key=lambda r: len(waiting[r.id]), reverse=True)
    return {"raw": raw, "waiting": waiting[waiter.id][0],
            **{role: {"run": r, "said": said[r.id], "agents": agents[r.id]}
               for role, r in (("holder", holder), ("waiter", waiter))}}


def test_an_agent_whose_config_is_broken_fails_the_master_at_once_with_its_error(deployed,
                                                                                 broken_retrains) -> None:
    """The master fails as soon as the grocer's agent run ends, quoting its error.

    It does not wait out its connect timeouts ("is the agent running?"), and cancels the other agents' runs.
    """
    run, said, agents = (broken_retrains["holder"][key] for key in ("run", "said", "agents"))
    # the agents that came up are not left serving until their idle timeout: no session will come
    assert {name: agent.state.name for name, agent in agents.items()} == {"lender": "Cancelled",
                                                                          "telco": "Cancelled",
                                                                          "grocer": "Failed"}
    assert len([m for m in said if m.startswith("cancelled agent flow run ")
                and m.endswith("the master could not reach every agent of this session (its run says why), "
                               "so no session will come")]) == 2
    assert run.state.name == "Failed"
    assert "institution 'grocer': its agent flow run" in run.state.message
    assert "environment variable FEDFOREST_KEY_NOT_IN_WORKERS is not set" in run.state.message
    assert "is the agent running" not in run.state.message
    # without watching the agent runs the master could not fail before its connect timeout
    connect_timeout_s = broken_retrains["raw"]["training"]["connect_timeout_s"]
    assert (run.end_time - run.start_time).total_seconds() < connect_timeout_s, (run.start_time, run.end_time)
    assert _registry(deployed["config"].parent).versions(MODEL) == ["v0001"]


def test_two_runs_of_one_deployment_at_once_take_turns_the_second_naming_the_first(broken_retrains) -> None:
    """The second run waits for the federation, naming the run that holds it, and starts once that one ended.

    Without the federation's concurrency limit both would start their agents on the same ports at once
    ("Server did not start properly"). The first run failed: failing, it still let the federation go.
    """
    holder, waiter = broken_retrains["holder"], broken_retrains["waiter"]
    assert broken_retrains["waiting"].startswith("waiting for federation 'retail-demo': flow run 'retrain ")
    assert f"({holder['run'].id}, Running)" in broken_retrains["waiting"]
    assert "(concurrency limit 'fedforest:retail-demo', one run of a federation at a time" in \
        broken_retrains["waiting"]
    # it started its agents only once the holder's had ended, and then failed for its own reason
    assert sorted(waiter["agents"]) == sorted(INSTITUTIONS)
    assert (max(a.end_time for a in holder["agents"].values())
            <= min(a.start_time for a in waiter["agents"].values()))
    assert waiter["run"].state.name == "Failed"
    assert "institution 'grocer': its agent flow run" in waiter["run"].state.message
    assert "Server did not start properly" not in waiter["run"].state.message
    assert [m for m in waiter["said"] if m.startswith("holding federation 'retail-demo'")]
