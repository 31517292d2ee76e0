"""Keep-alives (issue #27, point 5): a live master holds its session, a dead master's is released quickly.

A real AgentServer and FlightTransports in one process, with a session window of one second
(`busy_seconds`) and keep-alives every 0.05 s, so no test waits for real minutes.
"""

from __future__ import annotations

import gc
import threading
import time
from pathlib import Path

import pyarrow.flight as flight
import pytest

from fedcore.agents.serve import serve_until_session_closed
from fedcore.errors import PartyUnavailable, ProtocolError
from fedcore.protocol.messages import Message
from fedcore.transport.flight import AgentServer, FlightTransport
from fedcore.transport.guard import SessionGuard, envelope, keepalive_action
from fedcore.transport.tls import server_name
from tests.transport.pki import master_and_agent_ca

WINDOW = 1.0
"""The agents' session window in these tests (BUSY_SECONDS is 30 s)."""
KEEPALIVE = 0.05


class Party:
    """A stand-in party: sleeps on request, counts sessions (hello) and closes on 'close'."""

    name = "a"

    def __init__(self) -> None:
        self.sessions, self.closed = 0, False

    def handle(self, message: Message) -> Message:
        if message.kind == "hello":
            self.sessions, self.closed = self.sessions + 1, False
        elif message.kind == "close":
            self.closed = True
        elif message.kind == "sleep":
            time.sleep(float(message.header["s"]))
        return Message("ok")


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    return master_and_agent_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def agent(pki):
    server = AgentServer(Party(), tls_cert=pki / "a.pem", tls_key=pki / "a.key", ca_cert=pki / "ca.pem",
                         busy_seconds=WINDOW)
    yield server, f"grpc+tls://127.0.0.1:{server.port}"
    server.shutdown()


def _master(pki: Path, endpoint: str, keepalive_s: float | None = KEEPALIVE,
            run: str = "run") -> FlightTransport:
    return FlightTransport({"a": endpoint}, tls_cert=pki / "master.pem", tls_key=pki / "master.key",
                           ca_cert=pki / "ca.pem", timeout_s=10, run=run, keepalive_s=keepalive_s)


def test_a_live_master_keeps_a_second_one_out_however_long_it_is_idle(pki, agent) -> None:
    server, endpoint = agent
    with _master(pki, endpoint, run="first") as first, _master(pki, endpoint, run="second") as second:
        first.exchange({"a": Message("hello")})
        time.sleep(2 * WINDOW)  # no message for two windows, only keep-alives
        with pytest.raises(ProtocolError, match=rf"busy: session {first.session[:8]}\.\.\. of run first is "
                                                r"in progress \(its master was last heard from 0 s ago\)"):
            second.exchange({"a": Message("hello")})
        assert not server.guard.abandoned()
        assert first.exchange({"a": Message("work")})["a"].kind == "ok"  # undisturbed
    assert server.party.sessions == 1


def test_a_master_whose_keepalives_stop_lets_a_second_one_in_after_the_window(pki, agent) -> None:
    server, endpoint = agent
    with _master(pki, endpoint, run="first") as first:
        first.exchange({"a": Message("hello")})
        first.stop_keepalives()  # it died: no close, no more keep-alives
        with _master(pki, endpoint, run="early") as early:
            with pytest.raises(ProtocolError, match="busy: session"):
                early.exchange({"a": Message("hello")})
        time.sleep(WINDOW + 0.2)
        assert server.guard.abandoned()
        with _master(pki, endpoint, run="retry") as retry:
            assert retry.exchange({"a": Message("hello")})["a"].kind == "ok"
            with pytest.raises(ProtocolError, match=r"message of an earlier session \w{8}\.\.\., which is "
                                                    r"over"):
                first.exchange({"a": Message("late")})
            time.sleep(2 * WINDOW)  # the new master's own keep-alives hold its session
            assert server.guard.current == retry.session and not server.guard.abandoned()
    assert server.party.sessions == 2


def test_a_keepalive_of_any_other_session_changes_nothing(pki, agent) -> None:
    server, endpoint = agent
    client = flight.FlightClient(endpoint, tls_root_certs=(pki / "ca.pem").read_bytes(),
                                 cert_chain=(pki / "master.pem").read_bytes(),
                                 private_key=(pki / "master.key").read_bytes(),
                                 override_hostname=server_name("a"))

    def keepalive(session: str) -> bytes:
        return b"".join(r.body.to_pybytes() for r in client.do_action(flight.Action(keepalive_action(session),
                                                                                    b"")))

    current, other = "ab" * 16, "cd" * 16
    assert keepalive(current) == b"ignored"  # no session started here yet
    list(client.do_action(flight.Action(envelope(current, 1), Message("hello").to_buffer())))
    before = (server.guard.last_time, server.last_activity)
    time.sleep(0.05)
    assert keepalive(other) == b"ignored"
    assert (server.guard.last_time, server.last_activity) == before
    assert keepalive(current) == b"kept"
    assert server.guard.last_time > before[0] and server.last_activity > before[1]
    server.guard.close()
    closed = server.guard.last_time
    assert keepalive(current) == b"ignored" and server.guard.last_time == closed  # closed: stays closed
    with pytest.raises(flight.FlightServerError, match=r"malformed keep-alive 'keepalive/xyz'"):
        list(client.do_action(flight.Action("keepalive/xyz", b"")))
    client.close()
    assert server.party.sessions == 1 and server.guard.last_seq == 1  # no sequence number consumed


