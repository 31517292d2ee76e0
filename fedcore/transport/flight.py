"""The real transport: institution agents served over Arrow Flight with mutual TLS.

    server = AgentServer(party, "grpc+tls://0.0.0.0:8815", tls_cert="certs/bank.pem",
                         tls_key="certs/bank.key", ca_cert="certs/ca.pem",
                         master_ca="certs/master-ca.pem")
    server.serve()                                     # at the institution, blocks until shutdown

    with FlightTransport({"bank": "grpc+tls://bank.example.org:8815", ...}, tls_cert="certs/master.pem",
                         tls_key="certs/master.key", ca_cert="certs/ca.pem") as transport:
        VerticalMaster(transport, params).fit()       # at the master

Agents present certificates from the consortium CA, and the master one from the master CA, a second
root that signs master certificates only (`fedcore.transport.tls`). An agent given the master CA
(`master_ca`, config `tls.master_ca`) verifies client certificates against it alone, so any other
certificate, another institution's included, fails the TLS handshake: gRPC reads nothing of that peer's
calls, and no Python code of the agent runs for them. Behind the handshake, an agent serves only the master
named `allowed_master`: it reads the client's identity URI from the TLS peer identity
(`ServerCallContext.peer_identity()`, the client certificate's first SAN). An agent without a master CA
verifies clients against the consortium CA, as before the master CA existed, and warns at start: every
member then passes the handshake, and is refused only by that identity check. The master addresses an
agent by its institution name (`<name>.institution.fedforest` as TLS target name) and verifies it against
the consortium CA, so an endpoint held by another member of the consortium is refused.

One protocol message is one Flight call. Requests up to ACTION_MAX_BYTES go as a `do_action` (one gRPC
message, the lowest latency); larger ones stream as `do_exchange` record batches of CHUNK_BYTES. Replies
always come back in chunks of CHUNK_BYTES (Flight results or record batches), so no single gRPC message
is ever huge, whatever the leaf-set size. A party's `StreamedMessage` reply is made part by part as Flight
sends it, the party busy (its lock held) until the last part went or the call was dropped.

Every protocol call carries the master transport's session id and a per-party sequence number in its
action type (or exchange command). The agent's `SessionGuard` (`fedcore.transport.guard`) refuses
replays, messages of a session that is over or never started, and messages over `max_message_bytes`.
It also refuses payloads that are not a well-formed message. Each refusal is logged with its reason
and returned to the caller; the agent keeps serving.

While a FlightTransport is open, a thread per party sends its agent a keep-alive every `keepalive_s`
(KEEPALIVE_SECONDS, 5 s): a `keepalive/<session>` action, with no body, no sequence number and no party
lock, accepted only from the allowed master and only for the session in progress (any other is answered
"ignored" and changes nothing). An agent presumes a session abandoned once its master has sent neither a
message nor a keep-alive for `busy_seconds` (30 s) while the agent was not answering; then another
master may start a session, and an agent started for one session stops (`fedcore.agents.serve`). A master
that dies mid-session thus frees its agents within about 30 s of their last answer, while a live one holds
them however long it works between messages.

What a peer can cost an agent is bounded before the agent pays it:

* a call's envelope is judged (`SessionGuard.judge`) before its body is parsed, and for a streamed
  message before a byte of its body is read: a stream that would be refused (no valid envelope, a
  replay, an earlier session, out of session, busy) is refused unread;
* a streamed message is refused at its first invalid chunk: a chunk of another schema, a first chunk
  that does not begin an Arrow IPC stream with its schema message (`StreamHead`: garbage is refused
  after one chunk), or the chunk that takes it past `max_message_bytes`;
* the request bytes of all calls in progress together stay within `max_bytes_in_flight` (an
  `InFlightBudget`, by default `max_message_bytes`; a smaller budget also caps the message size): each
  call takes its chunks from the budget as they arrive and gives them back when it ends, after its
  answer is sent, or on any refusal or failure; a call whose next chunk would pass the budget is
  refused at once, naming what is in flight. A `do_action` arrives whole: it counts for its size, and
  one over ACTION_MAX_BYTES is refused (the master's transport streams those);
* a streamed message costs about its own size once: its chunks are copied into one growing buffer as
  they arrive and dropped at once (`Received`), not kept all until a joined copy is made;
* a request of a kind the party reads part by part (its `streams(kind)`, such as `align` at an agent on
  Dask, issue #29) is not joined at all: the party gets a `PartedMessage` whose parts are read off the
  call as it asks for them (`fedcore.protocol.parted`), each chunk dropped once read; the message limit
  and the budget count every byte of the call, as for a joined message;
* a party reading a request part by part holds its lock while it waits for the next part: a master that
  sends nothing for `stall_seconds` (by default the session window, `busy_seconds`) mid-message has the
  message refused and the party freed at once (`_Prefetched`); the call itself ends when the master's side
  ends it (gRPC has no way to end a read from the server), holding its share of the budget until then.

Beyond the budget, an agent holds at most the one gRPC message per call that arrived and was refused
(a chunk, or a `do_action` body), and what gRPC buffers below Flight. How large that one message is,
is the sender's choice: Flight lifts gRPC's 4 MiB message limit, and pyarrow's FlightServerBase (26.0)
has no option to set one (apache/arrow#40257: no gRPC server arguments, no builder hook) nor any hook
that runs before a call's first message is read (server middleware and the handlers run after gRPC
delivered a `do_action` body, or a `do_put`/`do_exchange` first message, whole). So gRPC reads it whole
before the agent sees it, and the only place to refuse a peer unread is the TLS handshake.

Who can make an agent read such a message is therefore who passes the handshake. With a master CA, that
is only a holder of a master certificate; the remaining risk is a hostile or compromised *master*: its
`do_action` body over ACTION_MAX_BYTES (or a stream chunk of any size) is still read whole by gRPC, then
refused, and several concurrent calls each hold their own (`benchmarks/bench_oversized_body.py` measures
the agent's peak memory under both attacks; docs/benchmarks.md). Without a master CA, every consortium
member can do the same.
"""

