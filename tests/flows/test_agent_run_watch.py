"""A master notices an agent flow run that ended before serving and fails at once with its error.

For agents started as deployments: instead of waiting out the connect timeout (issue: a missing consortium key
was reported as "nothing listens there" after 3 x 60 s).
"""

from __future__ import annotations

import logging
import re
import socket
from dataclasses import dataclass

import pytest

from fedcore.config import parse_config
from fedcore.errors import AgentRunEnded, PartyUnavailable
from tasks.agents import agent_run_states, ended_agent_run, wait_for_agent_runs
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


def _reader(states: dict[str, _State | None]):
    return lambda run_id: _Run(name=f"agent-{run_id}", state=states[run_id])


def test_the_first_ended_agent_run_is_quoted():
    states = {"r1": _State("Running"), "r2": _State("Pending")}
    check = ended_agent_run({"bank": "r1", "insurer": "r2"}, read_flow_run=_reader(states), every_s=0)
    assert check() is None
    states["r2"] = _State("Failed", KEY_MISSING)
    assert check() == ("institution 'insurer': its agent flow run agent-r2 (r2) ended Failed before its "
                       f"agent served: {KEY_MISSING}")


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
