"""An agent started for one session gives up when the master never comes or goes silent."""

from __future__ import annotations

import time

import pytest

from fedcore.agents.serve import serve_until_session_closed
from fedcore.errors import PartyUnavailable, ProtocolError
from fedcore.protocol.messages import Message
from fedcore.transport.flight import AgentServer, FlightTransport
from fedcore.transport.tls import init_ca, issue_certificate


class Session:
    """A stand-in institution: counts sessions, closes on 'close'."""

    name = "bank"

    def __init__(self) -> None:
        self.sessions, self.closed = 0, False

    def handle(self, message: Message) -> Message:
        if message.kind == "refuse":
            raise ProtocolError("institution 'bank' refuses 'refuse'")
        if message.kind == "close":
            self.closed = True
        else:
            self.sessions += 1
        return Message("ok")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    ca = tmp_path_factory.mktemp("ca")
    init_ca(ca)
    issue_certificate(ca, "master", ca, role="master")
    issue_certificate(ca, "bank", ca, role="institution")
    return ca


def _server(pki) -> AgentServer:
    return AgentServer(Session(), tls_cert=pki / "bank.pem", tls_key=pki / "bank.key", ca_cert=pki / "ca.pem")


def test_an_agent_nobody_talks_to_stops_and_says_so(pki) -> None:
    server = _server(pki)
    started = time.monotonic()
    with pytest.raises(PartyUnavailable,
                       match=r"agent 'bank': no message from the master for 0.5 s \(before a session "
                             r"started\); stopped serving"):
        serve_until_session_closed(server, idle_timeout_s=0.5)
    assert time.monotonic() - started < 5


def test_the_master_closing_the_session_ends_serving_without_error(pki) -> None:
    import threading

    server = _server(pki)
    endpoint = f"grpc+tls://127.0.0.1:{server.port}"
    done = threading.Event()
    thread = threading.Thread(target=lambda: (serve_until_session_closed(server, idle_timeout_s=30),
                                              done.set()))
    thread.start()
    with FlightTransport({"bank": endpoint}, tls_cert=pki / "master.pem", tls_key=pki / "master.key",
                         ca_cert=pki / "ca.pem") as transport:
        transport.wait_ready(timeout_s=10)
        transport.exchange({"bank": Message("validation_report")})
        transport.exchange({"bank": Message("close")})
    thread.join(timeout=10)
    assert done.is_set() and server.party.closed


def test_an_agent_whose_party_refused_a_message_of_its_session_fails_once_the_master_closes_it(pki) -> None:
    """An agent run whose session failed ends Failed, not Completed (issue #28)."""
    import threading

    server = _server(pki)
    endpoint = f"grpc+tls://127.0.0.1:{server.port}"
    raised: list[BaseException] = []

    def serve() -> None:
        try:
            serve_until_session_closed(server, idle_timeout_s=30)
        except ProtocolError as exc:
            raised.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    with FlightTransport({"bank": endpoint}, tls_cert=pki / "master.pem", tls_key=pki / "master.key",
                         ca_cert=pki / "ca.pem") as transport:
        transport.wait_ready(timeout_s=10)
        transport.exchange({"bank": Message("validation_report")})
        with pytest.raises(ProtocolError, match="refuses 'refuse'"):
            transport.exchange({"bank": Message("refuse")})
        transport.exchange({"bank": Message("close")})  # the master releases its agents after failing
    thread.join(timeout=10)
    assert server.party.closed and [str(e) for e in raised] == [
        "agent 'bank': its session failed here: party 'bank' failed on 'refuse': ProtocolError: institution "
        "'bank' refuses 'refuse'; stopped serving"]