from __future__ import annotations

import logging
import mmap
import os
import queue
import re
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from fedcore.errors import (
    CLUSTER_LOST,
    AgentRunEnded,
    CertificateRefused,
    ComputeUnavailable,
    ConfigError,
    FedForestError,
    InternalError,
    PartyUnavailable,
    ProtocolError,
    internal_error,
)
from fedcore.protocol.messages import Message, PartedMessage, StreamedMessage
from fedcore.protocol.parted import read_request
from fedcore.transport.allocator import limit_malloc_arenas
from fedcore.transport.base import Transport
from fedcore.transport.diagnose import Diagnosis, explain_connection_failure
from fedcore.transport.guard import (
    BUSY_SECONDS,
    DEFAULT_MAX_MESSAGE_BYTES,
    Hold,
    InFlightBudget,
    Refused,
    SessionGuard,
    envelope,
    keepalive_action,
    keepalive_session,
)
from fedcore.transport.tls import identity_uri, issued_by, parse_identity, read_pem, server_name

if TYPE_CHECKING:
    from fedcore.config import FederationConfig

log = logging.getLogger(__name__)

MESSAGE_ACTION = "message"
PING_ACTION = "ping"
KEEPALIVE_ACTION = "keepalive"
KEEPALIVE_SECONDS = 5.0
"""How often an open FlightTransport tells every agent its session is alive (`SessionGuard.keep_alive`); well
within BUSY_SECONDS, after which an agent presumes a silent master's session abandoned."""
ACTION_MAX_BYTES = 1 << 20
CHUNK_BYTES = 4 << 20
CHUNK_SCHEMA = pa.schema([pa.field("chunk", pa.large_binary())])
IPC_CONTINUATION = b"\xff\xff\xff\xff"
"""How every message of an Arrow IPC stream begins (followed by the little-endian int32 length of its
metadata); Arrow has written it since 0.15, and `Message.to_buffer` always does."""
UNLIMITED_MESSAGES = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
PemSource = str | os.PathLike | bytes


def chunk_buffers(payload: bytes | pa.Buffer) -> list[pa.Buffer]:
    """Zero-copy slices of at most CHUNK_BYTES (one empty slice for an empty payload)."""
    buffer = pa.py_buffer(payload)
    return [buffer.slice(s, min(CHUNK_BYTES, buffer.size - s))
            for s in range(0, max(buffer.size, 1), CHUNK_BYTES)]


def chunk_batches(payload: bytes | pa.Buffer) -> Iterable[pa.RecordBatch]:
    """The payload as one-row record batches of a large_binary column, CHUNK_BYTES each, without copying."""
    return piece_batches(chunk_buffers(payload))


def piece_batches(pieces: Iterable[pa.Buffer]) -> Iterator[pa.RecordBatch]:
    """Each piece as a one-row record batch of a large_binary column, without copying."""
    for piece in pieces:
        offsets = pa.py_buffer(np.array([0, piece.size], dtype=np.int64))
        column = pa.LargeBinaryArray.from_buffers(pa.large_binary(), 1, [None, offsets, piece])
        yield pa.record_batch([column], schema=CHUNK_SCHEMA)


def rechunked(pieces: Iterable[pa.Buffer]) -> Iterator[pa.Buffer]:
    """The pieces cut to at most CHUNK_BYTES each (zero-copy slices), empty ones dropped."""
    for piece in pieces:
        if piece.size:
            yield from chunk_buffers(piece)


class Received:
    """The pieces of one payload as they arrive, made contiguous without holding them twice.

    Parsing needs one buffer; the pieces and their joined copy are never held at the same time.

    A single piece is kept as it is. From the second on, each piece is copied into one anonymous memory
    map as it arrives and dropped at once, so its memory goes back to gRPC for the next chunk: a message
    costs about its own size, not twice. The map grows by doubling with `mremap` (no copy, and pages not
    yet written are never touched); where it cannot be resized in place, a larger one is mapped and the
    bytes copied over.
    """

    def __init__(self) -> None:
        """Nothing received yet."""
        self.size = 0
        self._first: pa.Buffer | None = None
        self._map: mmap.mmap | None = None

    def add(self, piece: pa.Buffer) -> None:
        """Append one piece (the caller may drop it afterwards)."""
        if piece.size == 0:
            return
        if self.size == 0:
            self._first, self.size = piece, piece.size
            return
        end = self.size + piece.size
        if self._map is None:
            self._map = _anonymous_map(max(end, 2 * self.size))
            assert self._first is not None, "the first piece is kept until a second one arrives"
            self._map[:self.size] = self._first
            self._first = None
        elif end > len(self._map):
            self._grow(max(end, 2 * len(self._map)))
        self._map[self.size:end] = piece
        self.size = end

    def _grow(self, capacity: int) -> None:
        assert self._map is not None, "only a map grows: add makes it at the second piece"
        try:
            self._map.resize(capacity)
        except (OSError, SystemError, ValueError):  # no mremap on this platform
            larger = _anonymous_map(capacity)
            larger[:self.size] = self._map[:self.size]
            self._map.close()
            self._map = larger

    def prefix(self, size: int) -> pa.Buffer:
        """A view of the first `size` bytes received (or all, if fewer), without copying.

        Drop it before the next `add`: the map cannot grow while a view of it exists (BufferError, never a
        stale view).
        """
        if self._map is None:
            first = self._first if self._first is not None else pa.py_buffer(b"")
            return first.slice(0, min(size, first.size))
        return pa.py_buffer(memoryview(self._map)[:min(size, self.size)])

    def payload(self) -> bytes | pa.Buffer:
        """Everything received, as one buffer (after this, `add` may not be called again).

        The memory map is unmapped once nothing refers to the buffer or to arrays parsed from it.
        """
        if self._first is not None:
            payload, self._first = self._first, None
            return payload
        if self._map is None:
            return b""
        payload, self._map = pa.py_buffer(self._map).slice(0, self.size), None
        return payload


