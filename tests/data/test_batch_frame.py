"""The frame made batch by batch is Arrow's `to_pandas()` of the same batches (`fedcore.data.batch_frame`)."""

from __future__ import annotations

import mmap

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from fedcore.data.batch_frame import GrowingColumn, frame_of_batches
from fedcore.data.sql import owned_batches


def _batches() -> tuple[pa.Schema, list[pa.RecordBatch]]:
    """Three batches of int64 (first null in the second batch), int8, uint32, float32, float64 and text.

    Also nulls in float32, NaN and nulls in float64, booleans with a null, timestamps, one name twice, and
    two categoricals whose dictionaries differ per batch: text (nulls, unused entries, over 127 categories
    in all, so int16 codes) and ordered integers with int8 indices.
    """
    rng = np.random.default_rng(0)
    schema = pa.schema([("id", pa.int64()), ("n", pa.int64()), ("small", pa.int8()), ("u", pa.uint32()),
                        ("f32", pa.float32()), ("x", pa.float64()), ("name", pa.string()),
                        ("flag", pa.bool_()), ("at", pa.timestamp("us", tz="UTC")), ("x", pa.float64()),
                        ("kind", pa.dictionary(pa.int32(), pa.string())),
                        ("grade", pa.dictionary(pa.int8(), pa.int64(), ordered=True))])
    batches, start = [], 0
    for rows, null_at in ((1000, None), (700, 5), (300, None)):
        ids = np.arange(start, start + rows)
        n = pa.array(ids * 2**40 + 1, mask=None if null_at is None else ids == start + null_at)
        x = rng.normal(size=rows)
        x[::97] = np.nan
        batches.append(pa.record_batch([
            pa.array(ids), n, pa.array((ids % 200 - 100).astype(np.int8)), pa.array(ids.astype(np.uint32)),
            pa.array(rng.normal(size=rows).astype(np.float32), mask=ids % 61 == 0),
            pa.array(x, mask=ids % 89 == 0),
            pa.array([f"c{i}" for i in ids]), pa.array(ids % 3 == 0, mask=ids == 1500),
            pa.array(ids * 1_000_000, pa.timestamp("us", tz="UTC")), pa.array(-x),
            pa.DictionaryArray.from_arrays(  # the batch's own dictionary: 60 new values, 3 never used
                pa.array(ids % 57, pa.int32(), mask=ids % 13 == 0),
                pa.array([f"k{(start // 10 + j) % 150}" for j in range(60)])),
            pa.DictionaryArray.from_arrays(pa.array((ids % 3).astype(np.int8)),
                                           pa.array([start % 7, 9, -start % 5]), ordered=True)],
            schema=schema))
        start += rows
    return schema, batches


@pytest.mark.parametrize("reserve", [64 * 2**20, 4096])  # a column grown in place many times
def test_the_frame_is_the_one_arrow_gives(reserve, monkeypatch) -> None:
    monkeypatch.setattr("fedcore.data.batch_frame.RESERVE_BYTES", reserve)
    schema, batches = _batches()
    expected = pa.Table.from_batches(batches).to_pandas()
    frame = frame_of_batches(pa.RecordBatchReader.from_batches(schema, iter(batches)), owned_batches)
    pd.testing.assert_frame_equal(frame, expected, check_exact=True)
    assert list(frame.dtypes) == list(expected.dtypes)
    assert [str(frame.dtypes.iloc[i]) for i in (1, 2, 3, 4)] == ["float64", "int8", "uint32", "float32"]
    assert len(frame["kind"].cat.categories) > 127 and frame["kind"].array.codes.dtype == np.int16
    assert frame["grade"].cat.ordered and frame["kind"].isna().sum() == (np.arange(2000) % 13 == 0).sum()
    assert frame.iloc[1005, 1] != frame.iloc[1005, 1] and frame.iloc[1006, 1] == 1006 * 2**40 + 1
    assert frame._mgr.nblocks == len(schema), "one pandas block per column"


def test_no_rows_and_only_numeric_columns_keep_arrow_dtypes() -> None:
    schema, batches = _batches()
    expected = pa.Table.from_batches([], schema).to_pandas()
    frame = frame_of_batches(pa.RecordBatchReader.from_batches(schema, iter([])), owned_batches)
    pd.testing.assert_frame_equal(frame, expected, check_exact=True)
    numeric = [b.select([0, 1, 4]) for b in batches]
    frame = frame_of_batches(pa.RecordBatchReader.from_batches(numeric[0].schema, iter(numeric)),
                             owned_batches)
    pd.testing.assert_frame_equal(frame, pa.Table.from_batches(numeric).to_pandas(), check_exact=True)


class _NoRemap(mmap.mmap):
    """A memory map on a system without mremap (macOS): resizing refused as CPython refuses it there."""

    def resize(self, newsize: int) -> None:
        raise SystemError("mmap: resizing not available--no mremap()")


