"""Arrow Flight with mutual TLS: the same forest as in-process, refused strangers, clear failures."""

from __future__ import annotations

import hashlib
import re
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from fedcore.data.split import split_vertical
from fedcore.errors import CertificateRefused, ComputeUnavailable, PartyUnavailable, ProtocolError
from fedcore.protocol.messages import Message, StreamedMessage
from fedcore.transport import flight as flight_module
from fedcore.transport.flight import AgentServer, FlightTransport
from fedcore.transport.inprocess import InProcessTransport
from fedcore.transport.tls import init_ca, issue_certificate
from fedcore.trees.params import ForestParams
from fedcore.vertical.master import VerticalMaster
from fedcore.vertical.party import VerticalParty
from tests.conftest import mixed_table

PARTIES = ("a", "b", "c")


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """The consortium CA with a master and three institutions, and a rogue CA with its own 'master'."""
    root = tmp_path_factory.mktemp("pki")
    ca, rogue = root / "ca", root / "rogue"
    init_ca(ca)
    issue_certificate(ca, "master", ca, role="master")
    for name in PARTIES:
        issue_certificate(ca, name, ca, role="institution")
    init_ca(rogue, name="someone else's CA")
    issue_certificate(rogue, "master", rogue, role="master")
    issue_certificate(rogue, "a", rogue, role="institution")
    return {"ca": ca, "rogue": rogue}


def _server(party, pki, name: str | None = None) -> AgentServer:
    ca = pki["ca"]
    name = name or party.name
    return AgentServer(party, tls_cert=ca / f"{name}.pem", tls_key=ca / f"{name}.key", ca_cert=ca / "ca.pem")


def _transport(endpoints: dict[str, str], pki, cert_dir: Path | None = None, name: str = "master",
               **kwargs) -> FlightTransport:
    cert_dir = cert_dir or pki["ca"]
    return FlightTransport(endpoints, tls_cert=cert_dir / f"{name}.pem", tls_key=cert_dir / f"{name}.key",
                           ca_cert=pki["ca"] / "ca.pem", **kwargs)


@contextmanager
def _agents(parties, pki):
    """Each party behind its own AgentServer on 127.0.0.1; yields {name: endpoint}."""
    servers = [_server(p, pki) for p in parties]
    try:
        yield {p.name: f"grpc+tls://127.0.0.1:{s.port}" for p, s in zip(parties, servers, strict=True)}
    finally:
        for s in servers:
            s.shutdown()


class Echo:
    """A stand-in party: echoes arrays reversed, sleeps, fails or meets on request, counts calls."""

    def __init__(self, name: str, meeting: threading.Barrier | None = None) -> None:
        self.name, self.meeting = name, meeting
        self.calls = 0

    def handle(self, message: Message) -> Message:
        self.calls += 1
        if message.kind == "boom":
            raise ValueError("kaboom")
        if message.kind == "cancelled":  # what a party's Dask client raises once its scheduler is gone
            from distributed.client import FutureCancelledError

            raise FutureCancelledError("_ranges-123", "scheduler-connection-lost")
        if message.kind == "sleep":
            time.sleep(float(message.header["s"]))
        if message.kind == "meet":  # answers only once every party of the meeting was called
            self.meeting.wait()
        x = message.arrays.get("x", np.zeros(0))
        return Message("echo", {"who": self.name}, {"x": x[::-1].copy()})


def _vertical_parties(frames, label: str) -> list[VerticalParty]:
    key = hashlib.sha256(b"fedforest-test").digest()
    return [VerticalParty(name, frame, label if label in frame.columns else None, feature_key=key)
            for name, frame in zip(PARTIES, frames, strict=True)]


