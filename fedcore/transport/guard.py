"""What an agent refuses before a message reaches its party.

Messages of a session that is over or never started here, replayed messages, messages over the size limit, and
calls that would take the agent's bytes in flight over its budget.

The master's transport stamps every protocol call with its session id (random, fresh per transport), a
per-party sequence number starting at 1, and the label of the master process that runs it. An agent
accepts a new session only at sequence 1, never a session it has seen before, and within a session only
increasing sequence numbers. While a session is in progress, a second master's session is refused as
busy, naming the one in progress: two runs on one federation must not interleave. Mutual TLS already
keeps out everyone but the master; this guard stops a recorded call from being played again, a stale
master process from talking into a newer session, and a second master from taking over a session in
progress.

A session is in progress until its master closes it (`close`) or abandons it: while the transport that
runs it is open, the master sends every agent a keep-alive (`keep_alive`, carrying the session id, no
sequence number, no party lock) every few seconds, so a session whose master has sent neither a message
nor a keep-alive for `busy_seconds` (BUSY_SECONDS, 30 s) is presumed abandoned (its master died) and a
new master may start one. The window counts only while the agent is idle: while its party answers a
message, the session is in progress however long the answer takes. A keep-alive counts only for the
session in progress here; one of any other session (earlier, never started, closed) changes nothing.
So a master that dies mid-session holds its agents for `busy_seconds` after their last answer, not ten
minutes, and a live master holds them however long it works between two messages.

The rules are written once, in `SessionGuard.judge`, which changes nothing: the agent judges a stream's
envelope before it reads a byte of its body (and an action's before parsing the body gRPC delivered
whole), and `admit` judges again and commits the session state only when the parsed message is passed
on to the party.

What a peer can make an agent hold is bounded twice: one message by `SessionGuard.max_message_bytes`
(checked as it streams in), and all calls together by an `InFlightBudget`. Every receiving call takes
its bytes from the budget as they arrive (`InFlightBudget.hold`) and gives them back when the call ends;
a call whose next bytes would pass the limit is refused at once. So however many calls are open at the
same time, the request bytes an agent holds stay within the budget, plus at most the one gRPC message
per call (a chunk, or an action's body) that arrived but was refused, and what gRPC buffers below
Flight (see `fedcore.transport.flight`).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

ENVELOPE = re.compile(r"^message/(?P<session>[0-9a-f]{16,64})/(?P<seq>[1-9][0-9]{0,18})"
                      r"(?:/(?P<run>[A-Za-z0-9._:-]{1,64}))?$")
KEEPALIVE = re.compile(r"^keepalive/(?P<session>[0-9a-f]{16,64})$")
BUSY_SECONDS = 30.0
"""A session whose master has sent neither a message nor a keep-alive for this long, while its agent was
not answering, is presumed abandoned (its master died): a new master may start one. A live master's
transport sends a keep-alive every few seconds (`fedcore.transport.flight.KEEPALIVE_SECONDS`), so this
only has to cover a keep-alive delayed by a busy network or machine, not the master's own work."""
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30
"""1 GiB: far above any protocol message of a 1M-row session, far below what would exhaust memory."""


class Refused(Exception):
    """A message the agent will not pass to its party; the text is the logged reason."""


def envelope(session: str, seq: int, run: str | None = None) -> str:
    """The Flight action type (or exchange command) that carries a message of `session` at `seq`.

    `run` labels the master process that sent it.
    """
    return f"message/{session}/{seq}" + (f"/{run}" if run else "")


def keepalive_action(session: str) -> str:
    """The Flight action type of a keep-alive for `session` (no sequence number: it is not a message)."""
    return f"keepalive/{session}"


def keepalive_session(action_type: str) -> str | None:
    """The session a keep-alive action names, or None when `action_type` is not a well-formed one."""
    match = KEEPALIVE.match(action_type)
    return match["session"] if match else None


@dataclass(frozen=True)
class Verdict:
    """An envelope the guard would admit now.

    Its session, sequence number and run label, and whether it starts a new session.
    """

    session: str
    seq: int
    run: str
    starts_session: bool