def _anonymous_map(size: int) -> mmap.mmap:
    """Private anonymous memory of `size` bytes (private: a shared anonymous map cannot grow by `mremap`)."""
    if hasattr(mmap, "MAP_PRIVATE"):
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    return mmap.mmap(-1, size)


def join_pieces(pieces: Iterable[pa.Buffer]) -> bytes | pa.Buffer:
    """One buffer from received pieces (no copy when there is a single piece; see `Received`)."""
    received = Received()
    for piece in pieces:
        received.add(piece)
    return received.payload()


class StreamHead:
    """Checks, as a stream arrives, that it begins with an Arrow IPC schema message.

    Every protocol message does; `feed` raises `Refused` at the first chunk that shows it does not (for
    garbage, the first chunk). A schema message longer than the first chunk is awaited, up to `limit` bytes.
    """

    def __init__(self, limit: int | None = None) -> None:
        """Nothing read yet; a schema message longer than `limit` bytes is refused."""
        self.limit = limit
        self.need = 8  # the continuation marker and metadata length, then the whole schema message
        self.ok = False

    def feed(self, received: Received) -> None:
        """Check the stream received so far, once there is enough of it."""
        if self.ok or received.size < self.need:
            if not self.ok and self.need == 8:  # fewer than 8 bytes so far: check what there is
                self._check_marker(bytes(received.prefix(4)))
            return
        prefix = bytes(received.prefix(8))
        self._check_marker(prefix[:4])
        length = int.from_bytes(prefix[4:8], "little", signed=True)
        if length <= 0 or (self.limit is not None and 8 + length > self.limit):
            raise Refused(f"malformed message stream: its first Arrow IPC message declares {length} bytes of "
                          "metadata")
        self.need = 8 + length
        if received.size < self.need:
            return
        try:
            message = pa.ipc.read_message(received.prefix(received.size))
            if message.type != "schema":
                raise ValueError(f"its first Arrow IPC message is a {message.type!r}, not the "
                                 "stream's schema")
            pa.ipc.read_schema(message)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise Refused(f"malformed message stream: {_first_line(exc)}") from None
        self.ok = True

    @staticmethod
    def _check_marker(first: bytes) -> None:
        if first != IPC_CONTINUATION[:len(first)]:
            raise Refused("malformed message stream: it does not begin with an Arrow IPC stream message "
                          f"(first bytes {first.hex()})")


def read_chunks(reader, limit: int | None = None, hold: Hold | None = None,
                check_head: bool = False) -> bytes | pa.Buffer:
    """The payload carried by a Flight stream of chunk batches (the checks of `checked_pieces`)."""
    return join_pieces(checked_pieces(reader, limit, hold, check_head))


def checked_pieces(reader, limit: int | None = None, hold: Hold | None = None,
                   check_head: bool = False) -> Iterator[pa.Buffer]:
    """The pieces of a Flight stream of chunk batches, each checked as it arrives.

    Raises `Refused` as soon as a chunk shows the stream must be refused, without reading on: with `limit`,
    the chunk that passes that many bytes; with `hold` (a call's share of an agent's `InFlightBudget`), the
    chunk that would pass the budget (each chunk is added to `hold` as it arrives, before it is kept); with
    `check_head`, the first chunk that shows the stream does not begin with an Arrow IPC schema message
    (`StreamHead`). A chunk of another schema raises ValueError.
    """
    head = StreamHead(limit) if check_head else None
    start = Received()  # the stream's first bytes, until its head is checked
    size = 0
    for chunk in reader:
        if chunk.data is None:
            continue
        if chunk.data.schema != CHUNK_SCHEMA:
            raise ValueError(f"chunks must have the schema {CHUNK_SCHEMA}, got {chunk.data.schema}")
        column = chunk.data.column(0)
        for i in range(len(column)):
            piece = column[i].as_buffer()
            if piece is None or piece.size == 0:
                continue
            size += piece.size
            if limit is not None and size > limit:
                raise Refused(f"message of {size} bytes or more exceeds the limit of {limit} bytes")
            if hold is not None:
                hold.add(piece.size)
            if head is not None and not head.ok:
                start.add(piece)
                head.feed(start)
                if head.ok:
                    start = Received()
            yield piece


