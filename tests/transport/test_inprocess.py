"""The in-process transport counts rounds and bytes per kind and records transcripts."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.errors import ProtocolError
from fedcore.protocol.messages import Message
from fedcore.transport.inprocess import InProcessTransport


def _echo(name: str):
    def handle(message: Message) -> Message:
        return Message("echo", {"who": name}, {"x": message.arrays.get("x", np.zeros(0)) * 2})
    return handle


def test_one_exchange_is_one_round_and_bytes_are_counted() -> None:
    transport = InProcessTransport({"a": _echo("a"), "b": _echo("b")}, record_payloads=True)
    request = Message("ping", {}, {"x": np.arange(100, dtype=np.float64)})
    replies = transport.exchange({"a": request, "b": request})
    assert transport.stats.rounds == 1
    assert replies["b"].header == {"who": "b"}
    np.testing.assert_array_equal(replies["a"].arrays["x"], np.arange(100) * 2.0)
    size = len(request.to_bytes())
    assert transport.stats.by_kind["ping"] == {"count": 2, "bytes": 2 * size}
    assert transport.stats.by_kind["echo"]["count"] == 2
    assert transport.stats.bytes == sum(e.size for e in transport.transcript)
    senders = [(e.sender, e.receiver, e.kind) for e in transport.transcript]
    assert senders == [("master", "a", "ping"), ("master", "b", "ping"), ("a", "master", "echo"),
                       ("b", "master", "echo")]
    assert Message.from_bytes(transport.transcript[0].payload).kind == "ping"
    assert transport.transcript[0].schema == "x:float64[100]"


def test_unknown_party_is_refused() -> None:
    transport = InProcessTransport({"a": _echo("a")})
    with pytest.raises(ProtocolError, match="no party named 'zz'"):
        transport.exchange({"zz": Message("ping")})


def test_transcript_is_off_by_default() -> None:
    transport = InProcessTransport({"a": _echo("a")})
    transport.exchange({"a": Message("ping")})
    assert transport.transcript == [] and transport.stats.messages == 2
