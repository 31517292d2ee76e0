"""In-process transport: parties are objects in this process; messages still cross as Arrow bytes.

Serialising every message keeps simulation honest: byte counts are real and nothing but Arrow crosses.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from fedcore.errors import ProtocolError
from fedcore.protocol.messages import Message
from fedcore.transport.base import Transport

Handler = Callable[[Message], Message]


class InProcessTransport(Transport):
    """Delivers messages by calling each party's `handle(message) -> message` in turn."""

    def __init__(self, handlers: dict[str, Handler], record_transcript: bool = False,
                 record_payloads: bool = False):
        """Deliver each party's messages to its handler in this process."""
        super().__init__(record_transcript=record_transcript, record_payloads=record_payloads)
        self._handlers = dict(handlers)

    @property
    def parties(self) -> list[str]:
        """The parties' names, in handler order."""
        return list(self._handlers)

    def _deliver(self, requests: dict[str, pa.Buffer]) -> dict[str, pa.Buffer]:
        replies = {}
        for party, payload in requests.items():
            if party not in self._handlers:
                raise ProtocolError(f"no party named {party!r} on this transport")
            reply = self._handlers[party](Message.from_bytes(payload))
            replies[party] = reply.to_buffer()
        return replies