def _train_and_predict(transport, parties, frames, label):
    master = VerticalMaster(transport, ForestParams(task="classification", n_estimators=6, max_depth=6,
                                                    random_state=5))
    master.fit()
    for party, frame in zip(parties, frames, strict=True):
        party.set_prediction_data(frame.drop(columns=[label], errors="ignore"))
    n = len(frames[0])
    predictions = {m: master.predict_values(n, m) for m in ("one-round", "node-by-node")}
    return master, predictions


def test_flight_forest_equals_in_process(pki) -> None:
    frames = split_vertical(mixed_table(n_rows=500, seed=4), 3, label="target", seed=1)
    local_parties = _vertical_parties(frames, "target")
    local = InProcessTransport({p.name: p.handle for p in local_parties})
    expected, expected_pred = _train_and_predict(local, local_parties, frames, "target")

    remote_parties = _vertical_parties(frames, "target")
    with _agents(remote_parties, pki) as endpoints, _transport(endpoints, pki) as transport:
        got, got_pred = _train_and_predict(transport, remote_parties, frames, "target")
        stats = transport.stats.to_dict()

    for f in fields(expected.structure):
        np.testing.assert_array_equal(getattr(got.structure, f.name), getattr(expected.structure, f.name),
                                      err_msg=f.name)
    for method, values in expected_pred.items():
        np.testing.assert_array_equal(got_pred[method], values, err_msg=method)
    assert stats == local.stats.to_dict()  # same rounds, and the same bytes per message kind


def test_large_messages_stream_in_chunks(pki, monkeypatch) -> None:
    monkeypatch.setattr(flight_module, "ACTION_MAX_BYTES", 16 << 10)
    monkeypatch.setattr(flight_module, "CHUNK_BYTES", 64 << 10)
    x = np.arange(100_000, dtype=np.float64)  # 800 kB: a streamed request and a 13-chunk reply
    with _agents([Echo("a")], pki) as endpoints, _transport(endpoints, pki) as transport:
        small = transport.exchange({"a": Message("ping", {}, {"x": x[:10]})})["a"]
        big = transport.exchange({"a": Message("ping", {}, {"x": x})})["a"]
    np.testing.assert_array_equal(small.arrays["x"], x[:10][::-1])
    np.testing.assert_array_equal(big.arrays["x"], x[::-1])


def test_parties_answer_in_parallel(pki) -> None:
    """No party answers before all three were called: called one after another, the first would never answer.

    An order, not a duration: the call would fail on the transport's timeout (or the meeting's) instead.
    """
    meeting = threading.Barrier(len(PARTIES), timeout=20)
    parties = [Echo(n, meeting) for n in PARTIES]
    with _agents(parties, pki) as endpoints, _transport(endpoints, pki) as transport:
        transport.wait_ready(timeout_s=10)
        replies = transport.exchange({n: Message("meet") for n in PARTIES})
    assert {n: r.header["who"] for n, r in replies.items()} == {n: n for n in PARTIES}
    assert not meeting.broken and [p.calls for p in parties] == [1, 1, 1]


def test_handler_error_is_reported_and_agent_keeps_serving(pki) -> None:
    with _agents([Echo("a")], pki) as endpoints, _transport(endpoints, pki) as transport:
        with pytest.raises(ProtocolError, match=r"party 'a' at grpc\+tls://127.0.0.1:\d+ could not answer: "
                                                r"party 'a' could not answer 'boom': an internal error \(its "
                                                r"traceback is in that party's log\)$"):
            transport.exchange({"a": Message("boom")})
        assert transport.exchange({"a": Message("ping")})["a"].header == {"who": "a"}


def test_a_party_that_lost_its_cluster_is_unavailable_not_a_bug(pki, caplog) -> None:
    """A lost Dask cluster reaches the master as ComputeUnavailable (a PartyUnavailable: resumable)."""
    pytest.importorskip("distributed")
    with _agents([Echo("a")], pki) as endpoints, _transport(endpoints, pki) as transport:
        with pytest.raises(ComputeUnavailable) as lost:
            transport.exchange({"a": Message("cancelled")})
        assert transport.exchange({"a": Message("ping")})["a"].header == {"who": "a"}
    assert re.fullmatch(r"party 'a' at grpc\+tls://127.0.0.1:\d+: party 'a' lost its compute cluster while "
                        r"answering 'cancelled': the cluster cancelled its tasks "
                        r"\(scheduler-connection-lost\), on the Dask cluster given to it; resume once it "
                        r"answers again", str(lost.value))
    assert "a bug in its own code" not in caplog.text


