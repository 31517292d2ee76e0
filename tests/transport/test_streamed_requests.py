"""A request an agent reads part by part (issue #29): the same message, the same checks, never held whole.

A `StreamedMessage` request (its `whole` arrays in the first batch) parses to exactly the `Message` it
stands for; over Flight, a party that reads its kind part by part (`streams`) gets a `PartedMessage`
whose parts are read off the call as it asks for them, within the agent's message limit and budget.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.errors import ProtocolError
from fedcore.protocol.messages import Message, PartedMessage, StreamedMessage, streamed_request
from fedcore.protocol.parted import read_request
from fedcore.transport.flight import chunk_buffers, join_pieces
from tests.transport.test_bounded_streams import MiB, _agent, _transport, pki  # noqa: F401 (fixture)

VALUES = np.arange(100_000, dtype=np.int64) * 7
MASK = np.frombuffer(b"\x05\x07\x09", np.uint8)


class PartReader:
    """A stand-in party that reads `sum` part by part and answers the sum, the parts' sizes and its mask."""

    name = "a"

    def __init__(self, leave_some: bool = False) -> None:
        self.calls, self.sizes, self.leave_some = 0, [], leave_some

    def streams(self, kind: str) -> bool:
        return kind == "sum"

    def handle(self, message: Message) -> Message:
        self.calls += 1
        if not isinstance(message, PartedMessage):
            return Message("whole", {}, {"x": message.arrays["x"]})
        total = 0
        for part in message.parts:
            self.sizes.append(len(part))
            total += int(part.sum())
            if self.leave_some:
                break
        return Message("sum", {"total": total}, {"mask": message.arrays["mask"]})


def test_a_streamed_request_parses_to_the_message_it_stands_for() -> None:
    whole = Message("sum", {"rows": len(VALUES)}, {"x": VALUES, "mask": MASK})
    request = streamed_request("sum", {"rows": len(VALUES)}, "x", VALUES, {"mask": MASK}, 30_000)
    assert isinstance(request, StreamedMessage)
    parsed = Message.from_bytes(request.to_buffer())
    assert parsed.kind == whole.kind and parsed.header == whole.header
    assert list(parsed.arrays) == ["x", "mask"] and parsed.schema_summary() == whole.schema_summary()
    assert request.schema_summary() == whole.schema_summary()
    for name in ("x", "mask"):
        assert parsed.arrays[name].dtype == whole.arrays[name].dtype
        np.testing.assert_array_equal(parsed.arrays[name], whole.arrays[name])
    small = streamed_request("sum", {}, "x", VALUES[:10], {"mask": MASK}, 30_000)
    assert isinstance(small, Message) and small.to_bytes() == Message("sum", {}, {"x": VALUES[:10],
                                                                                  "mask": MASK}).to_bytes()


def test_a_request_is_read_part_by_part_only_for_a_kind_the_receiver_streams() -> None:
    request = streamed_request("sum", {"rows": len(VALUES)}, "x", VALUES, {"mask": MASK}, 30_000)
    payload = request.to_buffer()
    pieces = iter(chunk_buffers(payload))
    parted = read_request(pieces, lambda kind: kind == "sum", join_pieces)
    assert isinstance(parted, PartedMessage) and parted.streamed == "x" and list(parted.arrays) == ["mask"]
    parts = list(parted.parts)
    assert [len(p) for p in parts] == [30_000, 30_000, 30_000, 10_000]
    np.testing.assert_array_equal(np.concatenate(parts), VALUES)
    whole = read_request(iter(chunk_buffers(payload)), lambda kind: False, join_pieces)
    assert type(whole) is Message
    np.testing.assert_array_equal(whole.arrays["x"], VALUES)


def test_a_later_part_carrying_a_whole_array_again_is_refused() -> None:
    request = StreamedMessage("sum", {}, "x", (4,), lambda: iter([VALUES[:2], VALUES[2:4]]), {"mask": MASK})
    request.whole = {"mask": MASK}  # as sent; then a hostile sender's second batch repeats it
    pieces = list(request.pieces())
    honest = read_request(iter(pieces), lambda kind: True, join_pieces)
    assert [len(p) for p in honest.parts] == [2, 2]
    import pyarrow as pa

    from fedcore.protocol.messages import _column, _schema
    sink = pa.BufferOutputStream()
    columns = [_column("x", VALUES[:2]), _column("mask", MASK)]
    schema = _schema("sum", {}, {}, ["x", "mask"], columns)
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(pa.record_batch(columns, schema=schema))
        writer.write_batch(pa.record_batch(columns, schema=schema))
    hostile = read_request(iter([sink.getvalue()]), lambda kind: True, join_pieces)
    with pytest.raises(ProtocolError, match=r"^malformed message 'sum': arrays \['mask'\] come whole in its "
                                            r"first part only$"):
        list(hostile.parts)