class AgentServer(flight.FlightServerBase):
    """Serves one party's `handle(Message) -> Message` over Flight with mutual TLS, to one master only."""

    def __init__(self, party, location: str = "grpc+tls://127.0.0.1:0", *, tls_cert: PemSource,
                 tls_key: PemSource, ca_cert: PemSource, master_ca: PemSource | None = None,
                 allowed_master: str = "master", max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 max_bytes_in_flight: int | None = None, busy_seconds: float = BUSY_SECONDS,
                 on_shutdown: Callable[[], None] | None = None, stall_seconds: float | None = None) -> None:
        """Serve `party` over mutual TLS, answering only the master identity `allowed_master`.

        With `master_ca` (the CA that signs master certificates only), a client certificate must be signed by
        it to pass the TLS handshake; without, by the consortium CA `ca_cert`, as every member's is (a
        warning says so). `busy_seconds`: how long a silent master's session keeps other masters out.
        `on_shutdown`: called once when serving stops, after the running calls (the agent's Dask cluster).
        `stall_seconds` (by default `busy_seconds`): how long the party, reading a request part by part, waits
        for its next piece before the message is refused and the party freed (`_Prefetched`).
        """
        self._on_shutdown = on_shutdown
        self.name = str(getattr(party, "name", "party"))
        _require_tls(location, f"agent {self.name!r}")
        limit_malloc_arenas()  # a long-lived, many-threaded process: keep what it frees reusable
        cert, key = read_pem(tls_cert, "agent certificate"), read_pem(tls_key, "agent key")
        ca = read_pem(ca_cert, "CA certificate")
        clients = ca if master_ca is None else read_pem(master_ca, "master CA certificate")
        super().__init__(location, tls_certificates=[(cert, key)], verify_client=True,
                         root_certificates=clients)
        self.master_ca = master_ca is not None
        """Whether only master-CA certificates pass the handshake (members' are refused unread)."""
        if not self.master_ca:
            log.warning("agent %r: no master CA (tls.master_ca), so every consortium member's certificate "
                        "passes the TLS handshake and can make this agent read a message call of any size "
                        "before it is refused; fix: `fedforest certs master-ca`, a master certificate issued "
                        "from it, and tls.master_ca in the config", self.name)
        self.party = party
        self.allowed_master = allowed_master
        self._allowed_identity = identity_uri(allowed_master, "master")
        self._lock = threading.Lock()  # a party answers one message at a time
        self.guard = SessionGuard(max_message_bytes=max_message_bytes, busy_seconds=busy_seconds)
        self.stall_seconds = busy_seconds if stall_seconds is None else stall_seconds
        self.budget = InFlightBudget(max_message_bytes if max_bytes_in_flight is None
                                     else max_bytes_in_flight)
        """The request bytes all calls in progress may hold together (`max_bytes_in_flight`, by default
        `max_message_bytes`; a message larger than it is refused too)."""
        self.refused = 0
        """Calls refused before reaching the party (wrong identity, envelope, size or payload)."""
        self.failures: dict[str, str] = {}
        """Per session (its envelope's id), the first message of the master the party refused or failed on,
        as the one line the master got (`session_failure`)."""
        self._stopped = False
        self.last_activity = time.monotonic()
        """When the master last sent a message or a keep-alive of the session in progress, or this agent last
        finished answering one."""
        self.last_contact: float | None = None
        """When the allowed master last called at all (a message, a ping, a keep-alive of any session); None
        before it ever did."""

    def idle_seconds(self) -> float:
        """Seconds since the last message or keep-alive of the session in progress (0 while answering)."""
        return 0.0 if self._lock.locked() else time.monotonic() - self.last_activity

    def silent_seconds(self) -> float | None:
        """Seconds since the allowed master last called at all, or None if it never did."""
        return None if self.last_contact is None else time.monotonic() - self.last_contact

    def session_failure(self) -> str | None:
        """The first message of the current (or last) session the party refused or failed on; None if none."""
        return self.failures.get(self.guard.current) if self.guard.current is not None else None

    def _failed(self, line: str,
                error: type[flight.FlightError] = flight.FlightServerError) -> flight.FlightError:
        """Record the party's failure in this session (the first one is kept); the error for the master."""
        self.failures.setdefault(self.guard.current or "", line)
        return error(line)

    def _check_peer(self, context: flight.ServerCallContext) -> None:
        identity = context.peer_identity().decode(errors="replace")
        if identity != self._allowed_identity:
            parsed = parse_identity(identity)
            who = f"{parsed[1]} {parsed[0]!r}" if parsed else f"an unknown identity {identity!r}"
            reason = (f"agent {self.name!r} serves only master {self.allowed_master!r}; the client at "
                      f"{context.peer()} presented the certificate of {who}")
            self._refuse(reason)
            raise flight.FlightUnauthorizedError(reason)
        self.last_contact = time.monotonic()

    def _refuse(self, reason: str) -> None:
        """One log line per refusal, with the running count.

        A flood of refusals cannot flood the log with tracebacks.
        """
        self.refused += 1
        log.warning("agent %r refused a call (%d refused so far): %s", self.name, self.refused, reason)

    def _refusal(self, reason: str) -> flight.FlightServerError:
        self._refuse(reason)
        return flight.FlightServerError(f"agent {self.name!r} refused the message: {reason}")

    def _answer(self, payload: bytes | pa.Buffer | Message, stamp: str) -> Iterator[pa.Buffer]:
        """The party's answer as pieces of at most CHUNK_BYTES.

        `payload` is the request's bytes, or the request read (a `PartedMessage`'s parts are read while the
        party handles it, and must all be).
        A `StreamedMessage` answer is made while it is sent: the party stays busy (its lock held) until the
        last piece went or the call was dropped (`_Streaming`).
        """
        kind = "?"
        self._lock.acquire()
        streaming = False
        try:
            self.last_activity = time.monotonic()
            try:
                if isinstance(payload, Message):
                    message = payload
                else:
                    self.guard.check_size(len(payload))
                    message = Message.from_bytes(payload)
                self.guard.admit(stamp)
            except (Refused, ProtocolError) as exc:
                raise self._refusal(str(exc)) from None
            kind = message.kind
            with self._failures(kind):
                reply = self.party.handle(message)
                if isinstance(message, PartedMessage) and next(message.parts, None) is not None:
                    raise internal_error(log, self.name, kind, RuntimeError("it left parts of the request "
                                                                             "unread"))
                if kind == "close":  # the master is done with this session: another may start now
                    self.guard.close()
                if isinstance(reply, StreamedMessage):
                    streaming = True
                    return _Streaming(self, kind, reply.pieces())
                return iter(chunk_buffers(reply.to_buffer()))
        finally:
            if not streaming:
                self._done_answering()

    def _done_answering(self) -> None:
        """The party answered (or failed): it is free for the next message."""
        self.last_activity = time.monotonic()
        self.guard.touch()
        self._lock.release()

    @contextmanager
    def _failures(self, kind: str) -> Iterator[None]:
        """The party's failures on `kind` as the one line the master gets (and this log keeps)."""
        try:
            yield
        except flight.FlightError:  # a refusal of the request's stream while the party read its parts
            raise
        except (InternalError, ComputeUnavailable) as exc:  # logged already: the generic line only
            raise self._unexpected(exc) from None
        except FedForestError as exc:  # a refusal or a named failure: one counted line, no traceback
            self._refuse(f"party {self.name!r} on {kind!r}: {type(exc).__name__}: {exc}")
            raise self._failed(
                f"party {self.name!r} failed on {kind!r}: {type(exc).__name__}: {exc}") from None
        except Exception as exc:  # our bug outside a dispatched handler (an agent's session message,
            # the reply's encoding), or its cluster lost: logged here, the one line to the master
            raise self._unexpected(internal_error(log, self.name, kind, exc)) from None

    def _unexpected(self, error: InternalError | ComputeUnavailable) -> flight.FlightError:
        """An unexpected failure for the master: our bug as a server error; a lost cluster as unavailable."""
        return self._failed(str(error), flight.FlightUnavailableError if isinstance(error, ComputeUnavailable)
                            else flight.FlightServerError)

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        """The actions this agent answers (for the allowed master only)."""
        self._check_peer(context)
        return [(MESSAGE_ACTION, "answer one protocol message"), (PING_ACTION, "the party's name"),
                (KEEPALIVE_ACTION, "the master of the session in progress is alive")]

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> Iterable[pa.Buffer]:
        """Answer a ping, a keep-alive, or one protocol message carried in the action body."""
        self._check_peer(context)
        if action.type == PING_ACTION:
            return [pa.py_buffer(self.name.encode())]
        if action.type.startswith(KEEPALIVE_ACTION):
            return [pa.py_buffer(self._keep_alive(action.type))]
        if not action.type.startswith(MESSAGE_ACTION):
            raise self._refusal(f"unknown action {action.type[:80]!r}")
        body = action.body if action.body is not None else pa.py_buffer(b"")
        hold = self.budget.hold()
        try:
            self.guard.judge(action.type)
            if body.size > ACTION_MAX_BYTES:
                raise Refused(f"a message call of {body.size} bytes is over {ACTION_MAX_BYTES} bytes; the "
                              "master's transport streams messages that large (do_exchange), so this call "
                              "is not from it")
            hold.add(body.size)  # it arrived whole: count it before parsing it
        except Refused as exc:
            raise self._refusal(str(exc)) from None
        try:
            reply = self._answer(body, action.type)
        except BaseException:
            hold.release()
            raise
        return _ReleasedAfterSending(reply, hold)

    def _keep_alive(self, action_type: str) -> bytes:
        """Keep the session in progress if the keep-alive names it (no party lock, no sequence number).

        Any other keep-alive changes nothing and is not a refusal (a master sends them from the moment its
        transport opens, before its session starts here): b"kept" or b"ignored".
        """
        session = keepalive_session(action_type)
        if session is None:
            raise self._refusal(f"malformed keep-alive {action_type[:80]!r}")
        if not self.guard.keep_alive(session):
            return b"ignored"
        self.last_activity = max(self.last_activity, time.monotonic())
        return b"kept"

    def do_exchange(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
                    reader: flight.MetadataRecordBatchReader,
                    writer: flight.MetadataRecordBatchWriter) -> None:
        """Answer one protocol message streamed in chunks, judging its envelope before reading the body."""
        self._check_peer(context)
        stamp = (descriptor.command or b"").decode(errors="replace")
        try:
            self.guard.judge(stamp)  # before reading a byte of the body
        except Refused as exc:
            raise self._refusal(str(exc)) from None
        with self.budget.hold() as hold:  # given back when the call ends: answered, refused or failed
            pieces = self._refusing(checked_pieces(reader, limit=self.guard.max_message_bytes, hold=hold,
                                                   check_head=True))
            streams = getattr(self.party, "streams", None)
            if streams is None:
                payload = join_pieces(pieces)
                reply = self._answer(payload, stamp)
                del payload
            else:  # a kind the party reads part by part reaches it before its parts are read (issue #29)
                prefetched = _Prefetched(pieces, self._refusal)
                try:
                    try:
                        message = read_request(prefetched, streams, join_pieces)
                    except ProtocolError as exc:
                        raise self._refusal(str(exc)) from None
                    if isinstance(message, PartedMessage):  # the party waits for parts holding its lock
                        prefetched.stall_seconds = self.stall_seconds
                    reply = self._answer(message, stamp)
                    del message
                finally:
                    prefetched.close()  # the call's reader is let go of before the call ends
            writer.begin(CHUNK_SCHEMA)
            for batch in piece_batches(reply):
                writer.write_batch(batch)

    def _refusing(self, pieces: Iterator[pa.Buffer]) -> Iterator[pa.Buffer]:
        """The checked pieces, a refusal of the stream as the one line the master gets (and a counted one)."""
        try:
            yield from pieces
        except Refused as exc:
            raise self._refusal(str(exc)) from None
        except (pa.ArrowException, ValueError, IndexError) as exc:
            raise self._refusal(f"malformed message stream: {type(exc).__name__}: "
                                f"{_first_line(exc)}") from None

    def shutdown(self) -> None:
        """Stop serving once running calls finish (safe to call more than once)."""
        if not self._stopped:
            self._stopped = True
            super().shutdown()
            if self._on_shutdown is not None:
                self._on_shutdown()


