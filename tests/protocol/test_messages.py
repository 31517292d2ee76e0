"""Messages survive Arrow IPC exactly and malformed bytes are refused."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.errors import ProtocolError
from fedcore.protocol.messages import Message, StreamedMessage, pack_bits, unpack_bits


def test_round_trip_keeps_kind_header_and_arrays() -> None:
    arrays = {
        "f64": np.array([1.5, np.nan, -2.0]),
        "i32": np.arange(5, dtype=np.int32),
        "u64": np.array([2**64 - 1, 0], dtype=np.uint64),
        "matrix": np.arange(12, dtype=np.float64).reshape(3, 4),
        "empty": np.zeros(0, dtype=np.int64),
        "ids": np.array(["a1", "b2"]),
    }
    message = Message("find_splits", {"depth": 3, "trees": [1, 2]}, arrays)
    back = Message.from_bytes(message.to_bytes())
    assert back.kind == "find_splits"
    assert back.header == {"depth": 3, "trees": [1, 2]}
    for name, array in arrays.items():
        np.testing.assert_array_equal(back.arrays[name], array)
        assert back.arrays[name].shape == array.shape
    assert back.arrays["matrix"].dtype == np.float64
    assert back.arrays["u64"].dtype == np.uint64


def test_message_without_arrays_round_trips() -> None:
    back = Message.from_bytes(Message("ack", {"owned_nodes": 4}).to_bytes())
    assert (back.kind, back.header, back.arrays) == ("ack", {"owned_nodes": 4}, {})


def test_boolean_arrays_must_be_packed() -> None:
    with pytest.raises(ProtocolError, match="send booleans as packed bits"):
        Message("x", {}, {"mask": np.ones(3, dtype=bool)}).to_bytes()


@pytest.mark.parametrize("payload",
                         [b"", b"not arrow at all", Message("x", {}, {"a": np.arange(9)}).to_bytes()[:40]])
def test_malformed_bytes_raise_protocol_error(payload: bytes) -> None:
    with pytest.raises(ProtocolError, match="malformed message"):
        Message.from_bytes(payload)


@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 1000])
def test_pack_unpack_bits(count: int) -> None:
    bits = (np.random.default_rng(count).random(count) < 0.5).astype(np.uint8)
    packed = pack_bits(bits)
    assert len(packed) == (count + 7) // 8
    np.testing.assert_array_equal(unpack_bits(packed, count), bits)


@pytest.mark.parametrize("cuts", [[], [0, 7], [0, 3, 3, 7]])  # no part, one part, parts with an empty one
def test_a_streamed_message_parses_as_the_message_of_its_joined_parts(cuts) -> None:
    values = np.arange(7 * 32, dtype=np.int64).astype(np.uint8).reshape(7, 32)[:max(cuts, default=0)]
    streamed = StreamedMessage("id_hashes", {"rows": len(values)}, "hashes", values.shape,
                               lambda: (values[a:b] for a, b in zip(cuts, cuts[1:], strict=False)))
    back = Message.from_bytes(streamed.to_buffer())
    whole = Message.from_bytes(Message("id_hashes", {"rows": len(values)}, {"hashes": values}).to_buffer())
    assert (back.kind, back.header) == (whole.kind, whole.header)
    assert back.arrays["hashes"].dtype == whole.arrays["hashes"].dtype == np.uint8
    assert back.arrays["hashes"].shape == whole.arrays["hashes"].shape == values.shape
    assert back.arrays["hashes"].tobytes() == values.tobytes()
    assert len(list(streamed.pieces())) == max(len(cuts) - 1, 1) + 1  # a piece per part (the first with
    # the schema), then the end marker


def test_a_streamed_message_whose_parts_miss_rows_is_refused() -> None:
    values = np.zeros((5, 32), np.uint8)
    streamed = StreamedMessage("id_hashes", {"rows": 6}, "hashes", (6, 32), lambda: iter([values]))
    with pytest.raises(ProtocolError) as refused:
        streamed.to_buffer()
    assert str(refused.value) == ("message 'id_hashes': its parts of 'hashes' held 5 rows, not the 6 it "
                                  "announced")


@pytest.mark.parametrize("arrays", [
    {},
    {"a": np.arange(5, dtype=np.int64)},
    {"empty": np.zeros(0, np.float64), "grid": np.arange(12, dtype=np.int16).reshape(3, 4),
     "odd": np.arange(7, dtype=np.uint8), "f": np.linspace(0.0, 1.0, 9)},
    {"large": np.arange(200_000, dtype=np.float64), "small": np.ones(3, np.int32)},
])
def test_a_small_message_joins_the_bytes_the_stream_writer_writes(arrays) -> None:
    """Both encodings (joined IPC parts for small messages, the writer for large ones) are one stream."""
    import pyarrow as pa

    message = Message("kind", {"n": 3, "x": [1.5, None]}, arrays)
    payload = message.to_buffer()
    reader = pa.ipc.open_stream(payload)
    schema, batches = reader.schema, list(reader)
    written = pa.BufferOutputStream()
    with pa.ipc.new_stream(written, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    assert payload.to_pybytes() == written.getvalue().to_pybytes()
    parsed = Message.from_bytes(payload)
    assert parsed.header == message.header and list(parsed.arrays) == list(arrays)
    for name, array in arrays.items():
        assert parsed.arrays[name].dtype == array.dtype and np.array_equal(parsed.arrays[name], array)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                                   np.uint64, np.float16, np.float32, np.float64, "<U3"])
def test_arrays_cross_as_the_columns_arrow_converts_them_to(dtype) -> None:
    """Wrapping a numeric array's buffer (`_column`) gives the bytes converting it with pa.array gives."""
    import json

    import pyarrow as pa

    from fedcore.protocol.messages import _column

    array = np.arange(-3, 9).astype(dtype).reshape(3, 4)
    flat = pa.array(array.reshape(-1))
    converted = pa.Array.from_buffers(pa.large_list(flat.type), 1,
                                      [None, pa.py_buffer(np.array([0, 12], np.int64))], children=[flat])
    assert _column("x", array).equals(converted)
    schema = pa.schema([pa.field("x", converted.type)], metadata={
        b"fedforest.kind": b"k", b"fedforest.header": json.dumps({"n": 1}).encode(),
        b"fedforest.shapes": json.dumps({"x": [3, 4]}).encode()})
    written = pa.BufferOutputStream()
    with pa.ipc.new_stream(written, schema) as writer:
        writer.write_batch(pa.record_batch([converted], schema=schema))
    for _ in range(2):  # the second time from the schema made the first time
        payload = Message("k", {"n": 1}, {"x": array}).to_buffer()
        assert payload.to_pybytes() == written.getvalue().to_pybytes()


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int32, np.uint64, np.float16, np.float32,
                                   np.float64, "<U3"])
def test_received_arrays_are_what_arrow_converts(dtype) -> None:
    """A received numeric array is a read-only view of the message's buffer, equal to Arrow's conversion."""
    import pyarrow as pa

    array = np.arange(-3, 9).astype(dtype)
    payload = Message("k", {}, {"x": array, "empty": array[:0]}).to_buffer()
    got = Message.from_bytes(payload).arrays
    converted = pa.ipc.open_stream(payload).read_next_batch().column(0).values.to_numpy(zero_copy_only=False)
    assert got["x"].dtype == converted.dtype and np.array_equal(got["x"], converted)
    assert got["empty"].dtype == converted.dtype and got["empty"].shape == (0,)
    if array.dtype.kind != "U":
        assert not got["x"].flags.writeable
