"""What an agent refuses, each with a logged reason, while it keeps serving.

An expired certificate, replayed, out-of-session and oversized messages, malformed or truncated payloads; and
a fuzz of its request handling with thousands of random and mutated messages.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedcore.errors import CertificateRefused, ProtocolError
from fedcore.protocol.messages import Message
from fedcore.transport.flight import AgentServer, FlightTransport
from fedcore.transport.guard import envelope
from fedcore.transport.tls import load_ca, server_name
from tests.transport.pki import master_and_agent_ca


class Counter:
    """A stand-in party that echoes and counts what reaches it."""

    name = "a"

    def __init__(self) -> None:
        self.calls = 0

    def handle(self, message: Message) -> Message:
        self.calls += 1
        return Message("echo", {"n": self.calls}, {"x": message.arrays.get("x", np.zeros(0))[::-1].copy()})


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    ca = master_and_agent_ca(tmp_path_factory.mktemp("ca"))
    _expired_copy(ca, "master", ca / "expired")
    return ca


def _expired_copy(ca_dir: Path, name: str, out: Path) -> None:
    """The same identity as `name`'s certificate, signed by the same CA, but valid only until yesterday."""
    ca_cert, ca_key = load_ca(ca_dir)
    original = x509.load_pem_x509_certificate((ca_dir / f"{name}.pem").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(original.subject).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(days=30)).not_valid_after(now - dt.timedelta(days=1)))
    for extension in original.extensions:
        builder = builder.add_extension(extension.value, critical=extension.critical)
    out.mkdir(parents=True, exist_ok=True)
    certificate = builder.sign(ca_key, hashes.SHA256())
    (out / f"{name}.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (out / f"{name}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                        serialization.PrivateFormat.PKCS8,
                                                        serialization.NoEncryption()))


@pytest.fixture
def agent(pki):
    server = AgentServer(Counter(), tls_cert=pki / "a.pem", tls_key=pki / "a.key", ca_cert=pki / "ca.pem",
                         max_message_bytes=3 << 20)
    yield server, f"grpc+tls://127.0.0.1:{server.port}"
    server.shutdown()


def _transport(pki, endpoint: str, cert_dir: Path | None = None) -> FlightTransport:
    cert_dir = cert_dir or pki
    return FlightTransport({"a": endpoint}, tls_cert=cert_dir / "master.pem", tls_key=cert_dir / "master.key",
                           ca_cert=pki / "ca.pem", timeout_s=10)


def _raw_client(pki, endpoint: str) -> flight.FlightClient:
    """A client with the master's certificate that can send anything, as a compromised or buggy master."""
    return flight.FlightClient(endpoint, tls_root_certs=(pki / "ca.pem").read_bytes(),
                               cert_chain=(pki / "master.pem").read_bytes(),
                               private_key=(pki / "master.key").read_bytes(),
                               override_hostname=server_name("a"))


def _still_serving(pki, endpoint: str, server: AgentServer) -> None:
    """A new master session is answered (the test's earlier sessions are over, as after their `close`)."""
    server.guard.close()
    before = server.party.calls
    with _transport(pki, endpoint) as transport:
        assert transport.exchange({"a": Message("hello", {}, {"x": np.arange(3)})})["a"].kind == "echo"
    assert server.party.calls == before + 1


def test_an_expired_master_certificate_is_refused(pki, agent, caplog) -> None:
    server, endpoint = agent
    with _transport(pki, endpoint, cert_dir=pki / "expired") as transport:
        with pytest.raises(CertificateRefused,
                           match="cannot reach party 'a' .* refused this master's certificate"):
            transport.exchange({"a": Message("hello")})
    assert server.party.calls == 0
    _still_serving(pki, endpoint, server)


def test_a_replayed_message_is_refused_and_logged(pki, agent, caplog) -> None:
    server, endpoint = agent
    with _transport(pki, endpoint) as transport, caplog.at_level(logging.WARNING, "fedcore.transport.flight"):
        transport.exchange({"a": Message("first")})
        transport._seq["a"] -= 1  # send the next message under the sequence number already used
        with pytest.raises(ProtocolError,
                           match="agent 'a' refused the message: replayed or reordered message: "
                                 "sequence 1 after 1 in this session"):
            transport.exchange({"a": Message("again")})
        assert transport.exchange({"a": Message("next")})["a"].header == {"n": 2}
    assert server.party.calls == 2 and server.refused == 1
    assert "agent 'a' refused a call (1 refused so far): replayed or reordered message" in caplog.text