class _Prefetched:
    """A call's request pieces read by a thread of their own, so a party waiting for the next one can give up.

    A party reading a request part by part holds its lock while it waits for the next part: with
    `stall_seconds` set, a master that sends nothing for that long (it stopped mid-message) gets the message
    refused, which frees the party (issue #29). gRPC offers no way to end a read from the agent's side:
    `close` waits for the reading thread, whose read ends when the master sends again, ends or cancels the
    call, or its deadline passes; the call answers the refusal then. At most one piece waits in the queue.
    """

    def __init__(self, pieces: Iterator[pa.Buffer],
                 refusal: Callable[[str], flight.FlightServerError]) -> None:
        """Start reading `pieces`; no time limit until `stall_seconds` is set."""
        self.stall_seconds: float | None = None
        self._refusal = refusal
        self._queue: queue.Queue[tuple[str, object]] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(pieces,), daemon=True,
                                        name="fedforest-request-parts")
        self._thread.start()

    def _read(self, pieces: Iterator[pa.Buffer]) -> None:
        try:
            for piece in pieces:
                if not self._put(("piece", piece)):
                    return
            self._put(("end", None))
        except BaseException as exc:  # handed to the party's thread, which raises it
            self._put(("error", exc))

    def _put(self, item: tuple[str, object]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> _Prefetched:
        return self

    def __next__(self) -> pa.Buffer:
        try:
            what, value = self._queue.get(timeout=self.stall_seconds)
        except queue.Empty:
            raise self._refusal(f"no part of the message came for {self.stall_seconds:g} s: its sender "
                                "stopped mid-message") from None
        if what == "end":
            self._queue.put(("end", None))  # asked again, it is still the end
            raise StopIteration
        if what == "error":
            assert isinstance(value, BaseException)
            raise value
        assert isinstance(value, pa.Buffer)
        return value

    def close(self) -> None:
        """Stop reading once the read in progress returns, and wait for that (see the class doc)."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.1)  # a piece the thread waits to hand over is dropped
            except queue.Empty:
                pass
            self._thread.join(timeout=0.1)


class _ReleasedAfterSending:
    """A do_action's reply pieces, as Flight sends them.

    The call's `Hold` is released once the last is sent, or when Flight drops the call unfinished (the client
    went away).
    """

    def __init__(self, pieces: Iterable[pa.Buffer], hold: Hold) -> None:
        self._pieces = iter(pieces)
        self._hold = hold

    def __iter__(self) -> _ReleasedAfterSending:
        return self

    def __next__(self) -> pa.Buffer:
        try:
            return next(self._pieces)
        except StopIteration:
            self._hold.release()
            raise

    def __del__(self) -> None:
        self._hold.release()


class _Streaming:
    """A `StreamedMessage` answer's pieces, made as Flight sends them, with the party's lock held.

    The lock is let go once the last piece is made, when making one fails (the failure is the one line
    `_failures` makes), or when Flight drops the call unfinished (the client went away).
    """

    def __init__(self, server: AgentServer, kind: str, pieces: Iterator[pa.Buffer]) -> None:
        self._server, self._kind = server, kind
        self._pieces = rechunked(pieces)
        self._open = True

    def __iter__(self) -> _Streaming:
        return self

    def __next__(self) -> pa.Buffer:
        if not self._open:
            raise StopIteration
        try:
            with self._server._failures(self._kind):
                piece = next(self._pieces, None)
        except BaseException:
            self._finish()
            raise
        if piece is None:
            self._finish()
            raise StopIteration
        return piece

    def _finish(self) -> None:
        if self._open:
            self._open = False
            self._pieces = iter(())
            self._server._done_answering()

    def __del__(self) -> None:
        self._finish()


class FlightTransport(Transport):
    """Carries master requests to agents over Flight with mutual TLS, all parties in parallel."""

    def __init__(self, endpoints: Mapping[str, str], *, tls_cert: PemSource, tls_key: PemSource,
                 ca_cert: PemSource, timeout_s: float | None = 3600.0, verify_party_names: bool = True,
                 record_transcript: bool = False, record_payloads: bool = False,
                 run: str | None = None, keepalive_s: float | None = KEEPALIVE_SECONDS) -> None:
        """Clients for every party endpoint, over mutual TLS with the master's certificate.

        Every `keepalive_s` seconds until `close`, a background thread per party tells its agent this
        transport's session is alive (None: never, as a master that died would).
        """
        super().__init__(record_transcript=record_transcript, record_payloads=record_payloads)
        if not endpoints:
            raise ProtocolError("a FlightTransport needs at least one party endpoint")
        cert, key = read_pem(tls_cert, "master certificate"), read_pem(tls_key, "master key")
        ca = read_pem(ca_cert, "CA certificate")
        self._pem = {"cert": cert, "key": key, "ca": ca}
        self.endpoints = dict(endpoints)
        self.timeout_s = timeout_s
        self._clients: dict[str, flight.FlightClient] = {}
        for party, endpoint in self.endpoints.items():
            _require_tls(endpoint, f"party {party!r}")
            extra = {"override_hostname": server_name(party)} if verify_party_names else {}
            try:
                self._clients[party] = flight.FlightClient(endpoint, tls_root_certs=ca, cert_chain=cert,
                                                           private_key=key,
                                                           generic_options=UNLIMITED_MESSAGES, **extra)
            except (flight.FlightError, pa.ArrowException) as exc:
                raise ProtocolError(f"party {party!r}: bad endpoint {endpoint!r}: {exc}") from exc
        self._pool = ThreadPoolExecutor(max_workers=len(self.endpoints),
                                        thread_name_prefix="fedforest-flight")
        self._closed = False
        self.session = secrets.token_hex(16)
        """This transport's session id: agents refuse it once a newer session has started, and replays."""
        self.run = re.sub(r"[^A-Za-z0-9._:-]", "-", run or f"{socket.gethostname()}:{os.getpid()}")[:64]
        """The label agents name this master's session by when they refuse another as busy."""
        self._seq = dict.fromkeys(self.endpoints, 0)
        if keepalive_s is not None and not keepalive_s > 0:
            raise ProtocolError(f"keepalive_s must be a positive number of seconds or None, got "
                                f"{keepalive_s!r}")
        self.keepalive_s = keepalive_s
        self._keepalive_stop = threading.Event()
        action_type = keepalive_action(self.session)
        self._keepalive_threads = [
            threading.Thread(target=_send_keepalives, daemon=True, name=f"fedforest-keepalive-{party}",
                             args=(weakref.ref(self), party, self._clients[party], action_type, keepalive_s,
                                   self._keepalive_stop))
            for party in (self.endpoints if keepalive_s is not None else ())]
        for thread in self._keepalive_threads:
            thread.start()

    def stop_keepalives(self) -> None:
        """Stop telling the agents this session is alive (`close` does; alone, as a dead master would)."""
        self._keepalive_stop.set()
        for thread in self._keepalive_threads:
            thread.join(timeout=6.0)

    @classmethod
    def from_config(cls, config: FederationConfig, **kwargs) -> FlightTransport:
        """A transport to every institution's endpoint, with the master's certificate from the config."""
        missing = [f"tls '{k}'" for k in ("ca", "master_cert", "master_key") if k not in config.tls]
        missing += [f"an endpoint for institution {i.name!r}" for i in config.institutions if not i.endpoint]
        if missing:
            raise ConfigError(f"{config.path}: the master over Flight needs {', '.join(missing)}")
        master_ca, master_cert = config.tls.get("master_ca"), config.tls["master_cert"]
        if master_ca is not None and not issued_by(read_pem(master_cert, "master certificate"),
                                                   read_pem(master_ca, "master CA certificate")):
            raise ConfigError(f"{config.path}: tls.master_cert {master_cert} was not issued by tls.master_ca "
                              f"{master_ca}, so every agent would refuse it; issue it again with `fedforest "
                              "certs issue master --dir DIR --force` (DIR holding master-ca.pem and "
                              "master-ca.key)")
        kwargs.setdefault("timeout_s", config.training.call_timeout_s)
        kwargs.setdefault("keepalive_s", min(KEEPALIVE_SECONDS, config.training.agent_session_timeout_s / 4))
        return cls({i.name: i.endpoint for i in config.institutions}, tls_cert=config.tls["master_cert"],
                   tls_key=config.tls["master_key"], ca_cert=config.tls["ca"], **kwargs)

    @property
    def parties(self) -> list[str]:
        """The parties' names, in endpoint order."""
        return list(self.endpoints)

    def _deliver(self, requests: dict[str, pa.Buffer]) -> dict[str, bytes | pa.Buffer]:
        if self._closed:
            raise ProtocolError("this FlightTransport is closed")
        unknown = [p for p in requests if p not in self._clients]
        if unknown:
            raise ProtocolError(f"no party named {unknown[0]!r} on this transport")
        if len(requests) == 1:
            (party, payload), = requests.items()
            return {party: self._call(party, payload)}
        futures = {party: self._pool.submit(self._call, party, payload)
                   for party, payload in requests.items()}
        replies, errors = {}, []
        for party, future in futures.items():
            try:
                replies[party] = future.result()
            except (ProtocolError, PartyUnavailable) as exc:
                errors.append(exc)
        if errors:
            if len(errors) == 1:
                raise errors[0]
            kind = PartyUnavailable if all(isinstance(e, PartyUnavailable) for e in errors) else ProtocolError
            raise kind("; ".join(str(e) for e in errors)) from errors[0]
        return replies

    def _call(self, party: str, payload: bytes | pa.Buffer) -> bytes | pa.Buffer:
        """Send one request to one party and wait for its reply.

        Every failure is a ProtocolError (a refusal, a certificate) or PartyUnavailable (no answer).
        """
        client, options = self._clients[party], flight.FlightCallOptions(timeout=self.timeout_s)
        self._seq[party] += 1
        stamp = envelope(self.session, self._seq[party], self.run)
        try:
            if len(payload) <= ACTION_MAX_BYTES:
                results = client.do_action(flight.Action(stamp, pa.py_buffer(payload)), options=options)
                return join_pieces(r.body for r in results)
            return self._exchange(client, payload, options, stamp)
        except Exception as exc:
            raise self._error(party, exc) from exc

    @staticmethod
    def _exchange(client: flight.FlightClient, payload: bytes | pa.Buffer,
                  options: flight.FlightCallOptions, stamp: str) -> bytes | pa.Buffer:
        writer, reader = client.do_exchange(flight.FlightDescriptor.for_command(stamp.encode()),
                                            options=options)
        try:
            writer.begin(CHUNK_SCHEMA)
            for batch in chunk_batches(payload):
                writer.write_batch(batch)
            writer.done_writing()
            return read_chunks(reader)
        finally:
            try:
                writer.close()
            except Exception:  # the call's own error (raised above) is the one worth reporting
                pass

    def _error(self, party: str, exc: BaseException,
               diagnose: bool = True) -> ProtocolError | PartyUnavailable:
        """A ProtocolError (or PartyUnavailable) naming the party and endpoint, with Flight's first line.

        When the party cannot be reached, also why (see `fedcore.transport.diagnose`).
        """
        where = f"party {party!r} at {self.endpoints[party]}"
        reason = _first_line(exc)
        if isinstance(exc, flight.FlightTimedOutError) or "Deadline Exceeded" in reason:
            return PartyUnavailable(f"{where} did not answer within {self.timeout_s} s")
        if isinstance(exc, flight.FlightUnavailableError) and CLUSTER_LOST in reason:  # answered: its cluster
            return ComputeUnavailable(f"{where}: {reason}")
        if isinstance(exc, flight.FlightUnavailableError):
            why = self.explain_unreachable(party) if diagnose else None
            if why is None:
                return PartyUnavailable(f"cannot reach {where}: {reason}")
            return (CertificateRefused if why.certificate else PartyUnavailable)(f"cannot reach {where}: "
                                                                                 f"{why.reason}")
        if isinstance(exc, (flight.FlightUnauthorizedError, flight.FlightUnauthenticatedError)):
            return CertificateRefused(f"{where} refused this master: {reason}")
        if isinstance(exc, flight.FlightServerError):
            return ProtocolError(f"{where} could not answer: {reason}")
        return ProtocolError(f"{where}: {type(exc).__name__}: {reason}")

    def explain_unreachable(self, party: str) -> Diagnosis | None:
        """Why `party`'s agent cannot be reached (nothing listening, a certificate refused), if known."""
        return explain_connection_failure(self.endpoints[party], party=party, cert=self._pem["cert"],
                                          key=self._pem["key"], ca=self._pem["ca"])

    def ping(self, party: str, timeout_s: float = 5.0, diagnose: bool = True) -> str:
        """The name the agent at `party`'s endpoint serves (a cheap reachability and identity check)."""
        options = flight.FlightCallOptions(timeout=timeout_s)
        try:
            return b"".join(r.body for r in self._clients[party].do_action(flight.Action(PING_ACTION, b""),
                                                                          options=options)).decode()
        except Exception as exc:
            raise self._error(party, exc, diagnose=diagnose) from exc

    def wait_ready(self, timeout_s: float = 30.0, interval_s: float = 0.2,
                   gave_up: Callable[[], str | None] | None = None) -> None:
        """Block until every agent answers a ping, or raise PartyUnavailable naming those that do not.

        `gave_up`, asked between rounds, says why an agent never will (its flow run ended, or no worker picked
        it up): raised at once as AgentRunEnded, instead of waiting out the timeout.
        """
        deadline = time.monotonic() + timeout_s
        waiting = list(self.endpoints)
        while True:
            reason = gave_up() if gave_up is not None else None
            if reason:
                raise AgentRunEnded(reason)
            failures = {}
            last_try = time.monotonic() >= deadline
            for party in waiting:
                try:
                    self.ping(party, timeout_s=max(0.5, min(5.0, deadline - time.monotonic())),
                              diagnose=last_try)
                except (ProtocolError, PartyUnavailable) as exc:
                    failures[party] = exc
            waiting = list(failures)
            if not waiting:
                return
            if last_try:
                refused = any(isinstance(e, CertificateRefused) for e in failures.values())
                raise (CertificateRefused if refused else PartyUnavailable)(
                    f"agents not ready after {timeout_s} s: " + "; ".join(str(e) for e in failures.values()))
            time.sleep(interval_s)

    def close(self) -> None:
        """Stop the keep-alives; close every client connection and the worker threads."""
        if self._closed:
            return
        self._closed = True
        self.stop_keepalives()
        self._pool.shutdown(wait=True)
        for client in self._clients.values():
            client.close()

    def __enter__(self) -> FlightTransport:
        """The transport itself, closed on exit."""
        return self

    def __exit__(self, *exc_info) -> None:
        """Close every client."""
        self.close()