def test_over_flight_the_party_reads_the_parts_as_they_arrive(pki) -> None:  # noqa: F811
    with _agent(pki) as (server, endpoint), _transport(pki, endpoint) as transport:
        server.party = PartReader()
        request = streamed_request("sum", {}, "x", np.tile(VALUES, 20), {"mask": MASK}, 1 << 18)
        reply = transport.exchange({"a": request})["a"]
        assert reply.header["total"] == int(VALUES.sum()) * 20
        np.testing.assert_array_equal(reply.arrays["mask"], MASK)
        assert server.party.sizes == [1 << 18] * 7 + [2_000_000 - 7 * (1 << 18)]
        assert server.budget.in_flight == 0
        other = transport.exchange({"a": Message("other", {}, {"x": VALUES})})["a"]  # read whole, as always
        np.testing.assert_array_equal(other.arrays["x"], VALUES)


def test_over_flight_a_streamed_request_keeps_the_message_limit_and_budget(pki) -> None:  # noqa: F811
    with _agent(pki, max_message_bytes=6 * MiB) as (server, endpoint), _transport(pki, endpoint) as transport:
        server.party = PartReader()
        request = streamed_request("sum", {}, "x", np.zeros(12 * MiB // 8, np.int64), {"mask": MASK}, 1 << 16)
        with pytest.raises(ProtocolError, match=r"agent 'a' refused the message: message of 8388608 bytes or "
                                                r"more exceeds the limit of 6291456 bytes"):
            transport.exchange({"a": request})
        assert server.budget.peak <= 6 * MiB and server.budget.in_flight == 0
        # refused while the party read it, part by part: the parts of the first 4 MiB chunk were read
        assert 0 < sum(server.party.sizes) * 8 <= 4 * MiB


def test_a_party_that_leaves_parts_unread_fails_the_call(pki) -> None:  # noqa: F811
    with _agent(pki) as (server, endpoint), _transport(pki, endpoint) as transport:
        server.party = PartReader(leave_some=True)  # (a request over 1 MiB: smaller ones go whole)
        request = streamed_request("sum", {}, "x", np.tile(VALUES, 20), {"mask": MASK}, 1 << 18)
        with pytest.raises(ProtocolError, match=r"could not answer: party 'a' could not answer 'sum': an "
                                                r"internal error \(its traceback is in that party's log\)"):
            transport.exchange({"a": request})
        assert server.budget.in_flight == 0


def test_a_request_that_stalls_mid_way_is_refused_and_the_party_freed(pki) -> None:  # noqa: F811
    """The master stops sending parts: after `stall_seconds` the party is freed and the message refused.

    The party answers the next message while the stalled call is still open; the call, once the master's side
    ends it, answers the exact refusal.
    """
    import time

    import pyarrow.flight as flight

    from fedcore.transport.flight import CHUNK_SCHEMA, chunk_batches
    from fedcore.transport.guard import envelope

    with _agent(pki, stall_seconds=0.5) as (server, endpoint), _transport(pki, endpoint) as transport:
        server.party = PartReader()
        request = streamed_request("sum", {}, "x", np.tile(VALUES, 20), {"mask": MASK}, 1 << 16)
        batches = list(chunk_batches(request.to_buffer()))
        assert len(batches) == 4  # 16 MB in chunks of 4 MiB
        transport._seq["a"] += 1
        stamp = envelope(transport.session, transport._seq["a"], transport.run)
        descriptor = flight.FlightDescriptor.for_command(stamp.encode())
        writer, reader = transport._clients["a"].do_exchange(descriptor)
        writer.begin(CHUNK_SCHEMA)
        for batch in batches[:2]:  # then the master stops sending
            writer.write_batch(batch)
        deadline = time.monotonic() + 10
        while (not server.party.sizes or server._lock.locked()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.party.calls == 1 and not server._lock.locked()
        assert 0 < sum(server.party.sizes) * 8 <= 8 * MiB  # the parts of the two chunks that came
        other = transport.exchange({"a": Message("other", {}, {"x": VALUES})})["a"]  # the party is free
        np.testing.assert_array_equal(other.arrays["x"], VALUES)
        assert server.party.calls == 2
        writer.done_writing()  # the master's side ends the call: the refusal is its answer
        with pytest.raises(flight.FlightServerError) as refused:
            reader.read_all()
        assert str(refused.value).startswith("agent 'a' refused the message: no part of the message came for "
                                             "0.5 s: its sender stopped mid-message. Detail: Failed.")
        with pytest.raises(flight.FlightServerError) as closed:  # closing the call reports its status again
            writer.close()
        assert str(closed.value) == str(refused.value)
        assert server.refused == 1 and server.budget.in_flight == 0
