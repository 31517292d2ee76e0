"""The one message type that crosses between master and parties.

A kind, a small JSON header and named NumPy arrays, carried as a single-row Arrow record batch (IPC stream
bytes). A `StreamedMessage` carries one large array as several such batches, made one at a time while they
are sent (an agent's answer of every row's value, issue #29); parsed, it is the same `Message`.

Every array travels as an Arrow large-list column, so messages of any shape share one encoding and the
transport can count, record and check every byte that crosses.
"""

from __future__ import annotations

import builtins
import functools
import json
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pyarrow as pa

from fedcore.errors import MalformedMessage, ProtocolError

_KIND_KEY = b"fedforest.kind"
_HEADER_KEY = b"fedforest.header"
_SHAPES_KEY = b"fedforest.shapes"
_WRITE_OPTIONS = pa.ipc.IpcWriteOptions()
"""Arrow's default IPC options, made once (each writer would read two environment variables to make them)."""
_READ_OPTIONS = pa.ipc.IpcReadOptions()
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
"""An IPC stream's end marker (continuation, zero length), as the stream writer closes it."""
_JOINED_BYTES = 1 << 20
"""A message of at most this many array bytes is encoded as its schema's and batch's own IPC messages joined
(the stream writer's bytes: 14 us instead of 47 for a 44 KB find_splits message, and a level sends many);
a larger one is written once into a buffer of its measured size (joining would copy its arrays twice)."""


_KINDS = {"int": (int,), "number": (int, float), "text": (str,), "flag": (bool,)}
_EMPTY_JSON = b"{}"


def _json_object(text: bytes) -> Any:
    """A metadata field's JSON; the empty object without the parser (most replies' header, most shapes)."""
    return {} if text == _EMPTY_JSON else json.loads(text)