def _send_keepalives(transport: weakref.ref, party: str, client: flight.FlightClient, action_type: str,
                     every_s: float, stop: threading.Event) -> None:
    """Tell `party`'s agent the transport's session is alive every `every_s` seconds until `stop` is set.

    A keep-alive takes no party lock and no sequence number; one that fails (the agent is not up yet, or
    gone) is not retried: the next one comes `every_s` later. Each party has its own thread, so an agent
    that does not answer cannot delay the others'. The thread holds the transport only weakly: one that
    was dropped without `close` stops sending too, so its sessions are released as a dead master's.
    """
    action = flight.Action(action_type, b"")
    options = flight.FlightCallOptions(timeout=min(every_s, 5.0))
    while not stop.wait(every_s) and transport() is not None:
        try:
            for _ in client.do_action(action, options=options):
                pass
        except Exception as exc:  # best effort: the protocol calls report an unreachable agent
            log.debug("keep-alive to party %r failed: %s", party, _first_line(exc))


def _require_tls(location: str, who: str) -> None:
    """Refuse a location without TLS: Flight would silently ignore the certificates of a grpc:// one."""
    if not str(location).startswith("grpc+tls://"):
        raise ProtocolError(f"{who}: location must be grpc+tls://HOST:PORT (mutual TLS), got {location!r}")


def _first_line(exc: BaseException) -> str:
    """Flight's message without the gRPC debug context and Python traceback it appends."""
    text = str(exc)
    for marker in (". Detail:", ". gRPC client debug context:", "\n"):
        text = text.split(marker)[0]
    return re.sub(r"^Flight returned [\w ]+ error, with message: ", "", text).strip()
