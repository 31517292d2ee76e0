"""A master notices an agent flow run that ended before serving and fails at once with its error.

For agents started as deployments: instead of waiting out the connect timeout (issue: a missing consortium key
was reported as "nothing listens there" after 3 x 60 s).
"""

from __future__ import annotations

import logging
import re
import socket
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

import tasks.agents
from fedcore.config import parse_config
from fedcore.errors import AgentRunEnded, PartyUnavailable
from tasks.agents import (
    agent_run_states,
    ended_agent_run,
    name_agent_runs,
    pool_reading,
    trigger_agent_deployments,
    wait_for_agent_runs,
)
from tests.transport.test_flight import _transport, pki  # noqa: F401 - the module's CA fixture

KEY_MISSING = ("Flow run encountered an exception: ConfigError: consortium key: environment variable "
               "FEDFOREST_CONSORTIUM_KEY is not set")


@dataclass
class _State:
    name: str
    message: str | None = None

    def is_final(self) -> bool:
        return self.name in ("Completed", "Failed", "Crashed", "Cancelled")

    def is_completed(self) -> bool:
        return self.name == "Completed"


@dataclass
class _Run:
    name: str
    state: _State | None
    expected_start_time: datetime | None = None


def _reader(states: dict[str, _State | None], scheduled: datetime | None = None):
    return lambda run_id: _Run(name=f"agent-{run_id}", state=states[run_id], expected_start_time=scheduled)


def test_the_first_ended_agent_run_is_quoted():
    states = {"r1": _State("Running"), "r2": _State("Pending")}
    check = ended_agent_run({"bank": "r1", "insurer": "r2"}, read_flow_run=_reader(states), every_s=0)
    assert check() is None
    states["r2"] = _State("Failed", KEY_MISSING)
    assert check() == ("institution 'insurer': its agent flow run agent-r2 (r2) ended Failed before its "
                       f"agent served: {KEY_MISSING}")


def test_an_agent_run_no_worker_picks_up_fails_the_master_once_late_for_the_timeout():
    """A partner whose worker is down was reported after 203 s (3 x connect_timeout_s); now after 30 s."""
    started = datetime(2026, 5, 4, 3, 0, tzinfo=UTC)
    clock = {"now": started + timedelta(seconds=5)}
    states = {"r1": _State("Running"), "r2": _State("Scheduled")}
    pools: list[str] = []

    def describe(pool: str) -> str:
        pools.append(pool)
        return f"no worker is polling work pool {pool!r}"

    check = ended_agent_run({"bank": "r1", "telco": "r2"}, read_flow_run=_reader(states, started), every_s=0,
                            late_after_s=30, pools={"bank": "bank", "telco": "telco-pool"},
                            describe_pool=describe, now=lambda: clock["now"])
    assert check() is None
    states["r2"], clock["now"] = _State("Late"), started + timedelta(seconds=29.5)  # Late after 15 s
    assert check() is None and pools == []
    clock["now"] = started + timedelta(seconds=31)
    assert check() == ("institution 'telco': its agent flow run agent-r2 (r2) is still Late 31 s after it "
                       "was scheduled: no worker is polling work pool 'telco-pool' "
                       "(training.agent_late_timeout_s=30)")
    states["r2"] = _State("Pending")  # a worker picked it up: no longer late
    assert check() is None
    without = ended_agent_run({"telco": "r2"}, read_flow_run=_reader({"r2": _State("Late")}, started),
                              every_s=0, now=lambda: started + timedelta(hours=1))
    assert without() is None  # no late_after_s: only a final state gives up


def test_what_the_server_says_of_a_pool_no_worker_picked_a_run_from():
    def worker(name: str, status: str, seen: datetime | None) -> SimpleNamespace:
        return SimpleNamespace(name=name, status=SimpleNamespace(value=status), last_heartbeat_time=seen)

    pool = SimpleNamespace(is_paused=False)
    seen = datetime(2026, 5, 4, 2, 58, 7, tzinfo=UTC)
    assert pool_reading("telco", pool, [worker("w1", "OFFLINE", seen)]) == (
        "no worker is polling work pool 'telco' (its last worker was seen 2026-05-04 02:58:07 UTC); start "
        "one on the institution's host: prefect worker start --pool telco")
    assert pool_reading("telco", pool, []) == (
        "no worker is polling work pool 'telco' (no worker ever polled it); start one on the institution's "
        "host: prefect worker start --pool telco")
    now = seen + timedelta(seconds=40)  # a worker stopped a moment ago still shows online for a while
    assert pool_reading("telco", pool, [worker("w1", "ONLINE", seen), worker("w2", "OFFLINE", None)],
                        now=now) == (
        "work pool 'telco' has 1 online worker (w1 last seen 40 s ago), which did not pick it up: stopped "
        "since, busy, or at a concurrency limit?")
    assert pool_reading("telco", SimpleNamespace(is_paused=True), []) == (
        "work pool 'telco' is paused (resume it: prefect work-pool resume telco)")


def test_runs_are_read_at_most_every_interval():
    reads = []
    check = ended_agent_run({"bank": "r1"},
                            read_flow_run=lambda r: reads.append(r) or _Run("a", _State("Running")),
                            every_s=3600)
    assert check() is None and check() is None and len(reads) == 1