@pytest.mark.parametrize("remap", [True, False])
def test_a_growing_column_keeps_its_values_across_resizes_and_a_first_null(remap, monkeypatch) -> None:
    monkeypatch.setattr("fedcore.data.batch_frame.RESERVE_BYTES", 16)
    if not remap:
        monkeypatch.setattr("fedcore.data.batch_frame._new_map",
                            lambda size: _NoRemap(-1, size, flags=mmap.MAP_PRIVATE))
    column = GrowingColumn(np.dtype(np.int8))
    for start in range(0, 100, 7):
        column.append(pa.array(np.arange(start, min(start + 7, 100), dtype=np.int8)))
    assert column.finish().tolist() == list(range(100)) and column.dtype == np.int8
    column.append(pa.array([100, None], pa.int8()))
    values = column.finish()
    assert values.dtype == np.float64 and values[:101].tolist() == list(range(101)) and np.isnan(values[101])
    assert isinstance(column.memory, _NoRemap) is not remap
    assert GrowingColumn(np.dtype(np.float32)).finish().dtype == np.float32


def _dated_batches() -> tuple[pa.Schema, list[pa.RecordBatch]]:
    """Four batches of text, dates and timestamps whose nulls differ per batch.

    Text (string and large_string): nulls from the second batch, the third batch all null. Dates (date32,
    date64): the same days again in every batch, the first null in the third. Timestamps in four units,
    naive and in two time zones, the first null in the second batch. The third batch has no rows.
    """
    import datetime

    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("note", pa.large_string()),
                        ("day", pa.date32()), ("day64", pa.date64()),
                        ("at", pa.timestamp("us", tz="UTC")), ("local", pa.timestamp("s", tz="Europe/Paris")),
                        ("naive", pa.timestamp("ns")), ("ms", pa.timestamp("ms"))])
    batches, start = [], 0
    for number, rows in enumerate((500, 300, 0, 200)):
        ids = np.arange(start, start + rows)
        days = [datetime.date(2024, 1, 1) + datetime.timedelta(days=int(i % 40)) for i in ids]
        text = [None if number == 3 or (number and i % 7 == 0) else f"t{i % 90}" for i in ids]
        stamps = ids * 3_600_000_001
        stamp_nulls = None if number == 0 else ids % 11 == 0
        batches.append(pa.record_batch([
            pa.array(ids), pa.array(text, pa.string()), pa.array(text, pa.large_string()),
            pa.array(days, pa.date32(), mask=None if number < 3 else ids % 5 == 0),
            pa.array(days, pa.date64(), mask=None if number < 3 else ids % 3 == 0),
            pa.array(stamps, pa.timestamp("us", tz="UTC"), mask=stamp_nulls),
            pa.array(stamps // 10**6, pa.timestamp("s", tz="Europe/Paris"), mask=stamp_nulls),
            pa.array(stamps * 1000, pa.timestamp("ns"), mask=stamp_nulls),
            pa.array(stamps // 1000, pa.timestamp("ms"), mask=stamp_nulls)], schema=schema))
        start += rows
    return schema, batches


def test_text_dates_and_timestamps_are_built_batch_by_batch_as_arrow_converts_them(monkeypatch) -> None:
    monkeypatch.setattr("fedcore.data.batch_frame.TEXT_GROUP_BYTES", 4096)  # text joined in several chunks
    schema, batches = _dated_batches()
    expected = pa.Table.from_batches(batches, schema).to_pandas()
    gathered: list[list[str]] = []

    def gather(reader: pa.RecordBatchReader) -> pa.Table:
        gathered.append(reader.schema.names)
        return owned_batches(reader)

    frame = frame_of_batches(pa.RecordBatchReader.from_batches(schema, iter(batches)), gather)
    assert gathered == [], "no column is left to the gathered conversion at the end"
    pd.testing.assert_frame_equal(frame, expected, check_exact=True)
    assert list(frame.dtypes) == list(expected.dtypes)
    assert [str(t) for t in frame.dtypes[1:]] == ["str", "str", "object", "object", "datetime64[us, UTC]",
                                                  "datetime64[s, Europe/Paris]", "datetime64[ns]",
                                                  "datetime64[ms]"]
    for name in ("name", "note", "day", "day64"):  # nulls as Arrow gives them: NaN in text, None in dates
        assert [repr(v) for v in frame[name]] == [repr(v) for v in expected[name]], name
    assert frame["day"].iloc[-5] is None
    assert frame["at"].isna().sum() == (np.arange(500, 1000) % 11 == 0).sum()
    days = {id(day) for day in frame["day"] if day is not None}
    assert len(days) == 40, "one Python date per distinct day"
    assert frame["name"].array._pa_array.num_chunks > 1 and frame._mgr.nblocks == len(schema)


def test_text_dates_and_timestamps_without_rows_keep_arrow_dtypes() -> None:
    schema, _ = _dated_batches()
    expected = pa.Table.from_batches([], schema).to_pandas()
    frame = frame_of_batches(pa.RecordBatchReader.from_batches(schema, iter([])), owned_batches)
    pd.testing.assert_frame_equal(frame, expected, check_exact=True)
    assert list(frame.dtypes) == list(expected.dtypes)
