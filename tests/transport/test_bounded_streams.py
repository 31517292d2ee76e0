"""Bounded cost per peer (issue #14, point 6).

An agent judges a stream's envelope before reading its body, refuses a stream at its first invalid chunk, and
keeps the bytes of all calls in progress within one budget; legitimate large messages still go through, and
every byte taken is given back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from fedcore.errors import ProtocolError
from fedcore.protocol.messages import Message
from fedcore.transport import flight as flight_module
from fedcore.transport.flight import (
    CHUNK_SCHEMA,
    AgentServer,
    FlightTransport,
    Received,
    StreamHead,
    chunk_batches,
    join_pieces,
)
from fedcore.transport.guard import Hold, InFlightBudget, Refused, SessionGuard, envelope
from fedcore.transport.tls import server_name
from tests.transport.pki import master_and_agent_ca
from tests.transport.test_refusals import Counter

MiB = 1 << 20


class WatchedBudget(InFlightBudget):
    """An InFlightBudget a test can wait on: `wait_for(predicate)` returns once the predicate holds."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.changed = threading.Condition()

    def _take(self, hold: Hold, size: int) -> None:
        try:
            super()._take(hold, size)
        finally:
            with self.changed:
                self.changed.notify_all()

    def _give_back(self, hold: Hold) -> None:
        super()._give_back(hold)
        with self.changed:
            self.changed.notify_all()

    def wait_for(self, predicate, timeout: float = 5.0) -> None:
        with self.changed:
            reached = self.changed.wait_for(lambda: predicate(self), timeout=timeout)
            assert reached, (self.in_flight, self.peak)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    return master_and_agent_ca(tmp_path_factory.mktemp("ca"))


@contextmanager
def _agent(pki: Path, **kwargs):
    server = AgentServer(Counter(), tls_cert=pki / "a.pem", tls_key=pki / "a.key",
                         ca_cert=pki / "ca.pem", **kwargs)
    try:
        yield server, f"grpc+tls://127.0.0.1:{server.port}"
    finally:
        server.shutdown()


def _transport(pki: Path, endpoint: str) -> FlightTransport:
    return FlightTransport({"a": endpoint}, tls_cert=pki / "master.pem", tls_key=pki / "master.key",
                           ca_cert=pki / "ca.pem", timeout_s=10)


def _raw_client(pki: Path, endpoint: str) -> flight.FlightClient:
    """A client with the master's certificate that can send anything, as a compromised or buggy master."""
    return flight.FlightClient(endpoint, tls_root_certs=(pki / "ca.pem").read_bytes(),
                               cert_chain=(pki / "master.pem").read_bytes(),
                               private_key=(pki / "master.key").read_bytes(),
                               override_hostname=server_name("a"))


def _pieces(payload: bytes | pa.Buffer, size: int = MiB) -> list[pa.Buffer]:
    buffer = pa.py_buffer(payload)
    return [buffer.slice(s, min(size, buffer.size - s)) for s in range(0, buffer.size, size)]


def _batch(piece: bytes | pa.Buffer) -> pa.RecordBatch:
    return next(iter(chunk_batches(piece)))


class RawStream:
    """One do_exchange of chunk batches, sent piece by piece; `refusal` is the agent's refusal, if any."""

    def __init__(self, client: flight.FlightClient, stamp: str) -> None:
        self.writer, self.reader = client.do_exchange(flight.FlightDescriptor.for_command(stamp.encode()),
                                                      options=flight.FlightCallOptions(timeout=10))
        self.refusal: str | None = None
        self.sent = 0
        self._call(self.writer.begin, CHUNK_SCHEMA)

    def _call(self, method, *args):
        if self.refusal is None:
            try:
                return method(*args)
            except flight.FlightServerError as exc:
                self.refusal = str(exc).split(". Detail:")[0]
        return None

    def send(self, pieces: Iterable[bytes | pa.Buffer]) -> RawStream:
        for piece in pieces:
            if self.refusal is not None:
                break
            self._call(self.writer.write_batch, _batch(piece))
            self.sent += 1
        return self

    def finish(self) -> Message | None:
        """Close the sending side and read the reply (None when refused)."""
        self._call(self.writer.done_writing)
        table = self._call(self.reader.read_all)
        try:
            self.writer.close()
        except flight.FlightError:
            pass  # the refusal already recorded
        if table is None:
            return None
        return Message.from_bytes(b"".join(piece.as_py() for piece in table.column("chunk")))