class Streaming:
    """A stand-in party answering with a StreamedMessage of `rows` rows in parts of `part` (issue #29)."""

    def __init__(self, name: str, rows: int, part: int) -> None:
        self.name, self.rows, self.part = name, rows, part
        self.made: list[int] = []  # parts made so far, in order
        self.values = np.arange(rows * 32, dtype=np.int64).astype(np.uint8).reshape(rows, 32)

    def _parts(self, fail_at: int | None):
        for i, start in enumerate(range(0, self.rows, self.part)):
            if i == fail_at:
                raise ValueError("a block could not be read")
            self.made.append(i)
            yield self.values[start:start + self.part]

    def handle(self, message: Message) -> Message | StreamedMessage:
        if message.kind == "ping":
            return Message("pong", {"who": self.name})
        fail_at = message.header.get("fail_at")
        return StreamedMessage("id_hashes", {"rows": self.rows}, "hashes", (self.rows, 32),
                               lambda: self._parts(fail_at))


@pytest.mark.parametrize("request_bytes", [0, 40_000])  # a do_action, and a streamed (do_exchange) call
def test_a_streamed_answer_arrives_as_the_whole_message(pki, monkeypatch, request_bytes) -> None:
    """Its parts are made while Flight sends them; the master parses the one message they add up to."""
    monkeypatch.setattr(flight_module, "ACTION_MAX_BYTES", 16 << 10)
    monkeypatch.setattr(flight_module, "CHUNK_BYTES", 64 << 10)
    party = Streaming("a", rows=10_000, part=3_000)  # 320 kB in 4 parts, the last one short
    padding = np.zeros(request_bytes, np.uint8)
    with _agents([party], pki) as endpoints, _transport(endpoints, pki) as transport:
        reply = transport.exchange({"a": Message("hashes", {}, {"pad": padding})})["a"]
        assert transport.exchange({"a": Message("ping")})["a"].header == {"who": "a"}  # free again
    expected = Message("id_hashes", {"rows": 10_000}, {"hashes": party.values})
    assert (reply.kind, reply.header) == (expected.kind, expected.header)
    assert reply.arrays["hashes"].shape == (10_000, 32)
    assert reply.arrays["hashes"].tobytes() == party.values.tobytes()
    assert party.made == [0, 1, 2, 3]


def test_a_streamed_answer_that_fails_midway_is_one_line_and_the_agent_serves_on(pki) -> None:
    party = Streaming("a", rows=1_000, part=300)
    with _agents([party], pki) as endpoints, _transport(endpoints, pki) as transport:
        # not a refusal: an unexpected failure while the answer is made, its traceback in the agent's log
        with pytest.raises(ProtocolError, match=r"party 'a' could not answer 'hashes': an internal error "
                                                r"\(its traceback is in that party's log\)"):
            transport.exchange({"a": Message("hashes", {"fail_at": 2})})
        assert party.made == [0, 1]
        assert transport.exchange({"a": Message("ping")})["a"].header == {"who": "a"}


def test_client_certificate_from_another_ca_is_refused(pki) -> None:
    party = Echo("a")
    with _agents([party], pki) as endpoints, _transport(endpoints, pki, cert_dir=pki["rogue"]) as transport:
        with pytest.raises(CertificateRefused,
                           match=r"cannot reach party 'a' at grpc\+tls://127\.0\.0\.1:\d+: the agent "
                            r"closed the connection after the handshake: it refused this "
                            r"master's certificate"):
            transport.exchange({"a": Message("ping")})
    assert party.calls == 0