class Header(dict[str, Any]):
    """A message's JSON header, read through typed readers: a bad field is the sender's fault.

    A missing field, or one of the wrong type or out of range, raises MalformedMessage naming the field (never
    quoting its value), so the dispatcher can refuse it; any other exception in a handler is our own bug.
    """

    def __missing__(self, name: str) -> Any:
        """A field the message lacks is the sender's fault."""
        raise MalformedMessage(f"header field {name!r} is missing")

    def int(self, name: str, low: float | None = None, high: float | None = None) -> int:
        """Field `name` as an integer (not a bool) in [low, high]."""
        return self._read(name, "int", "an integer", low, high)

    def number(self, name: str, low: float | None = None, high: float | None = None) -> float:
        """Field `name` as a finite number in [low, high]."""
        return float(self._read(name, "number", "a finite number", low, high))

    def text(self, name: str) -> str:
        """Field `name` as a string."""
        return self._read(name, "text", "a string")

    def flag(self, name: str) -> bool:
        """Field `name` as a boolean."""
        return self._read(name, "flag", "true or false")

    def numbers(self, name: str, size: builtins.int) -> np.ndarray:
        """Field `name`, a list of `size` numbers (NaN allowed: a domain left open), as float64."""
        value = self[name]
        if not (isinstance(value, list) and len(value) == size
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            raise MalformedMessage(f"header field {name!r} must be a list of {size} numbers")
        try:
            return np.array(value, np.float64)
        except OverflowError:  # a JSON integer beyond float64
            raise MalformedMessage(f"header field {name!r} must be a list of {size} numbers") from None

    def hex(self, name: str, size: builtins.int | None = None) -> bytes:
        """Field `name`, a string of hex digits, as bytes (`size` of them when given)."""
        value = self.text(name)
        try:
            data = bytes.fromhex(value)
        except ValueError:
            data = None
        if data is None or (size is not None and len(data) != size):
            raise MalformedMessage(f"header field {name!r} must be {'' if size is None else f'{size} '}bytes "
                                   "in hex digits")
        return data

    def _read(self, name: str, kind: str, what: str, low: float | None = None,
              high: float | None = None) -> Any:
        value = self[name]
        ok = isinstance(value, _KINDS[kind]) and (kind == "flag" or not isinstance(value, bool))
        if ok and kind == "number":
            ok = abs(value) <= sys.float_info.max and math.isfinite(value)  # a huge JSON integer: no float
        if ok and kind in ("int", "number"):  # compared as is (exact for integers)
            number = cast(float, value)
            ok = (low is None or number >= low) and (high is None or number <= high)
        if not ok:
            bounds = f" in [{low:g}, {high:g}]" if low is not None and high is not None else (
                f" >= {low:g}" if low is not None else f" <= {high:g}" if high is not None else "")
            raise MalformedMessage(f"header field {name!r} must be {what}{bounds}")
        return value


class Arrays(dict[str, np.ndarray]):
    """A message's named arrays: a missing or ill-typed one is MalformedMessage (the sender's fault)."""

    def __missing__(self, name: str) -> np.ndarray:
        """An array the message lacks is the sender's fault."""
        raise MalformedMessage(f"array {name!r} is missing")

    def typed(self, name: str, kinds: str, ndim: int = 1, size: int | None = None) -> np.ndarray:
        """Array `name` with a dtype kind in `kinds` ('i', 'u', 'f', ...), `ndim` dimensions, `size` long.

        `size` (the first dimension's length) is checked only when given.
        """
        array = self[name]
        if array.dtype.kind not in kinds or array.ndim != ndim or (size is not None and len(array) != size):
            length = "" if size is None else f", {size} long"
            raise MalformedMessage(f"array {name!r} must be of dtype kind {kinds!r}, {ndim}-dimensional"
                                   f"{length}: found {array.dtype} of shape {list(array.shape)}")
        return array


@dataclass(init=False)
class Message:
    """A protocol message: `kind` names it, `header` holds JSON scalars, `arrays` hold the bulk data."""

    kind: str
    header: Header
    arrays: Arrays

    def __init__(self, kind: str, header: Mapping[str, Any] | None = None,
                 arrays: Mapping[str, np.ndarray] | None = None) -> None:
        """A message; its header and arrays are kept as their typed readers (plain mappings are copied)."""
        self.kind = kind
        self.header = header if isinstance(header, Header) else Header(header or {})
        self.arrays = arrays if isinstance(arrays, Arrays) else Arrays(arrays or {})

    def to_bytes(self) -> bytes:
        """Serialise as an Arrow IPC stream holding one single-row record batch."""
        return self.to_buffer().to_pybytes()

    def to_buffer(self) -> pa.Buffer:
        """Like `to_bytes`, without the final copy into Python bytes (for large messages)."""
        columns, names, shapes, nbytes = [], [], {}, 0
        for name, array in self.arrays.items():
            array = np.ascontiguousarray(array)
            if array.ndim != 1:
                shapes[name] = list(array.shape)
            columns.append(_column(name, array))
            names.append(name)
            nbytes += array.nbytes
        schema = _schema(self.kind, self.header, shapes, names, columns)
        batch = pa.record_batch(columns, schema=schema)
        if nbytes <= _JOINED_BYTES:  # a small message: its stream's three parts, joined
            return pa.py_buffer(b"".join((schema.serialize(), batch.serialize(), _END_OF_STREAM)))
        # measured first, then written once into a buffer of that size (a growing stream copies as it grows)
        size = pa.MockOutputStream()
        _write_stream(size, schema, batch)
        buffer = pa.allocate_buffer(size.size())
        _write_stream(pa.FixedSizeBufferWriter(buffer), schema, batch)
        return buffer

    @classmethod
    def from_bytes(cls, payload: bytes | pa.Buffer) -> Message:
        """Parse bytes made by `to_bytes` (or a buffer from `to_buffer`).

        Anything else raises ProtocolError.
        """
        try:
            reader = pa.ipc.open_stream(pa.py_buffer(payload), options=_READ_OPTIONS)
            batches = [reader.read_next_batch()]
            batches.extend(reader)  # a StreamedMessage's further parts
            batch = batches[0]
            metadata = batch.schema.metadata or {}
            kind = metadata[_KIND_KEY].decode()
            header = _json_object(metadata[_HEADER_KEY])
            shapes = _json_object(metadata.get(_SHAPES_KEY, _EMPTY_JSON))
        except (pa.ArrowException, OSError, KeyError, StopIteration, ValueError, UnicodeDecodeError) as exc:
            raise ProtocolError(f"malformed message: {exc}") from exc
        if not isinstance(header, dict) or not isinstance(shapes, dict):
            raise ProtocolError("malformed message: the header and shapes must be JSON objects")
        rows = {b.num_rows for b in batches}
        if batch.num_columns and rows != {1}:
            raise ProtocolError(f"malformed message: expected one row a batch, found {sorted(rows)}")
        arrays = {}
        try:
            for i, name in enumerate(batch.schema.names):
                parts = [_values(b.column(i)) for b in batches]
                values = parts[0] if len(parts) == 1 else np.concatenate(parts)
                if name in shapes:
                    values = values.reshape(shapes[name])
                arrays[name] = values
        except (AttributeError, TypeError, ValueError, OSError, pa.ArrowException) as exc:
            raise ProtocolError(f"malformed message: array {name!r}: {exc}") from exc
        return cls(kind=kind, header=header, arrays=arrays)

    def schema_summary(self) -> str:
        """A short description of the arrays (name:dtype[shape]) for transcripts."""
        return ", ".join(f"{n}:{a.dtype}{list(a.shape)}" for n, a in self.arrays.items())


class StreamedMessage:
    """A message whose one array `name` (of `shape`) is made in parts while it is sent.

    `parts()` yields the array's consecutive row ranges; each goes as its own single-row batch of the same
    stream, so the sender holds one part at a time (`pieces`), and `Message.from_bytes` joins them into the
    message `Message(kind, header, {name: array, **whole})` would be. Only the parts' framing differs on the
    wire. The `whole` arrays (small ones, such as a mask's packed bits) go in the first batch, empty in the
    others, so a receiver reading batch by batch (`PartedMessage`) has them before the first part.
    """

    def __init__(self, kind: str, header: dict[str, Any], name: str, shape: tuple[int, ...],
                 parts: Callable[[], Iterable[np.ndarray]],
                 whole: Mapping[str, np.ndarray] | None = None, dtype: np.dtype | None = None) -> None:
        """`parts` is called once, when the message is sent; what it yields must add up to `shape`.

        `dtype`, the parts' dtype when known, is only for `schema_summary` (a transcript's line).
        """
        self.kind, self.header, self.name, self.shape = kind, header, name, tuple(shape)
        self.dtype = dtype
        self._parts = parts
        self.whole = {n: np.ascontiguousarray(a) for n, a in (whole or {}).items()}

    def pieces(self) -> Iterator[pa.Buffer]:
        """The message's IPC stream: its schema, one batch a part (at least one), the end marker."""
        sink = _Pieces()
        writer, schema, rows = None, None, 0
        shapes = {self.name: list(self.shape)} if len(self.shape) != 1 else {}
        shapes.update({n: list(a.shape) for n, a in self.whole.items() if a.ndim != 1})
        names = [self.name, *self.whole]
        for part in _at_least_one(self._parts(), self.shape):
            part = np.ascontiguousarray(part)
            rows += len(part)
            others = [_column(n, a if writer is None else a[:0]) for n, a in self.whole.items()]
            columns = [_column(self.name, part), *others]
            if writer is None:
                schema = _schema(self.kind, self.header, shapes, names, columns)
                writer = pa.ipc.new_stream(sink, schema, options=_WRITE_OPTIONS)
            writer.write_batch(pa.record_batch(columns, schema=schema))
            del part, columns, others
            yield from sink.take()
        if rows != self.shape[0]:
            raise ProtocolError(f"message {self.kind!r}: its parts of {self.name!r} held {rows} rows, not "
                                f"the {self.shape[0]} it announced")
        assert writer is not None, "_at_least_one yields a part"
        writer.close()
        yield from sink.take()

    def to_buffer(self) -> pa.Buffer:
        """The whole stream as one buffer (an in-process transport's copy)."""
        return pa.py_buffer(b"".join(piece.to_pybytes() for piece in self.pieces()))

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays, joined (as the receiver parses them)."""
        return Message.from_bytes(self.to_buffer()).arrays

    def schema_summary(self) -> str:
        """`Message.schema_summary` of the joined message, without joining it."""
        dtypes = {self.name: "?" if self.dtype is None else str(self.dtype),
                  **{n: str(a.dtype) for n, a in self.whole.items()}}
        shapes = {self.name: list(self.shape), **{n: list(a.shape) for n, a in self.whole.items()}}
        return ", ".join(f"{n}:{dtypes[n]}{shapes[n]}" for n in dtypes)


def streamed_request(kind: str, header: dict[str, Any], name: str, array: np.ndarray,
                     whole: Mapping[str, np.ndarray], part_rows: int) -> Message | StreamedMessage:
    """A request whose large array `name` a receiver can read `part_rows` rows at a time (issue #29).

    An array of at most `part_rows` rows goes as one `Message`, as before; a larger one as a
    `StreamedMessage` of parts of `part_rows` rows, `whole` in its first batch. Parsed whole, both are the
    same message.
    """
    if len(array) <= part_rows:
        return Message(kind, header, {name: array, **whole})
    return StreamedMessage(kind, header, name, array.shape,
                           lambda: (array[i:i + part_rows] for i in range(0, len(array), part_rows)), whole,
                           dtype=array.dtype)


class PartedMessage(Message):
    """A message read batch by batch: `arrays` holds the whole ones, `parts` yields array `streamed`'s parts.

    The receiver consumes `parts` (each part read off the wire when asked for) and never holds the array.
    """

    def __init__(self, kind: str, header: Mapping[str, Any], arrays: Mapping[str, np.ndarray], streamed: str,
                 parts: Iterator[np.ndarray]) -> None:
        """The message's kind, header and whole arrays; `parts` is its streamed array, part by part."""
        super().__init__(kind, header, arrays)
        self.streamed = streamed
        self.parts = parts


def _at_least_one(parts: Iterable[np.ndarray], shape: tuple[int, ...]) -> Iterator[np.ndarray]:
    """The parts, or one empty part of the array's row shape when there are none."""
    empty = True
    for part in parts:
        empty = False
        yield part
    if empty:
        yield np.zeros((0, *shape[1:]), np.uint8)


class _Pieces:
    """A file-like sink for an IPC writer that hands over what was written so far (`take`)."""

    def __init__(self) -> None:
        self._pieces: list[bytes] = []
        self.closed = False

    def write(self, data) -> int:
        self._pieces.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def take(self) -> list[pa.Buffer]:
        """What was written since the last `take`, as one buffer (none if nothing was)."""
        pieces, self._pieces = self._pieces, []
        return [pa.py_buffer(b"".join(pieces))] if pieces else []


def _write_stream(sink: pa.NativeFile, schema: pa.Schema, batch: pa.RecordBatch) -> None:
    """One batch as a whole IPC stream (schema, batch, end marker) into `sink`."""
    with pa.ipc.new_stream(sink, schema, options=_WRITE_OPTIONS) as writer:
        writer.write_batch(batch)


_NUMPY_DTYPES: dict[pa.DataType, np.dtype] = {}
"""Each Arrow integer or float type's NumPy dtype, found at its first message (`_values`)."""


def _values(column: pa.LargeListArray) -> np.ndarray:
    """A received column's values as NumPy: a view of a numeric column's buffer without nulls, else converted.

    The same array `to_numpy(zero_copy_only=False)` gives, read-only as that view is, at a third of its cost
    for the small arrays of a level's messages.
    """
    values = column.values
    dtype = _NUMPY_DTYPES.get(values.type)
    if dtype is None and (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
        dtype = _NUMPY_DTYPES[values.type] = np.dtype(values.type.to_pandas_dtype())
    data = values.buffers()[1] if dtype is not None and values.null_count == 0 else None
    if dtype is None or data is None:
        return values.to_numpy(zero_copy_only=False)
    return np.frombuffer(data, dtype, len(values), values.offset * dtype.itemsize)


_NUMERIC_TYPES: dict[np.dtype, tuple[pa.DataType, pa.DataType]] = {}
"""Each native integer or float dtype's Arrow type and large-list type, made at its first message."""


def _column(name: str, array: np.ndarray) -> pa.LargeListArray:
    """One array as the single-row large-list column it crosses in.

    A native integer or float array's values are its own buffer, wrapped (zero-copy; the array `pa.array`
    makes, at half its cost for the small arrays of a level's messages); anything else Arrow converts.
    """
    if array.dtype == np.bool_:
        raise ProtocolError(f"array {name!r}: send booleans as packed bits, not bool arrays")
    flat = array.reshape(-1)
    types = _NUMERIC_TYPES.get(flat.dtype)
    if types is None and flat.dtype.kind in "iuf" and flat.dtype.isnative:
        value_type = pa.from_numpy_dtype(flat.dtype)
        types = _NUMERIC_TYPES[flat.dtype] = (value_type, pa.large_list(value_type))
    if types is None:
        values = pa.array(flat)
        list_type = pa.large_list(values.type)
    else:
        values = pa.Array.from_buffers(types[0], len(flat), [None, pa.py_buffer(flat)])
        list_type = types[1]
    offsets = pa.py_buffer(np.array([0, len(flat)], np.int64))
    return cast(pa.LargeListArray, pa.Array.from_buffers(list_type, 1, [None, offsets], children=[values]))


def _schema(kind: str, header: dict[str, Any], shapes: dict[str, list[int]], names: list[str],
            columns: list[pa.LargeListArray]) -> pa.Schema:
    """A message's schema: its columns, and its kind, header and array shapes as metadata."""
    return _schema_of(kind, json.dumps(header, sort_keys=True) if header else "{}",
                      json.dumps(shapes) if shapes else "{}",
                      tuple(zip(names, (c.type for c in columns), strict=True)))


@functools.lru_cache(maxsize=256)
def _schema_of(kind: str, header: str, shapes: str, fields: tuple[tuple[str, pa.DataType], ...]) -> pa.Schema:
    """`_schema` from its JSON texts and fields, made once each (a party gets the same ones every level)."""
    metadata = {_KIND_KEY: kind.encode(), _HEADER_KEY: header.encode(), _SHAPES_KEY: shapes.encode()}
    return pa.schema([pa.field(n, t) for n, t in fields], metadata=metadata)


def pack_bits(bits: np.ndarray) -> np.ndarray:
    """Pack a 0/1 array into bytes, little bit order (bit i of the stream is bits[i])."""
    return np.packbits(bits.astype(np.uint8, copy=False), bitorder="little")


def unpack_bits(packed: np.ndarray, count: int) -> np.ndarray:
    """Inverse of `pack_bits`: the first `count` bits as a uint8 0/1 array."""
    return np.unpackbits(packed, count=count, bitorder="little")