def _message_bytes(n_bytes: int, kind: str = "big") -> pa.Buffer:
    return Message(kind, {}, {"x": np.arange(n_bytes // 8, dtype=np.float64)}).to_buffer()


GARBAGE = np.random.default_rng(14).bytes(MiB)
LEGIT_HEAD_THEN_NO_SCHEMA = Message("x", {}, {"x": np.arange(4)}).to_bytes()


def _without_schema_message(stream: bytes) -> bytes:
    """An IPC stream with its leading schema message cut off: it begins with a record batch message."""
    length = int.from_bytes(stream[4:8], "little")
    return stream[8 + length:]


@pytest.mark.parametrize("first, reason", [
    (GARBAGE, "it does not begin with an Arrow IPC stream message"),
    (b"\xff\xff\xff\xff\x10\x00\x00\x00" + GARBAGE[:MiB - 8], "Invalid flatbuffers message"),
    (_without_schema_message(LEGIT_HEAD_THEN_NO_SCHEMA) + GARBAGE[:1000], "not the stream's schema"),
], ids=["random", "continuation-marker-then-random", "record-batch-first"])
def test_a_garbage_stream_is_refused_at_its_first_chunk(pki, first, reason) -> None:
    with _agent(pki) as (server, endpoint):
        client = _raw_client(pki, endpoint)
        stream = RawStream(client, envelope("ab" * 16, 1)).send([first] + [GARBAGE] * 40)
        assert stream.finish() is None
        client.close()
        assert stream.refusal is not None
        assert "refused the message: malformed message stream: " in stream.refusal
        assert reason in stream.refusal
        assert server.budget.peak <= len(first)  # only the first chunk was ever held, not 41 MiB
        assert server.budget.in_flight == 0 and server.party.calls == 0 and server.refused == 1


def test_an_envelope_that_would_be_refused_is_refused_before_the_body_is_read(pki) -> None:
    with _agent(pki) as (server, endpoint):
        client = _raw_client(pki, endpoint)
        first, second = _transport(pki, endpoint), _transport(pki, endpoint)
        try:
            first.exchange({"a": Message("one")})  # a session in progress
            peak = server.budget.peak
            assert 0 < peak < 4096 and server.budget.in_flight == 0
            cases = [("message/zz/1", "no valid session envelope"),
                     (envelope(first.session, 1), "replayed or reordered message: sequence 1 after 1"),
                     (envelope("cd" * 16, 3), "out-of-session message"),
                     (envelope("ef" * 16, 1), f"busy: session {first.session[:8]}"),
                     ("later", "message of an earlier session")]
            for stamp, reason in cases:
                if stamp == "later":  # the first session is over, a second one in progress
                    first.exchange({"a": Message("close")})
                    second.exchange({"a": Message("one")})
                    peak = server.budget.peak
                    stamp = envelope(first.session, 9)
                stream = RawStream(client, stamp).send([GARBAGE] * 20)
                assert stream.finish() is None
                assert stream.refusal is not None and reason in stream.refusal, (stamp, stream.refusal)
                assert server.budget.peak == peak, stamp  # not one chunk of the body was taken in
            assert server.budget.in_flight == 0 and server.refused == len(cases)
            assert second.exchange({"a": Message("two")})["a"].kind == "echo"
        finally:
            first.close()
            second.close()
            client.close()
    assert server.party.calls == 4  # one, close, one, two


def test_concurrent_streams_share_one_budget(pki) -> None:
    limit = 10 * MiB
    with _agent(pki, max_message_bytes=8 * MiB, max_bytes_in_flight=limit) as (server, endpoint):
        server.budget = budget = WatchedBudget(server.budget.limit)
        first_payload, second_payload = _message_bytes(6 * MiB, "first"), _message_bytes(6 * MiB, "second")
        first_pieces, second_pieces = _pieces(first_payload), _pieces(second_payload)
        client = _raw_client(pki, endpoint)
        try:
            first = RawStream(client, envelope("ab" * 16, 1)).send(first_pieces[:5])  # held open at 5 MiB
            budget.wait_for(lambda b: b.in_flight == 5 * MiB)
            second = RawStream(client, envelope("cd" * 16, 1)).send(second_pieces)
            assert second.finish() is None
            assert second.refusal is not None
            assert (f"refused the message: {limit} bytes already in flight across concurrent calls; limit "
                    f"{limit} (this call's next {MiB} bytes would pass it)") in second.refusal
            # the refused call gave back its 5 MiB; the first holds its own
            assert budget.in_flight == 5 * MiB
            reply = first.send(first_pieces[5:]).finish()  # the first stream goes on undisturbed
        finally:
            client.close()
        assert first.refusal is None and reply.kind == "echo"
        np.testing.assert_array_equal(reply.arrays["x"], np.arange(6 * MiB // 8, dtype=np.float64)[::-1])
        assert budget.peak == limit  # the two streams reached the limit together, and never passed it
        assert budget.in_flight == 0 and server.party.calls == 1 and server.refused == 1


@pytest.mark.parametrize("chunk_bytes, action_max, n_bytes", [(None, None, 6 * MiB), (100, 1024, 3000)],
                         ids=["4MiB-chunks", "100-byte-chunks"])
def test_a_legitimate_large_message_still_goes_through(pki, monkeypatch, chunk_bytes, action_max,
                                                       n_bytes) -> None:
    if chunk_bytes is not None:  # a schema message spread over several chunks is awaited, not refused
        monkeypatch.setattr(flight_module, "CHUNK_BYTES", chunk_bytes)
        monkeypatch.setattr(flight_module, "ACTION_MAX_BYTES", action_max)
    x = np.arange(n_bytes // 8, dtype=np.float64)
    size = Message("big", {}, {"x": x}).to_buffer().size
    assert size > flight_module.ACTION_MAX_BYTES
    with _agent(pki) as (server, endpoint), _transport(pki, endpoint) as transport:
        reply = transport.exchange({"a": Message("big", {}, {"x": x})})["a"]
        np.testing.assert_array_equal(reply.arrays["x"], x[::-1])
        assert server.budget.peak == size and server.budget.in_flight == 0
        assert transport.exchange({"a": Message("small")})["a"].kind == "echo"
        assert server.budget.in_flight == 0 and server.refused == 0


def test_oversized_or_over_budget_action_bodies_are_refused(pki) -> None:
    with _agent(pki, max_bytes_in_flight=512 << 10) as (server, endpoint):
        client = _raw_client(pki, endpoint)
        too_big = _message_bytes(2 * MiB)
        with pytest.raises(flight.FlightServerError,
                           match=rf"refused the message: a message call of {too_big.size} "
                                 r"bytes is over 1048576 bytes; the master's transport "
                                 r"streams messages that large"):
            list(client.do_action(flight.Action(envelope("ab" * 16, 1), too_big)))
        assert server.budget.peak == 0
        with pytest.raises(flight.FlightServerError,
                           match=r"refused the message: 0 bytes already in flight across "
                                 r"concurrent calls; limit 524288"):
            list(client.do_action(flight.Action(envelope("ab" * 16, 1), _message_bytes(800 << 10))))
        assert server.budget.peak == 0 and server.party.calls == 0 and server.refused == 2
        small = Message("small", {}, {"x": np.arange(10.0)}).to_buffer()
        answers = client.do_action(flight.Action(envelope("ab" * 16, 1), small))
        reply = b"".join(r.body.to_pybytes() for r in answers)
        client.close()
        assert Message.from_bytes(reply).kind == "echo"
        assert server.budget.peak == small.size and server.budget.in_flight == 0  # given back after the reply


def test_the_budget_refuses_past_its_limit_and_gives_back_on_release() -> None:
    budget = InFlightBudget(100)
    with budget.hold() as one:
        one.add(60)
        two = budget.hold()
        two.add(40)
        with pytest.raises(Refused, match=r"^100 bytes already in flight across concurrent calls; limit 100 "
                                          r"\(this call's next 1 bytes would pass it\)$"):
            two.add(1)
        assert (budget.in_flight, two.size) == (100, 40)
        two.release()
        two.release()  # only once
        assert budget.in_flight == 60
    assert (budget.in_flight, budget.peak) == (0, 100)


def test_judge_changes_nothing_and_admit_applies_the_same_rules() -> None:
    guard = SessionGuard()
    session, other = "ab" * 16, "cd" * 16
    for _ in range(2):
        verdict = guard.judge(envelope(session, 1, "run-1"))
        assert (verdict.session, verdict.seq, verdict.run, verdict.starts_session) == (session, 1, "run-1",
                                                                                       True)
    assert guard.current is None and guard.last_seq == 0
    guard.admit(envelope(session, 1, "run-1"))
    assert (guard.current, guard.current_run, guard.last_seq) == (session, "run-1", 1)
    for stamp, reason in ((envelope(session, 1), "replayed"), (envelope(other, 1), "busy"),
                          (envelope(other, 2), "out-of-session"),
                          ("message/x/1", "no valid session envelope")):
        with pytest.raises(Refused, match=reason):
            guard.judge(stamp)
        with pytest.raises(Refused, match=reason):
            guard.admit(stamp)
    assert (guard.current, guard.last_seq) == (session, 1)
    assert not guard.judge(envelope(session, 5)).starts_session
    assert guard.last_seq == 1


def test_a_stream_longer_than_the_message_limit_is_refused_mid_way_within_the_budget(pki) -> None:
    with _agent(pki, max_message_bytes=3 * MiB) as (server, endpoint), _transport(pki, endpoint) as transport:
        with pytest.raises(ProtocolError,
                           match=r"message of \d+ bytes or more exceeds the limit of 3145728 bytes"):
            transport.exchange({"a": Message("big", {}, {"x": np.zeros(6 * MiB // 8)})})
        assert server.budget.peak <= 3 * MiB and server.budget.in_flight == 0 and server.party.calls == 0


def test_received_pieces_become_one_buffer() -> None:
    data = np.random.default_rng(3).bytes(300_000)
    cuts = [0, 1, 9, 70_000, 70_001, 200_000, 300_000]  # a 1-byte first piece, then growing by doubling
    received = Received()
    for start, stop in zip(cuts, cuts[1:], strict=False):
        received.add(pa.py_buffer(data[start:stop]))
        assert bytes(received.prefix(12)) == data[:min(12, stop)]
    with pytest.raises(BufferError):  # a view still held: the buffer will not move under it
        view = received.prefix(8)
        received.add(pa.py_buffer(data))
    del view
    payload = received.payload()
    assert received.size == len(data) and payload.size == len(data) and payload.to_pybytes() == data
    single = pa.py_buffer(data)
    assert join_pieces([single]) is single and join_pieces([]) == b""  # one piece is never copied


def test_a_schema_message_spread_over_tiny_pieces_is_awaited_and_garbage_is_not() -> None:
    stream = Message("ok", {"h": "x" * 500}, {"x": np.arange(3)}).to_bytes()
    head, received = StreamHead(limit=1 << 20), Received()
    for start in range(0, len(stream), 3):
        received.add(pa.py_buffer(stream[start:start + 3]))
        head.feed(received)
    assert head.ok
    head, received = StreamHead(limit=1 << 20), Received()
    received.add(pa.py_buffer(b"\xff\xff\x00"))
    with pytest.raises(Refused,
                       match=r"does not begin with an Arrow IPC stream message \(first bytes ffff00\)"):
        head.feed(received)
    head, received = StreamHead(limit=1 << 20), Received()
    received.add(pa.py_buffer(b"\xff\xff\xff\xff" + (2 << 20).to_bytes(4, "little")))
    with pytest.raises(Refused, match="its first Arrow IPC message declares 2097152 bytes of metadata"):
        head.feed(received)  # more than the message limit: refused without waiting for it