@dataclass
class SessionGuard:
    """One agent's view of the master's sessions.

    The current one, its last sequence number, when its master was last heard from, whether the agent is
    answering one of its messages, and every session seen before (which stay closed). Safe to use from
    concurrent calls.
    """

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    busy_seconds: float = BUSY_SECONDS
    current: str | None = None
    current_run: str = "unknown"
    last_seq: int = 0
    last_time: float = 0.0
    closed: bool = False
    answering: int = 0
    """Messages admitted and not yet answered (`admit` to `touch`): the session is in progress meanwhile."""
    seen: set[str] = field(default_factory=set)
    clock: Callable[[], float] = time.monotonic
    """Seconds on a monotonic clock (a test steps its own instead of sleeping)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def close(self) -> None:
        """The current session's master said it is done: a new session may start at once."""
        with self._lock:
            self.closed = True

    def touch(self) -> None:
        """The agent just finished answering a message `admit` let in.

        The session was active until now, not only until the message arrived (a long answer must not make the
        session look idle).
        """
        with self._lock:
            self.answering = max(0, self.answering - 1)
            self.last_time = self.clock()

    def keep_alive(self, session: str) -> bool:
        """A keep-alive from the master of `session`: whether it kept the session in progress here.

        Only the session in progress (started here, not closed) is kept; for any other it changes nothing.
        """
        with self._lock:
            if session != self.current or self.closed:
                return False
            self.last_time = self.clock()
            return True

    def in_session(self) -> bool:
        """Whether a session has started here and its master has not closed it (abandoned or not)."""
        with self._lock:
            return self.current is not None and not self.closed

    def abandoned(self) -> bool:
        """Whether the session in progress is presumed abandoned: its master silent for `busy_seconds`."""
        with self._lock:
            return (self.current is not None and not self.closed and not self.answering
                    and self.clock() - self.last_time >= self.busy_seconds)

    def check_size(self, size: int) -> None:
        """Refuse a message above the limit (checked while it streams in, before it is parsed)."""
        if size > self.max_message_bytes:
            raise Refused(f"message of {size} bytes or more exceeds the limit of {self.max_message_bytes} "
                          "bytes")

    def judge(self, stamp: str) -> Verdict:
        """Whether the envelope `stamp` would be admitted now, changing nothing.

        Its verdict, or Refused saying why. The agent calls it before reading a call's body.
        """
        with self._lock:
            return self._judge(stamp, self.clock())

    def admit(self, stamp: str) -> None:
        """Accept the envelope `stamp` or raise Refused saying why (the rules of `judge`).

        On success it becomes the latest seen, and its message is being answered until `touch`.
        """
        with self._lock:
            now = self.clock()
            verdict = self._judge(stamp, now)
            if verdict.starts_session:
                if self.current is not None:
                    self.seen.add(self.current)
                self.current, self.current_run, self.closed = verdict.session, verdict.run, False
            self.last_seq, self.last_time = verdict.seq, now
            self.answering += 1

    def _judge(self, stamp: str, now: float) -> Verdict:
        match = ENVELOPE.match(stamp)
        if match is None:
            raise Refused(f"no valid session envelope (got {stamp[:80]!r}); only the master's transport may "
                          "call")
        session, seq, run = match["session"], int(match["seq"]), match["run"] or "unknown"
        if session == self.current:
            if seq <= self.last_seq:
                raise Refused(f"replayed or reordered message: sequence {seq} after {self.last_seq} in this "
                              "session")
            return Verdict(session, seq, run, starts_session=False)
        if session in self.seen:
            raise Refused(f"message of an earlier session {session[:8]}..., which is over")
        if seq != 1:
            raise Refused(f"out-of-session message: session {session[:8]}... never started here (sequence "
                          f"{seq})")
        idle = now - self.last_time
        if self.current is not None and not self.closed and (self.answering or idle < self.busy_seconds):
            heard = ("this agent is answering one of its messages" if self.answering
                     else f"its master was last heard from {idle:.0f} s ago")
            raise Refused(f"busy: session {self.current[:8]}... of run {self.current_run} is in progress "
                          f"({heard}); another master may start a session once it closes or its master has "
                          f"sent nothing (no message, no keep-alive) for {self.busy_seconds:g} s")
        return Verdict(session, seq, run, starts_session=True)


class InFlightBudget:
    """The request bytes an agent holds across all its calls at once, and their limit.

    Each receiving call takes a `hold`, adds its bytes to it as they arrive (refused with `Refused` when
    they would pass the limit) and releases it when the call ends. `peak` is the most ever held at once.
    """

    def __init__(self, limit: int) -> None:
        """A budget of `limit` bytes held at once by all calls."""
        if limit <= 0:
            raise ValueError(f"the bytes in flight limit must be positive, got {limit}")
        self.limit = int(limit)
        self.in_flight = 0
        """Bytes held right now by calls in progress."""
        self.peak = 0
        """The most bytes ever held at once (never above `limit`)."""
        self._lock = threading.Lock()

    def hold(self) -> Hold:
        """A new call's share of the budget, empty until it adds bytes."""
        return Hold(self)

    def _take(self, hold: Hold, size: int) -> None:
        with self._lock:
            if self.in_flight + size > self.limit:
                raise Refused(f"{self.in_flight} bytes already in flight across concurrent calls; limit "
                              f"{self.limit} (this call's next {size} bytes would pass it)")
            self.in_flight += size
            self.peak = max(self.peak, self.in_flight)
            hold.size += size

    def _give_back(self, hold: Hold) -> None:
        with self._lock:
            self.in_flight -= hold.size
            hold.size = 0


class Hold:
    """The bytes one call holds from an `InFlightBudget`.

    `release` gives them all back (only once, however often called). As a context manager, released on exit.
    """

    def __init__(self, budget: InFlightBudget) -> None:
        """Nothing held yet from `budget`."""
        self.budget = budget
        self.size = 0

    def add(self, size: int) -> None:
        """Take `size` more bytes for this call.

        Raises Refused (holding nothing more) if the budget is spent.
        """
        self.budget._take(self, size)

    def release(self) -> None:
        """Give back every byte this call holds."""
        self.budget._give_back(self)

    def __enter__(self) -> Hold:
        """The hold itself, released on exit."""
        return self

    def __exit__(self, *exc_info) -> None:
        """Give back everything held."""
        self.release()