def test_messages_outside_the_current_session_are_refused(pki, agent) -> None:
    server, endpoint = agent
    old, new = _transport(pki, endpoint), _transport(pki, endpoint)
    try:
        old.exchange({"a": Message("one")})
        old.exchange({"a": Message("close")})  # the master is done: a newer session may start
        new.exchange({"a": Message("one")})
        with pytest.raises(ProtocolError,
                           match=r"refused the message: message of an earlier session \w{8}\.\.\., "
                                 "which is over"):
            old.exchange({"a": Message("two")})
        late = _transport(pki, endpoint)
        late._seq["a"] = 4
        with pytest.raises(ProtocolError,
                           match=r"out-of-session message: session \w{8}\.\.\. never started here "
                                 r"\(sequence 5\)"):
            late.exchange({"a": Message("five")})
        late.close()
        assert new.exchange({"a": Message("two")})["a"].kind == "echo"
    finally:
        old.close()
        new.close()
    assert server.party.calls == 4


def test_a_second_master_is_refused_while_a_session_is_in_progress(pki, agent) -> None:
    server, endpoint = agent
    first = FlightTransport({"a": endpoint}, tls_cert=pki / "master.pem", tls_key=pki / "master.key",
                            ca_cert=pki / "ca.pem", timeout_s=10, run="retrain-7f3a", keepalive_s=None)
    second = _transport(pki, endpoint)
    try:
        first.exchange({"a": Message("one")})
        with pytest.raises(ProtocolError,
                           match=rf"refused the message: busy: session {first.session[:8]}\.\.\. of run "
                                 r"retrain-7f3a is in progress \(its master was last heard from 0 s ago\); "
                                 r"another master may start a session once it closes or its master has sent "
                                 r"nothing \(no message, no keep-alive\) for 30 s"):
            second.exchange({"a": Message("one")})
        assert first.exchange({"a": Message("two")})["a"].kind == "echo"  # the first run goes on undisturbed
        # a master that sends no keep-alives and has said nothing for this long is presumed gone
        server.guard.busy_seconds = 0.2
        time.sleep(0.3)
        third = _transport(pki, endpoint)
        assert third.exchange({"a": Message("one")})["a"].kind == "echo"
        third.close()
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("size", [2 << 20, 6 << 20])  # one call, and a stream that passes the limit midway
def test_an_oversized_message_is_refused_before_it_reaches_the_party(pki, agent, size) -> None:
    server, endpoint = agent
    with _transport(pki, endpoint) as transport:
        big = np.zeros(size // 8, dtype=np.float64)
        if size < (3 << 20):
            transport.exchange({"a": Message("fits", {}, {"x": big})})
            assert server.party.calls == 1
        else:
            with pytest.raises(ProtocolError,
                               match=r"refused the message: message of \d+ bytes or more exceeds the "
                                     r"limit of 3145728 bytes"):
                transport.exchange({"a": Message("too big", {}, {"x": big})})
            assert server.party.calls == 0
    _still_serving(pki, endpoint, server)


@pytest.mark.parametrize("payload",
                         [b"", b"not arrow at all", Message("ok", {}, {"x": np.arange(50)}).to_bytes()[:-20],
                          Message("ok").to_bytes()[8:]])
def test_malformed_or_truncated_payloads_are_refused(pki, agent, payload) -> None:
    server, endpoint = agent
    client = _raw_client(pki, endpoint)
    with pytest.raises(flight.FlightServerError, match="refused the message: malformed message"):
        list(client.do_action(flight.Action(envelope("ab" * 16, 1), pa.py_buffer(payload))))
    client.close()
    assert server.party.calls == 0
    _still_serving(pki, endpoint, server)


def test_calls_without_a_session_envelope_are_refused(pki, agent) -> None:
    server, endpoint = agent
    client = _raw_client(pki, endpoint)
    for action in ("message", "message/zz/1", "message/" + "ab" * 16 + "/0", "shell"):
        with pytest.raises(flight.FlightServerError, match="refused the message"):
            list(client.do_action(flight.Action(action, pa.py_buffer(Message("x").to_bytes()))))
    client.close()
    assert server.party.calls == 0


VALID = [Message("align", {"rows": 3}, {"positions": np.arange(5)}).to_bytes(),
         Message("find_splits", {"depth": 1, "nodes": [1, 2]},
                 {"a": np.ones((2, 3)), "b": np.arange(4)}).to_bytes()]


def _mutate(data: st.DataObject) -> bytes:
    base = bytearray(data.draw(st.sampled_from(VALID)))
    for _ in range(data.draw(st.integers(1, 8))):
        kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        where = data.draw(st.integers(0, max(len(base) - 1, 0)))
        if kind == "flip" and base:
            base[where] ^= data.draw(st.integers(1, 255))
        elif kind == "cut":
            del base[where:where + data.draw(st.integers(1, 64))]
        else:
            base[where:where] = data.draw(st.binary(min_size=1, max_size=16))
    return bytes(base)


@pytest.mark.slow
def test_fuzzing_the_agent_never_crashes_or_hangs_it(pki, agent) -> None:
    server, endpoint = agent
    client = _raw_client(pki, endpoint)
    session, outcomes = "cd" * 16, {"answered": 0, "refused": 0}
    options = flight.FlightCallOptions(timeout=30)  # a hang, not a slow call on a loaded machine

    @settings(max_examples=2500, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(st.data())
    def one_call(data) -> None:
        payload = _mutate(data) if data.draw(st.booleans()) else data.draw(st.binary(max_size=512))
        stamp = envelope(session, sum(outcomes.values()) + 1)
        try:
            list(client.do_action(flight.Action(stamp, pa.py_buffer(payload)), options=options))
            outcomes["answered"] += 1
        except flight.FlightServerError:
            outcomes["refused"] += 1

    one_call()
    client.close()
    assert sum(outcomes.values()) >= 2500 and outcomes["refused"] > 0
    assert 0 < server.refused <= outcomes["refused"]  # the rest reached the party and failed there
    _still_serving(pki, endpoint, server)


class Refusing:
    """A party that refuses every message, as a party refuses an out-of-protocol one."""

    name = "a"

    def handle(self, message: Message) -> Message:
        if message.kind == "boom":
            raise RuntimeError("a bug quoting cell 4711")
        raise ProtocolError(f"party 'a' refuses {message.kind!r}")


def test_refusals_are_one_counted_line_each_and_a_bug_a_traceback_here_and_a_generic_line_there(
        pki, caplog) -> None:
    server = AgentServer(Refusing(), tls_cert=pki / "a.pem", tls_key=pki / "a.key", ca_cert=pki / "ca.pem")
    try:
        with caplog.at_level(logging.WARNING, logger="fedcore.transport.flight"):
            with _transport(pki, f"grpc+tls://127.0.0.1:{server.port}") as transport:
                for i in range(30):
                    with pytest.raises(ProtocolError,
                                       match=rf"party 'a' failed on 'm{i}': ProtocolError: party 'a' "
                                             rf"refuses 'm{i}'"):
                        transport.exchange({"a": Message(f"m{i}")})
                with pytest.raises(ProtocolError) as bug:
                    transport.exchange({"a": Message("boom")})
                # the master is told that the party failed, and nothing of its internals: no file, no text
                assert str(bug.value).endswith(": party 'a' could not answer 'boom': an internal error (its "
                                               "traceback is in that party's log)")
                assert "4711" not in str(bug.value) and ".py" not in str(bug.value)
    finally:
        server.shutdown()
    records = [r for r in caplog.records
               if r.name == "fedcore.transport.flight" and "no master CA" not in r.getMessage()]  # at start
    refusals = [r for r in records if "refused a call" in r.getMessage()]
    assert len(refusals) == 30 and all(r.exc_info is None for r in refusals)
    assert "(30 refused so far)" in refusals[-1].getMessage() and "\n" not in refusals[-1].getMessage()
    # the bug: its traceback in the party's own log, saying where, without the exception's text
    bugs = [r for r in records if r not in refusals]
    assert len(bugs) == 1 and bugs[0].levelno == logging.ERROR
    assert bugs[0].getMessage().startswith("party 'a' failed on 'boom': a bug in its own code, not the "
                                           "peer's fault\nTraceback (most recent call last):\n")
    assert 'test_refusals.py", line' in bugs[0].getMessage() and "in handle" in bugs[0].getMessage()
    assert bugs[0].getMessage().endswith("RuntimeError (its text is withheld: it may quote the institution's "
                                         "data)")
    assert "4711" not in bugs[0].getMessage().replace('raise RuntimeError("a bug quoting cell 4711")', "")


def test_a_dispatched_handlers_bug_is_a_traceback_at_the_party_and_a_generic_line_at_the_master(
        pki, caplog) -> None:
    """Through Flight: a dispatched handler's bug reaches the master as one generic line.

    A malformed field still reaches it as the party's refusal naming the field.
    """
    from tests.protocol.test_dispatch_errors import SECRET, Party

    party = Party()
    party.name = "a"
    server = AgentServer(party, tls_cert=pki / "a.pem", tls_key=pki / "a.key", ca_cert=pki / "ca.pem")
    endpoint = f"grpc+tls://127.0.0.1:{server.port}"
    try:
        with caplog.at_level(logging.WARNING), _transport(pki, endpoint) as transport:
            with pytest.raises(ProtocolError) as failed:
                transport.exchange({"a": Message("boom")})
            assert str(failed.value) == (f"party 'a' at {endpoint} could not answer: party 'a' could "
                                         "not answer 'boom': an internal error (its traceback is in that "
                                         "party's log)")
            malformed = (r"party 'a' failed on 'grow': MalformedMessage: party 'a' refuses a malformed "
                         r"'grow' message: header field 'depth' is missing")
            with pytest.raises(ProtocolError, match=malformed):
                transport.exchange({"a": Message("grow", {}, {"rows": np.arange(3)})})
    finally:
        server.shutdown()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "Traceback (most recent call last)" in errors[0]
    assert "in _on_boom" in errors[0]
    assert SECRET not in errors[0] and SECRET not in str(failed.value)
