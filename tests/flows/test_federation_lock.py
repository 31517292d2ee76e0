"""One master run per federation at a time (`flows.federation_lock`): its decisions, without a Prefect server.

Against a real `prefect server start`, two runs at once: tests/e2e/test_deployments.py.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from types import SimpleNamespace
from uuid import UUID, uuid4

import httpx
import pytest

import flows.federation_lock as lock
from flows.federation_lock import Holder, holder_gone, holder_variable, limit_name

ME, OTHER = str(uuid4()), str(uuid4())


def _holder(run: str = OTHER, host: str = "master-host", pid: int = 4242) -> Holder:
    return Holder(run, "retrain churn v0002", str(uuid4()), host, pid, "2026-01-05T03:00:00+00:00")


def test_names_the_server_accepts() -> None:
    assert limit_name("retail-demo") == "fedforest:retail-demo"
    assert limit_name("a/b") == "fedforest:a-b"
    assert holder_variable("retail-demo") == "fedforest-holder-retail-demo"
    # a name Prefect variables refuse is slugged, with a digest so that two federations never share one
    assert holder_variable("Retail.Demo").startswith("fedforest-holder-retail-demo-")
    assert holder_variable("Retail.Demo") != holder_variable("retail.demo")


@pytest.mark.parametrize(("holder", "state", "exists", "host", "alive", "gone"), [
    (None, None, True, "master-host", False, None),  # unknown holder: never freed
    (_holder(), "RUNNING", True, "master-host", True, None),
    (_holder(), "RUNNING", True, "elsewhere", False, None),  # another host's process cannot be checked
    (_holder(), "PENDING", True, "master-host", True, None),
    (_holder(ME), "RUNNING", True, "master-host", True, "it is an earlier attempt of this same flow run"),
    (_holder(), None, False, "master-host", True, "its flow run no longer exists"),
    (_holder(), "CRASHED", True, "elsewhere", True, "its flow run has ended (Crashed)"),
    (_holder(), "COMPLETED", True, "elsewhere", True, "its flow run has ended (Completed)"),
    (_holder(), "RUNNING", True, "master-host", False, "its process 4242 on this host is gone"),
])
def test_when_a_holder_is_known_to_be_gone(holder, state, exists, host, alive, gone) -> None:
    assert holder_gone(holder, state, exists, ME, host, lambda pid: alive) == gone


def test_a_record_fedforest_did_not_write_names_no_holder() -> None:
    assert Holder.from_value(None) is None
    assert Holder.from_value({"flow_run_id": OTHER}) is None
    assert Holder.from_value("someone") is None
    holder = _holder()
    assert Holder.from_value(asdict(holder)) == holder


LOCKED = httpx.HTTPStatusError("locked", request=httpx.Request("POST", "http://prefect/api"),
                               response=httpx.Response(423, request=httpx.Request("POST", "http://prefect/api")))


class FakeServer:
    """The few client calls `_acquire` makes: the slot is free after `locked` attempts."""

    def __init__(self, locked: int, holder: Holder | None, state: str = "RUNNING",
                 lease_known: bool = True) -> None:
        self.locked, self.holder, self.state, self.lease_known = locked, holder, state, lease_known
        self.calls: list[str] = []

    def increment_concurrency_slots_with_lease(self, **kwargs):
        self.calls.append("acquire")
        if self.locked:
            raise LOCKED
        return SimpleNamespace(json=lambda: {"lease_id": "00000000-0000-0000-0000-000000000001",
                                             "limits": [{"name": kwargs["names"][0]}]})

    def read_variable_by_name(self, name):
        return SimpleNamespace(value=asdict(self.holder)) if self.holder else None

    def read_flow_run(self, run_id):
        return SimpleNamespace(name="retrain churn v0002", state=SimpleNamespace(type=SimpleNamespace(
            value=self.state)))

    def release_concurrency_slots_with_lease(self, lease):
        self.calls.append(f"release {lease}")
        if self.lease_known:
            self.locked = 0

    def update_global_concurrency_limit(self, name, update):
        self.calls.append(f"reset {name} to {update.active_slots}")
        self.locked = 0

    def delete_variable_by_name(self, name):
        self.calls.append(f"forget {name}")


def _acquire(server: FakeServer, caplog, me: str = ME) -> UUID | None:
    with caplog.at_level(logging.INFO, logger="lock-test"):
        return lock._acquire(server, "retail-demo", me, logging.getLogger("lock-test"), poll_s=0)


def test_a_second_run_waits_naming_the_holder_once(caplog) -> None:
    server = FakeServer(locked=3, holder=_holder(), state="RUNNING")

    def attempt(**kwargs):
        server.calls.append("acquire")
        server.locked -= 1
        if server.locked >= 0:
            raise LOCKED
        return SimpleNamespace(json=lambda: {"lease_id": str(UUID(int=7)), "limits": [{}]})

    server.increment_concurrency_slots_with_lease = attempt
    assert _acquire(server, caplog) == UUID(int=7)
    assert server.calls == ["acquire"] * 4  # nothing freed: the holder is running on another host
    waiting = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting")]
    assert waiting == [f"waiting for federation 'retail-demo': flow run 'retrain churn v0002' ({OTHER}, "
                       "Running) on host master-host, process 4242, since 2026-01-05T03:00:00+00:00 holds it "
                       "(concurrency limit 'fedforest:retail-demo', one run of a federation at a time: they "
                       "share the agents' ports); this run starts once it is done"]


def test_a_crashed_holders_lease_is_released_then_the_slot_taken(caplog) -> None:
    holder = _holder()
    server = FakeServer(locked=1, holder=holder, state="CRASHED")
    assert _acquire(server, caplog) == UUID(int=1)
    assert server.calls == ["acquire", f"release {holder.lease_id}", "acquire"]
    said = [r.getMessage() for r in caplog.records]
    assert [m for m in said if m.endswith("held it, but its flow run has ended (Crashed)")], said


def test_a_slot_whose_lease_the_server_forgot_is_reset_once_its_holder_is_gone(caplog, monkeypatch) -> None:
    """The ephemeral server of an earlier `fedforest retrain` that was killed: its lease died with it."""
    holder = _holder(host="here", pid=1)
    server = FakeServer(locked=1, holder=holder, state="RUNNING", lease_known=False)
    monkeypatch.setattr(lock, "pid_alive", lambda pid: False)
    monkeypatch.setattr(lock.socket, "gethostname", lambda: "here")
    assert _acquire(server, caplog) == UUID(int=1)
    assert server.calls == ["acquire", f"release {holder.lease_id}", "acquire",
                            "reset fedforest:retail-demo to 0", "forget fedforest-holder-retail-demo",
                            "acquire"]


def test_a_slot_of_an_unknown_holder_is_waited_for_never_freed(caplog) -> None:
    server = FakeServer(locked=1, holder=None)
    calls = {"n": 0}

    def attempt(**kwargs):
        calls["n"] += 1
        if calls["n"] < 3:
            raise LOCKED
        return SimpleNamespace(json=lambda: {"lease_id": str(UUID(int=3)), "limits": [{}]})

    server.increment_concurrency_slots_with_lease = attempt
    assert _acquire(server, caplog) == UUID(int=3)
    assert server.calls == []  # nothing released, nothing reset
    assert [r.getMessage() for r in caplog.records if "has not recorded itself" in r.getMessage()]


def test_an_inactive_limit_holds_nothing(caplog) -> None:
    server = FakeServer(locked=0, holder=None)
    server.increment_concurrency_slots_with_lease = lambda **kwargs: SimpleNamespace(
        json=lambda: {"lease_id": str(UUID(int=1)), "limits": []})
    assert _acquire(server, caplog) is None
