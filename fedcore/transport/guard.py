"""What an agent refuses before a message reaches its party: messages of a session that is over or never
started here, replayed messages, and messages over the size limit.

The master's transport stamps every protocol call with its session id (random, fresh per transport), a
per-party sequence number starting at 1, and the label of the master process that runs it. An agent
accepts a new session only at sequence 1, never a session it has seen before, and within a session only
increasing sequence numbers. While a session is in progress (not closed by its master's `close`, and
not idle for `busy_seconds`), a second master's session is refused as busy, naming the one in progress:
two runs on one federation must not interleave. Mutual TLS already keeps out everyone but the master;
this guard stops a recorded call from being played again, a stale master process from talking into a
newer session, and a second master from taking over a session in progress.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

ENVELOPE = re.compile(r"^message/(?P<session>[0-9a-f]{16,64})/(?P<seq>[1-9][0-9]{0,18})"
                      r"(?:/(?P<run>[A-Za-z0-9._:-]{1,64}))?$")
BUSY_SECONDS = 600.0
"""A session whose agent has neither received nor answered anything for this long is presumed abandoned
(its master died): a new master may start one. Long enough for a master's own work between two levels."""
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30
"""1 GiB: far above any protocol message of a 1M-row session, far below what would exhaust memory."""


class Refused(Exception):
    """A message the agent will not pass to its party; the text is the logged reason."""


def envelope(session: str, seq: int, run: str | None = None) -> str:
    """The Flight action type (or exchange command) that carries a message of `session` at `seq`, sent by
    the master process labelled `run`."""
    return f"message/{session}/{seq}" + (f"/{run}" if run else "")


@dataclass
class SessionGuard:
    """One agent's view of the master's sessions: the current one, its last sequence number, and every
    session seen before (which stay closed)."""

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    busy_seconds: float = BUSY_SECONDS
    current: str | None = None
    current_run: str = "unknown"
    last_seq: int = 0
    last_time: float = 0.0
    closed: bool = False
    seen: set[str] = field(default_factory=set)

    def close(self) -> None:
        """The current session's master said it is done: a new session may start at once."""
        self.closed = True

    def touch(self) -> None:
        """The agent just finished answering: the session was active until now, not only until the
        message arrived (a long answer must not make the session look idle)."""
        self.last_time = time.monotonic()

    def check_size(self, size: int) -> None:
        """Refuse a message above the limit (checked while it streams in, before it is parsed)."""
        if size > self.max_message_bytes:
            raise Refused(f"message of {size} bytes or more exceeds the limit of {self.max_message_bytes} bytes")

    def admit(self, stamp: str) -> None:
        """Accept the envelope `stamp` or raise Refused saying why; on success it becomes the latest seen."""
        match = ENVELOPE.match(stamp)
        if match is None:
            raise Refused(f"no valid session envelope (got {stamp[:80]!r}); only the master's transport may call")
        session, seq, now = match["session"], int(match["seq"]), time.monotonic()
        if session == self.current:
            if seq <= self.last_seq:
                raise Refused(f"replayed or reordered message: sequence {seq} after {self.last_seq} in this session")
            self.last_seq, self.last_time = seq, now
            return
        if session in self.seen:
            raise Refused(f"message of an earlier session {session[:8]}..., which is over")
        if seq != 1:
            raise Refused(f"out-of-session message: session {session[:8]}... never started here (sequence {seq})")
        idle = now - self.last_time
        if self.current is not None and not self.closed and idle < self.busy_seconds:
            raise Refused(f"busy: session {self.current[:8]}... of run {self.current_run} is in progress (its last "
                          f"message {idle:.0f} s ago); another master may start a session once it closes or has been "
                          f"idle for {self.busy_seconds:g} s")
        if self.current is not None:
            self.seen.add(self.current)
        self.current, self.current_run, self.last_seq, self.last_time = session, match["run"] or "unknown", 1, now
        self.closed = False
