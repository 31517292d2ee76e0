"""The one message type that crosses between master and parties.

A kind, a small JSON header and named NumPy arrays, carried as a single-row Arrow record batch (IPC stream
bytes).

Every array travels as an Arrow large-list column, so messages of any shape share one encoding and the
transport can count, record and check every byte that crosses.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pyarrow as pa

from fedcore.errors import MalformedMessage, ProtocolError

_KIND_KEY = b"fedforest.kind"
_HEADER_KEY = b"fedforest.header"
_SHAPES_KEY = b"fedforest.shapes"


_KINDS = {"int": (int,), "number": (int, float), "text": (str,), "flag": (bool,)}


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
        columns, names, shapes = [], [], {}
        for name, array in self.arrays.items():
            array = np.ascontiguousarray(array)
            if array.dtype == np.bool_:
                raise ProtocolError(f"array {name!r}: send booleans as packed bits, not bool arrays")
            if array.ndim != 1:
                shapes[name] = list(array.shape)
            flat = pa.array(array.reshape(-1))
            columns.append(pa.LargeListArray.from_arrays(pa.array([0, len(flat)], pa.int64()), flat))
            names.append(name)
        metadata = {
            _KIND_KEY: self.kind.encode(),
            _HEADER_KEY: json.dumps(self.header, sort_keys=True).encode(),
            _SHAPES_KEY: json.dumps(shapes).encode(),
        }
        schema = pa.schema([pa.field(n, c.type) for n, c in zip(names, columns, strict=True)],
                           metadata=metadata)
        batch = pa.record_batch(columns, schema=schema)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as writer:
            writer.write_batch(batch)
        return sink.getvalue()

    @classmethod
    def from_bytes(cls, payload: bytes | pa.Buffer) -> Message:
        """Parse bytes made by `to_bytes` (or a buffer from `to_buffer`).

        Anything else raises ProtocolError.
        """
        try:
            reader = pa.ipc.open_stream(pa.py_buffer(payload))
            batch = reader.read_next_batch()
            metadata = batch.schema.metadata or {}
            kind = metadata[_KIND_KEY].decode()
            header = json.loads(metadata[_HEADER_KEY])
            shapes = json.loads(metadata.get(_SHAPES_KEY, b"{}"))
        except (pa.ArrowException, OSError, KeyError, StopIteration, ValueError, UnicodeDecodeError) as exc:
            raise ProtocolError(f"malformed message: {exc}") from exc
        if not isinstance(header, dict) or not isinstance(shapes, dict):
            raise ProtocolError("malformed message: the header and shapes must be JSON objects")
        if batch.num_columns and batch.num_rows != 1:
            raise ProtocolError(f"malformed message: expected one row, found {batch.num_rows}")
        arrays = {}
        try:
            for name, column in zip(batch.schema.names, batch.columns, strict=True):
                values = column.values.to_numpy(zero_copy_only=False)
                if name in shapes:
                    values = values.reshape(shapes[name])
                arrays[name] = values
        except (AttributeError, TypeError, ValueError, OSError, pa.ArrowException) as exc:
            raise ProtocolError(f"malformed message: array {name!r}: {exc}") from exc
        return cls(kind=kind, header=header, arrays=arrays)

    def schema_summary(self) -> str:
        """A short description of the arrays (name:dtype[shape]) for transcripts."""
        return ", ".join(f"{n}:{a.dtype}{list(a.shape)}" for n, a in self.arrays.items())


def pack_bits(bits: np.ndarray) -> np.ndarray:
    """Pack a 0/1 array into bytes, little bit order (bit i of the stream is bits[i])."""
    return np.packbits(bits.astype(np.uint8, copy=False), bitorder="little")


def unpack_bits(packed: np.ndarray, count: int) -> np.ndarray:
    """Inverse of `pack_bits`: the first `count` bits as a uint8 0/1 array."""
    return np.unpackbits(packed, count=count, bitorder="little")
