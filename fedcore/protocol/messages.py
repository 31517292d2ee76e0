"""The one message type that crosses between master and parties.

A kind, a small JSON header and named NumPy arrays, carried as a single-row Arrow record batch (IPC stream
bytes).

Every array travels as an Arrow large-list column, so messages of any shape share one encoding and the
transport can count, record and check every byte that crosses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from fedcore.errors import ProtocolError

_KIND_KEY = b"fedforest.kind"
_HEADER_KEY = b"fedforest.header"
_SHAPES_KEY = b"fedforest.shapes"


@dataclass
class Message:
    """A protocol message: `kind` names it, `header` holds JSON scalars, `arrays` hold the bulk data."""

    kind: str
    header: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

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