def test_a_timed_out_master_says_where_each_agent_run_stands(tmp_path):
    raw = {"federation": "f", "consortium_key": {"env": "K"}, "institutions": [
        {"name": "bank", "data": "b.csv", "id_column": "id", "label": "y", "work_pool": "bank-pool"},
        {"name": "insurer", "data": "i.csv", "id_column": "id"}]}
    config = parse_config(raw, tmp_path / "federation.yaml")
    text = agent_run_states(config, {"bank": "r1", "insurer": "r2"},
                            read_flow_run=_reader({"r1": _State("Scheduled"), "r2": _State("Running")}))
    assert text == "bank Scheduled (is a worker polling work pool 'bank-pool'?), insurer Running"


def test_wait_ready_gives_up_at_once_when_an_agent_run_ended(pki):  # noqa: F811 - pytest fixture
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nobody listens there: the agent's run failed before serving
    states = {"r1": _State("Running")}
    check = ended_agent_run({"a": "r1"}, read_flow_run=_reader(states), every_s=0)
    with _transport({"a": f"grpc+tls://127.0.0.1:{port}"}, pki) as transport:
        calls = {"n": 0}

        def gave_up():
            calls["n"] += 1
            if calls["n"] == 3:  # the run fails while the master waits
                states["r1"] = _State("Failed", KEY_MISSING)
            return check()

        with pytest.raises(AgentRunEnded,
                           match=re.escape(f"ended Failed before its agent served: {KEY_MISSING}")):
            transport.wait_ready(timeout_s=60, interval_s=0.01, gave_up=gave_up)
        assert calls["n"] == 3  # at the round the run ended, not after the 60 s timeout
        with pytest.raises(PartyUnavailable, match="agents not ready after 0.2 s"):
            transport.wait_ready(timeout_s=0.2, interval_s=0.01, gave_up=lambda: None)


def test_agent_runs_are_awaited_until_final_and_one_outliving_its_session_is_cancelled(caplog):
    states = {"r1": _State("Running"), "r2": _State("Running")}
    reads = {"n": 0}

    def read(run_id: str) -> _Run:
        reads["n"] += 1
        if reads["n"] == 3:  # the runs end while the master waits
            states["r1"], states["r2"] = _State("Completed"), _State("Failed", KEY_MISSING)
        return _reader(states)(run_id)

    cancelled: list = []
    log = logging.getLogger("test-agent-runs")
    result = wait_for_agent_runs(["r1", "r2"], timeout_s=60, poll_s=0, read_flow_run=read,
                                 cancel=lambda ids, why: cancelled.append((ids, why)) or ids, logger=log)
    assert result == {"r1": "Completed", "r2": "Failed"} and cancelled == []

    states["r2"] = _State("Running")  # an agent run that does not stop when its session ends
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="test-agent-runs"):
        result = wait_for_agent_runs(["r1", "r2"], timeout_s=0, poll_s=0, read_flow_run=_reader(states),
                                     cancel=lambda ids, why: cancelled.append((ids, why)) or ids, logger=log)
    assert result == {"r1": "Completed", "r2": "Running"}
    assert cancelled == [(["r2"], "the master's session ended and this agent run had not stopped 0 s later")]
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "agent flow run agent-r1 (r1): Completed"),
        ("WARNING", "agent flow run agent-r2 (r2): still Running after 0 s")]


def test_agent_runs_are_named_after_institution_purpose_model_and_then_version(tmp_path, monkeypatch):
    """Not Prefect's random names: three of every four rows of the UI's run list are agent runs."""
    import prefect.deployments

    raw = {"federation": "f", "consortium_key": {"env": "K"}, "institutions": [
        {"name": "bank", "data": "b.csv", "id_column": "id", "label": "y"},
        {"name": "telco", "data": "t.csv", "id_column": "id"}]}
    config = parse_config(raw, tmp_path / "federation.yaml")
    started: list[dict] = []

    def run_deployment(name: str, **kwargs) -> SimpleNamespace:
        started.append({"deployment": name, **kwargs})
        return SimpleNamespace(id=f"id-{len(started)}")

    monkeypatch.setattr(prefect.deployments, "run_deployment", run_deployment)
    monkeypatch.setattr(tasks.agents, "get_run_logger", lambda: logging.getLogger("test-agent-runs"))
    runs = trigger_agent_deployments.fn(config, purpose="retrain churn-90d")
    assert runs == {"bank": "id-1", "telco": "id-2"}
    assert [(s["deployment"], s["flow_run_name"], s["parameters"]) for s in started] == [
        ("institution-agent/bank", "bank: retrain churn-90d", {"institution": "bank"}),
        ("institution-agent/telco", "telco: retrain churn-90d", {"institution": "telco"})]

    renamed: list[tuple[str, str]] = []
    name_agent_runs(runs, "retrain churn-90d v0002",
                    rename=lambda run_id, name: renamed.append((run_id, name)))
    assert renamed == [("id-1", "bank: retrain churn-90d v0002"), ("id-2", "telco: retrain churn-90d v0002")]

    def unreachable(run_id: str, name: str) -> None:
        raise ConnectionError("the API is down")

    log = logging.getLogger("test-agent-runs")
    name_agent_runs(runs, "retrain churn-90d v0002", rename=unreachable, logger=log)  # logged, not raised
