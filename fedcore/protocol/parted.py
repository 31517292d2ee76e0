"""Reading a request batch by batch as it arrives, so a receiver never holds its large array (issue #29).

A `StreamedMessage` request crosses as several single-row batches of one Arrow IPC stream. `read_request`
reads its schema and first batch; when the receiver reads that kind part by part (`streamable`), it gets a
`PartedMessage` whose parts are read off the stream only as it asks for them; otherwise the rest is read
and the message parsed whole (`Message.from_bytes`), exactly as a request read whole always was.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa

from fedcore.errors import ProtocolError
from fedcore.protocol.messages import _HEADER_KEY, _KIND_KEY, _SHAPES_KEY, Message, PartedMessage


class _PieceFile(io.RawIOBase):
    """The pieces of a stream as a readable file; every piece it took is also handed to `keep`, if set.

    An exception the pieces raise (a refusal of the stream) ends the file and is kept in `error`, for the
    reader to raise in place of Arrow's own error about the stream cut short.
    """

    def __init__(self, pieces: Iterator[pa.Buffer]) -> None:
        super().__init__()
        self._pieces = pieces
        self._current = memoryview(b"")
        self.keep: Callable[[pa.Buffer], None] | None = None
        self.error: BaseException | None = None

    def readable(self) -> bool:
        """It is."""
        return True

    def readinto(self, buffer) -> int:
        """Fill `buffer` from the pieces, as far as they go (short only at the end of the stream)."""
        view, filled = memoryview(buffer).cast("B"), 0
        while filled < len(view):
            if not len(self._current) and not self._next():
                break
            size = min(len(view) - filled, len(self._current))
            view[filled:filled + size] = self._current[:size]
            self._current = self._current[size:]
            filled += size
        return filled

    def _next(self) -> bool:
        if self.error is not None:
            return False
        try:
            piece = next(self._pieces, None)
        except Exception as exc:  # raised by the reader instead of Arrow's "stream cut short"
            self.error = exc
            return False
        if piece is None:
            return False
        if self.keep is not None:
            self.keep(piece)
        self._current = memoryview(piece).cast("B")
        return True

    def upcoming(self) -> Iterator[pa.Buffer]:
        """The pieces not taken yet (those taken went to `keep` whole)."""
        return self._pieces


def read_request(pieces: Iterator[pa.Buffer], streamable: Callable[[str], bool],
                 join: Callable[[Iterator[pa.Buffer]], bytes | pa.Buffer]) -> Message:
    """The request the `pieces` carry: a `PartedMessage` for a kind the receiver reads part by part.

    `join` makes one buffer of pieces (the transport's `Received`). A malformed stream raises ProtocolError
    (while its parts are read, too).
    """
    taken: list[pa.Buffer] = []
    source = _PieceFile(pieces)
    source.keep = taken.append
    try:
        reader = pa.ipc.open_stream(source)
        metadata = reader.schema.metadata or {}
        kind = metadata[_KIND_KEY].decode()
        header = json.loads(metadata[_HEADER_KEY])
        shapes = json.loads(metadata.get(_SHAPES_KEY, b"{}"))
    except (pa.ArrowException, OSError, KeyError, ValueError, UnicodeDecodeError):
        if source.error is not None:
            raise source.error from None
        source.keep = None
        return Message.from_bytes(join(iter([*taken, *source.upcoming()])))  # its own error, as read whole
    if not streamable(kind) or not reader.schema.names or not isinstance(header, dict) \
            or not isinstance(shapes, dict):
        source.keep = None  # read the rest whole and parse it as always: the very same message
        return Message.from_bytes(join(iter([*taken, *source.upcoming()])))
    source.keep = None
    del taken
    return _parted(reader, source, kind, header, shapes)


def _parted(reader: pa.RecordBatchStreamReader, source: _PieceFile, kind: str, header: dict,
            shapes: dict) -> PartedMessage:
    """The first batch's whole arrays, and the first column's parts read batch by batch."""
    names = reader.schema.names
    streamed, others = names[0], names[1:]
    first = _next_batch(reader, source, kind)
    if first is None:
        raise ProtocolError(f"malformed message {kind!r}: its stream holds no batch")
    whole = {n: _values(first, i + 1, n, shapes) for i, n in enumerate(others)}

    def parts() -> Iterator[np.ndarray]:
        batch: pa.RecordBatch | None = first
        while batch is not None:
            if batch is not first and any(len(batch.column(i + 1).values) for i in range(len(others))):
                raise ProtocolError(f"malformed message {kind!r}: arrays {others} come whole in its first "
                                    "part only")
            yield _values(batch, 0, streamed, shapes, part=True)
            batch = _next_batch(reader, source, kind)

    return PartedMessage(kind, header, whole, streamed, parts())


def _next_batch(reader: pa.RecordBatchStreamReader, source: _PieceFile, kind: str) -> pa.RecordBatch | None:
    """The stream's next batch (one row), None at its end; anything else is ProtocolError."""
    try:
        batch = reader.read_next_batch()
    except StopIteration:
        batch = None
    except (pa.ArrowException, OSError, ValueError) as exc:
        if source.error is not None:
            raise source.error from None
        raise ProtocolError(f"malformed message {kind!r}: {exc}") from None
    if source.error is not None:  # the stream was refused where Arrow saw its end
        raise source.error
    if batch is None:
        return None
    if batch.num_rows != 1:
        raise ProtocolError(f"malformed message: expected one row a batch, found [{batch.num_rows}]")
    return batch


def _values(batch: pa.RecordBatch, i: int, name: str, shapes: dict,
            part: bool = False) -> np.ndarray:
    """Column `i` of a one-row batch as NumPy, shaped as `shapes` says (a part: its rows, any number)."""
    try:
        values = batch.column(i).values.to_numpy(zero_copy_only=False)
        if name in shapes:
            shape = list(shapes[name])
            values = values.reshape([-1, *shape[1:]] if part else shape)
    except (AttributeError, TypeError, ValueError, OSError, pa.ArrowException) as exc:
        raise ProtocolError(f"malformed message: array {name!r}: {exc}") from None
    return values