def test_a_long_answer_keeps_the_session_in_progress_without_keepalives(pki, agent) -> None:
    server, endpoint = agent
    with _master(pki, endpoint, keepalive_s=None, run="first") as first, _master(pki, endpoint) as second:
        first.exchange({"a": Message("hello")})
        long_answer = Message("sleep", {"s": 2.5 * WINDOW})
        answering = threading.Thread(target=lambda: first.exchange({"a": long_answer}))
        answering.start()
        time.sleep(1.5 * WINDOW)  # the master says nothing, but its agent is answering it
        try:
            assert not server.guard.abandoned()
            with pytest.raises(ProtocolError, match=r"busy: session \w{8}\.\.\. of run first is in progress "
                                                    r"\(this agent is answering one of its messages\)"):
                second.exchange({"a": Message("hello")})
        finally:
            answering.join()
        assert first.exchange({"a": Message("work")})["a"].kind == "ok"


def test_an_agent_for_one_session_stops_soon_after_its_master_dies(pki) -> None:
    server = AgentServer(Party(), tls_cert=pki / "a.pem", tls_key=pki / "a.key", ca_cert=pki / "ca.pem",
                         busy_seconds=WINDOW)
    master = _master(pki, f"grpc+tls://127.0.0.1:{server.port}")
    outcome: dict[str, BaseException | None] = {}

    def serve() -> None:
        try:
            serve_until_session_closed(server, idle_timeout_s=600, poll_s=0.05)
            outcome["error"] = None
        except PartyUnavailable as exc:  # the master is gone: nobody misbehaved
            outcome["error"] = exc

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        master.wait_ready(timeout_s=10)
        master.exchange({"a": Message("hello")})
        time.sleep(2 * WINDOW)
        assert thread.is_alive(), "a live master's keep-alives hold the agent however long it is silent"
        master.stop_keepalives()
        died = time.monotonic()
        thread.join(timeout=10)
        assert not thread.is_alive() and time.monotonic() - died < WINDOW + 2
    finally:
        master.close()
        server.shutdown()
    assert str(outcome["error"]) == ("agent 'a': no message and no keep-alive from the master for "
                                     f"{WINDOW:g} s (mid-session): its master is gone; stopped serving")


def test_an_agent_whose_master_went_silent_before_its_session_stops_after_the_window(pki) -> None:
    server = AgentServer(Party(), tls_cert=pki / "a.pem", tls_key=pki / "a.key", ca_cert=pki / "ca.pem",
                         busy_seconds=WINDOW)
    with _master(pki, f"grpc+tls://127.0.0.1:{server.port}", keepalive_s=None) as master:
        master.wait_ready(timeout_s=10)  # a ping: the master came, then died before its first message
        with pytest.raises(PartyUnavailable, match=rf"agent 'a': no call from the master for {WINDOW:g} s "
                                                r"\(before a session started\): its master is gone"):
            serve_until_session_closed(server, idle_timeout_s=600, poll_s=0.05)


def test_a_master_that_keeps_calling_but_never_starts_a_session_does_not_hold_the_agent(pki) -> None:
    """Keep-alives of a session that never starts here are not activity: the idle timeout still runs."""
    server = AgentServer(Party(), tls_cert=pki / "a.pem", tls_key=pki / "a.key", ca_cert=pki / "ca.pem",
                         busy_seconds=WINDOW)
    with _master(pki, f"grpc+tls://127.0.0.1:{server.port}") as master:
        master.wait_ready(timeout_s=10)  # it calls, and its keep-alives keep coming, but no session
        with pytest.raises(PartyUnavailable, match=r"agent 'a': no message from the master for 2 s "
                                                   r"\(before a session started\)"):
            serve_until_session_closed(server, idle_timeout_s=2 * WINDOW, poll_s=0.05)


def test_the_guard_counts_the_window_from_the_last_sign_of_life() -> None:
    now = [100.0]
    guard = SessionGuard(busy_seconds=0.5, clock=lambda: now[0])
    session = "ab" * 16
    guard.admit(envelope(session, 1))
    assert guard.in_session() and not guard.abandoned()
    now[0] += 0.625  # binary fractions: the clock's sums are exact
    assert not guard.abandoned()  # still answering the message it admitted
    guard.touch()
    now[0] += 0.375
    assert not guard.abandoned()  # the window counts from the answer, not from the message
    assert guard.keep_alive(session) and not guard.abandoned()
    now[0] += 0.375
    assert not guard.abandoned()  # and from the keep-alive
    now[0] += 0.125
    assert guard.abandoned() and guard.in_session()
    guard.admit(envelope("cd" * 16, 1))  # a new master takes over the abandoned session
    assert guard.current == "cd" * 16 and not guard.keep_alive(session)


def test_a_transport_dropped_without_close_stops_its_keepalives(pki, agent) -> None:
    server, endpoint = agent
    master = _master(pki, endpoint)
    master.exchange({"a": Message("hello")})
    thread = master._keepalive_threads[0]
    del master
    gc.collect()
    thread.join(timeout=2)
    assert not thread.is_alive()
