"""What an agent refuses before a message reaches its party: messages of a session that is over or never
started here, replayed messages, and messages over the size limit.

The master's transport stamps every protocol call with its session id (random, fresh per transport) and
a per-party sequence number starting at 1. An agent accepts a new session only at sequence 1, never a
session it has seen before, and within a session only increasing sequence numbers. Mutual TLS already
keeps out everyone but the master; this guard stops a recorded call from being played again, and a
stale master process from talking into a newer session.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ENVELOPE = re.compile(r"^message/(?P<session>[0-9a-f]{16,64})/(?P<seq>[1-9][0-9]{0,18})$")
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30
"""1 GiB: far above any protocol message of a 1M-row session, far below what would exhaust memory."""


class Refused(Exception):
    """A message the agent will not pass to its party; the text is the logged reason."""


def envelope(session: str, seq: int) -> str:
    """The Flight action type (or exchange command) that carries a message of `session` at `seq`."""
    return f"message/{session}/{seq}"


@dataclass
class SessionGuard:
    """One agent's view of the master's sessions: the current one, its last sequence number, and every
    session seen before (which stay closed)."""

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    current: str | None = None
    last_seq: int = 0
    seen: set[str] = field(default_factory=set)

    def check_size(self, size: int) -> None:
        """Refuse a message above the limit (checked while it streams in, before it is parsed)."""
        if size > self.max_message_bytes:
            raise Refused(f"message of {size} bytes or more exceeds the limit of {self.max_message_bytes} bytes")

    def admit(self, stamp: str) -> None:
        """Accept the envelope `stamp` or raise Refused saying why; on success it becomes the latest seen."""
        match = ENVELOPE.match(stamp)
        if match is None:
            raise Refused(f"no valid session envelope (got {stamp[:80]!r}); only the master's transport may call")
        session, seq = match["session"], int(match["seq"])
        if session == self.current:
            if seq <= self.last_seq:
                raise Refused(f"replayed or reordered message: sequence {seq} after {self.last_seq} in this session")
            self.last_seq = seq
            return
        if session in self.seen:
            raise Refused(f"message of an earlier session {session[:8]}..., which is over")
        if seq != 1:
            raise Refused(f"out-of-session message: session {session[:8]}... never started here (sequence {seq})")
        if self.current is not None:
            self.seen.add(self.current)
        self.current, self.last_seq = session, 1
