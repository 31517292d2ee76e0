"""The transport interface between the master and its parties, with round/byte accounting and transcripts.

The master talks to parties only through `Transport.exchange`: one call is one round trip, carrying one
request to each addressed party and bringing back its reply. Implementations (in-process now, Arrow Flight
later) share the accounting and transcript recording defined here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from fedcore.protocol.messages import Message, StreamedMessage

MASTER = "master"


@dataclass
class TranscriptEntry:
    """One message as it crossed: who sent it to whom, its kind, size, array schema and optionally bytes."""

    round: int
    sender: str
    receiver: str
    kind: str
    size: int
    schema: str
    payload: bytes | None = None


def _kind_counter() -> dict[str, int]:
    """A message kind's counters before its first message (module level, so the stats pickle)."""
    return {"count": 0, "bytes": 0}


def _by_kind() -> defaultdict[str, dict[str, int]]:
    """Counters per message kind, created at a kind's first message."""
    return defaultdict(_kind_counter)


@dataclass
class CommunicationStats:
    """Rounds and bytes, in total and per message kind (plain data: it pickles with a fitted estimator)."""

    rounds: int = 0
    bytes: int = 0
    messages: int = 0
    by_kind: dict[str, dict[str, int]] = field(default_factory=_by_kind)

    def add(self, kind: str, size: int) -> None:
        """Count one message of `kind` with `size` bytes."""
        self.bytes += size
        self.messages += 1
        self.by_kind[kind]["count"] += 1
        self.by_kind[kind]["bytes"] += size

    def to_dict(self) -> dict:
        """A JSON-ready summary."""
        return {
            "rounds": self.rounds,
            "bytes": self.bytes,
            "messages": self.messages,
            "by_kind": {k: dict(v) for k, v in sorted(self.by_kind.items())},
        }


class Transport(ABC):
    """Carries master requests to named parties and their replies back, counting everything."""

    def __init__(self, record_transcript: bool = False, record_payloads: bool = False) -> None:
        """Count traffic; with `record_transcript` (or `record_payloads`) also record each message."""
        self.stats = CommunicationStats()
        self.record_transcript = record_transcript or record_payloads
        self.record_payloads = record_payloads
        self.transcript: list[TranscriptEntry] = []

    @property
    @abstractmethod
    def parties(self) -> list[str]:
        """Names of the parties reachable through this transport."""

    def exchange(self, requests: Mapping[str, Message | StreamedMessage]) -> dict[str, Message]:
        """One round trip: send each party its request, return each party's reply.

        A `StreamedMessage` request is encoded as its parts (a receiver may read it part by part).
        """
        self.stats.rounds += 1
        encoded: dict[str, pa.Buffer] = {}
        by_message: dict[int, pa.Buffer] = {}  # by id(message)
        for party, message in requests.items():
            # a message broadcast to several parties (the same object) is serialised once
            payload = by_message.get(id(message))
            if payload is None:
                payload = by_message[id(message)] = message.to_buffer()
            self._account(MASTER, party, message, payload)
            encoded[party] = payload
        raw_replies = self._deliver(encoded)
        replies = {}
        for party, payload in raw_replies.items():
            reply = Message.from_bytes(payload)
            self._account(party, MASTER, reply, payload)
            replies[party] = reply
        return replies

    @abstractmethod
    def _deliver(self, requests: dict[str, pa.Buffer]) -> dict[str, bytes | pa.Buffer]:
        """Carry encoded requests to parties and return their encoded replies (bytes-like)."""

    def close(self) -> None:  # noqa: B027 - optional: a transport that holds nothing has nothing to close
        """Let go of what carrying the messages holds (threads, connections); nothing by default."""

    def _account(self, sender: str, receiver: str, message: Message | StreamedMessage,
                 payload: bytes | pa.Buffer) -> None:
        self.stats.add(message.kind, len(payload))
        if self.record_transcript:
            self.transcript.append(
                TranscriptEntry(
                    round=self.stats.rounds,
                    sender=sender,
                    receiver=receiver,
                    kind=message.kind,
                    size=len(payload),
                    schema=message.schema_summary(),
                    payload=bytes(payload) if self.record_payloads else None,
                )
            )