def test_agent_certificate_from_another_ca_is_refused(pki) -> None:
    party = Echo("a")
    rogue = pki["rogue"]
    server = AgentServer(party, tls_cert=rogue / "a.pem", tls_key=rogue / "a.key",
                         ca_cert=pki["ca"] / "ca.pem")
    try:
        with _transport({"a": f"grpc+tls://127.0.0.1:{server.port}"}, pki) as transport:
            with pytest.raises(CertificateRefused,
                               match=r"cannot reach party 'a' at .*: the agent's certificate does not "
                                r"verify against the consortium CA"):
                transport.exchange({"a": Message("ping")})
    finally:
        server.shutdown()
    assert party.calls == 0


def test_a_healthy_agent_has_nothing_to_explain(pki) -> None:
    with _agents([Echo("a")], pki) as endpoints, _transport(endpoints, pki) as transport:
        assert transport.explain_unreachable("a") is None
        assert transport.ping("a") == "a"


def test_institution_certificate_cannot_act_as_master(pki) -> None:
    party = Echo("a")
    with _agents([party], pki) as endpoints, _transport(endpoints, pki, name="b") as transport:
        with pytest.raises(CertificateRefused,
                           match="refused this master: agent 'a' serves only master 'master'; "
                            r"the client at .* presented the certificate of institution 'b'"):
            transport.exchange({"a": Message("ping")})
    assert party.calls == 0


def test_master_refuses_an_agent_with_another_institutions_certificate(pki) -> None:
    impostor = Echo("b")
    server = _server(impostor, pki)  # b's agent, listed as a's endpoint
    try:
        with _transport({"a": f"grpc+tls://127.0.0.1:{server.port}"}, pki) as transport:
            with pytest.raises(CertificateRefused,
                               match=r"cannot reach party 'a' at .*: the agent there presents the "
                                r"certificate of institution 'b', not of institution 'a'"):
                transport.exchange({"a": Message("ping")})
    finally:
        server.shutdown()
    assert impostor.calls == 0


@pytest.mark.timeout(60)
def test_unreachable_endpoint_fails_fast_naming_the_party(pki) -> None:
    """Nobody listening is told at once, not after the call's timeout (which would say "did not answer")."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again before the call: nobody listens there
    endpoint = f"grpc+tls://127.0.0.1:{port}"
    with _agents([Echo("a")], pki) as endpoints:
        with _transport({**endpoints, "b": endpoint}, pki, timeout_s=600.0) as transport:
            with pytest.raises(PartyUnavailable,
                               match=re.escape(f"cannot reach party 'b' at {endpoint}: nothing listens "
                                               "there: is the agent running?")) as unreachable:
                transport.exchange({"a": Message("ping"), "b": Message("ping")})
    assert not isinstance(unreachable.value, ProtocolError)  # nobody misbehaved: not a refusal


def test_slow_party_times_out(pki) -> None:
    with _agents([Echo("a")], pki) as endpoints, _transport(endpoints, pki, timeout_s=0.3) as transport:
        with pytest.raises(PartyUnavailable, match=r"party 'a' at .* did not answer within 0\.3 s") as late:
            transport.exchange({"a": Message("sleep", {"s": 1.0})})
    assert not isinstance(late.value, ProtocolError)


def test_plaintext_locations_are_refused(pki) -> None:
    ca = pki["ca"]
    with pytest.raises(ProtocolError, match=r"party 'a': location must be grpc\+tls://"):
        _transport({"a": "grpc://127.0.0.1:8815"}, pki)
    with pytest.raises(ProtocolError, match=r"agent 'a': location must be grpc\+tls://"):
        AgentServer(Echo("a"), "grpc://127.0.0.1:0", tls_cert=ca / "a.pem", tls_key=ca / "a.key",
                    ca_cert=ca / "ca.pem")
