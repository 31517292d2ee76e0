"""Arrow record batches into a pandas frame as they arrive: the read holds one copy of the values, not two.

A numeric column (integers, floats) is copied batch by batch into a NumPy array in a memory map that
grows in place (`GrowingColumn`), and so is a timestamp column (`GrowingTimes`) and a categorical
(dictionary) column's codes, its batches' dictionaries unified as they arrive (`GrowingCategorical`); a
date column is coded the same way, its distinct days made Python dates once at the end (`GrowingDates`);
a text column becomes pandas' Arrow-backed strings from copies of its batches, large_string as pandas
holds it (`GrowingText`). The other columns (booleans, times of day, durations, ...) are gathered as Arrow
chunks (`fedcore.data.sql.owned_batches`) and converted at the end. The frame is `pa.Table.to_pandas()`
of the same batches (values, dtypes, nulls as NaN, NaT or None; an integer column with a null becomes
float64 with NaN), with one pandas block per column.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    import pyarrow as pa

RESERVE_BYTES = 16 * 2**20
"""Address space a growing column maps at first; its pages take memory only as rows arrive."""
GROUP_BYTES = 32 * 2**20
"""Every this many bytes of copied batches are joined into one chunk per column (`sql.owned_batches`)."""
TEXT_GROUP_BYTES = 4 * 2**20
"""Every this many bytes of one text column's copied batches are joined into one chunk (`GrowingText`).

Per column, not per batch as GROUP_BYTES: with 32 MiB each of 8 text columns of 2,000,000 rows peaked
about 180 MiB higher (docs/benchmarks.md); 1 to 4 MiB as low as the gathered conversion.
"""


class GrowingColumn:
    """A NumPy column filled batch by batch in a memory map of its own, grown and finally shrunk in place.

    On Linux the map grows by remapping its pages (`mremap`): no copy, no second array, and nothing
    touched beyond the rows (`ndarray.resize` would zero its new capacity); elsewhere by a copy.
    """

    def __init__(self, dtype: np.dtype) -> None:
        """An empty column of `dtype` with RESERVE_BYTES mapped."""
        self.dtype = dtype
        self.memory = _new_map(RESERVE_BYTES)
        self.rows = 0

    def append(self, column: pa.Array) -> None:
        """Add one batch's `column`; an integer column's first null turns the column into float64 with NaN.

        The same values as Arrow's `to_pandas`: nulls of a float column are NaN there too.
        """
        values = column.to_numpy(zero_copy_only=False)  # a batch's integers with nulls: float64, NaN
        if values.dtype != self.dtype and values.dtype.kind == "f":
            held = self._view().astype(values.dtype)
            self.dtype, self.memory = values.dtype, _new_map(max(RESERVE_BYTES, 2 * held.nbytes))
            self._view()[:] = held
        end = self.rows + len(values)
        if end * self.dtype.itemsize > len(self.memory):
            self._remap(max(end * self.dtype.itemsize, 2 * len(self.memory)))
        np.frombuffer(self.memory, self.dtype, count=end)[self.rows:] = values
        self.rows = end

    def finish(self) -> np.ndarray:
        """The column (its array keeps the map), the map's spare pages given back."""
        if self.rows == 0:
            return np.empty(0, self.dtype)
        self._remap(self.rows * self.dtype.itemsize)
        return np.frombuffer(self.memory, self.dtype)

    def _view(self) -> np.ndarray:
        """The rows so far (a view: let go before the map is remapped)."""
        return np.frombuffer(self.memory, self.dtype, count=self.rows)

    def _remap(self, size: int) -> None:
        """The map at `size` bytes, its rows kept: remapped in place, or copied where mremap is missing."""
        try:
            self.memory.resize(size)
        except SystemError:  # "mmap: resizing not available--no mremap()"
            held, self.memory = self._view(), _new_map(size)
            self._view()[:] = held
            del held


class GrowingCategorical:
    """A dictionary column as pandas codes in a `GrowingColumn`; categories its batches' dictionaries.

    As Arrow's `to_pandas` unifies a chunked dictionary column: the dictionaries' values in order of first
    appearance (unused ones too), a null as code -1, the codes in the smallest integer type that holds them.
    """

    def __init__(self, kind: pa.DictionaryType) -> None:
        """An empty column of Arrow dictionary type `kind`."""
        import pyarrow as pa

        self.kind = kind
        self.categories = pa.array([], kind.value_type)
        self.codes = GrowingColumn(np.dtype(np.int32))

    def append(self, column: pa.DictionaryArray) -> None:
        """Add one batch's `column`: new dictionary values join the categories, indices become codes."""
        import pyarrow as pa
        import pyarrow.compute as pc

        dictionary = column.dictionary
        new = dictionary.filter(pc.invert(pc.is_in(dictionary, value_set=self.categories)))
        if len(new):
            self.categories = pa.concat_arrays([self.categories, pc.unique(new)])
        position = pc.index_in(dictionary, value_set=self.categories).cast(pa.int32())
        codes = pc.take(position, column.indices).fill_null(-1)
        self.codes.append(codes)

    def finish(self) -> pd.Categorical:
        """The column as the pandas Categorical Arrow would give (categories' dtype included)."""
        import pyarrow as pa

        empty = pa.DictionaryArray.from_arrays(pa.array([], pa.int32()), self.categories,
                                               ordered=self.kind.ordered)
        dtype = empty.to_pandas().dtype  # Arrow's own conversion of the categories
        return pd.Categorical.from_codes(self.codes.finish(), dtype=dtype)


class GrowingTimes:
    """A timestamp column's values in a `GrowingColumn` of datetime64 (a null as NaT), tz-aware at the end."""

    def __init__(self, kind: pa.TimestampType) -> None:
        """An empty column of Arrow timestamp type `kind`."""
        self.dtype = _arrow_dtype(kind)
        self.values = GrowingColumn(np.dtype(f"datetime64[{kind.unit}]"))

    def append(self, column: pa.Array) -> None:
        """Add one batch's `column` (UTC instants if it has a time zone, as Arrow stores them)."""
        self.values.append(column)

    def finish(self) -> np.ndarray | pd.api.extensions.ExtensionArray:
        """The column as Arrow's `to_pandas` gives it: datetime64, or a DatetimeArray in its time zone."""
        values = self.values.finish()
        if isinstance(self.dtype, pd.DatetimeTZDtype):  # integers are taken as UTC instants, not copied
            return pd.array(values.astype(f"datetime64[{self.dtype.unit}]", copy=False).view(np.int64),
                            dtype=self.dtype, copy=False)
        return values.astype(self.dtype, copy=False)


class GrowingDates:
    """A date column coded as a categorical of its days (`GrowingCategorical`), Python dates at the end.

    Arrow's `to_pandas` makes a date column an object column of `datetime.date` (None for a null); here
    each distinct day becomes one such object, made by Arrow's own conversion, and the codes pick them.
    """

    def __init__(self, kind: pa.DataType) -> None:
        """An empty column of Arrow date type `kind`."""
        import pyarrow as pa

        self.days = GrowingCategorical(pa.dictionary(pa.int32(), kind))

    def append(self, column: pa.Array) -> None:
        """Add one batch's `column`, dictionary-encoded (its nulls as null indices)."""
        self.days.append(column.dictionary_encode())

    def finish(self) -> np.ndarray:
        """The column as Arrow's `to_pandas` gives it: `datetime.date` objects, None where null."""
        import pyarrow as pa

        categories = pa.table({"day": self.days.categories}).to_pandas()["day"]
        days = np.empty(len(categories) + 1, dtype=object)  # the last one None: code -1 (a null) takes it
        days[:-1] = categories.to_numpy()
        return days.take(self.days.codes.finish())


class GrowingText:
    """A text column as pandas' string array over copies of its batches, as Arrow's `to_pandas` makes it.

    Each batch's column is copied as it arrives (cast to `kind` as the string array holds it, in memory
    handed back at once: `returning_pool`), and every TEXT_GROUP_BYTES of copies joined into one chunk.
    """

    def __init__(self, dtype: Any, kind: pa.DataType) -> None:
        """An empty column of pandas `dtype` whose Arrow array holds `kind` (large_string)."""
        self.dtype, self.kind = dtype, kind
        self.chunks: list[pa.Array] = []
        self.pending: list[pa.Array] = []
        self.size = 0

    def append(self, column: pa.Array) -> None:
        """Add one batch's `column`, copied (the batch it came from can then be let go)."""
        import pyarrow as pa

        pool = returning_pool()
        self.pending.append(pa.concat_arrays([column], memory_pool=pool).cast(self.kind, memory_pool=pool))
        self.size += self.pending[-1].nbytes
        if self.size >= TEXT_GROUP_BYTES:
            self._join()

    def _join(self) -> None:
        """The pending copies as one more chunk."""
        import pyarrow as pa

        if len(self.pending) > 1:
            self.pending = [pa.concat_arrays(self.pending, memory_pool=returning_pool())]
        self.chunks += self.pending
        self.pending, self.size = [], 0

    def finish(self) -> pd.api.extensions.ExtensionArray:
        """The column as the pandas string array Arrow's `to_pandas` gives (its chunks, not copied)."""
        import pyarrow as pa

        self._join()
        column = self.dtype.__from_arrow__(pa.chunked_array(self.chunks, self.kind))
        self.chunks = []
        return column


def _arrow_dtype(kind: pa.DataType) -> Any:
    """The pandas dtype Arrow's `to_pandas` gives a column of `kind` (from an empty one)."""
    import pyarrow as pa

    return pa.table({"c": pa.array([], kind)}).to_pandas()["c"].dtype


def _text_kind(kind: pa.DataType) -> pa.DataType | None:
    """The Arrow type pandas' string array holds for a text column of `kind`; None: not built batch by batch.

    Only where Arrow's `to_pandas` gives pandas' Arrow-backed strings (pandas 3's `str`; with an older
    pandas text becomes Python objects, gathered and converted at the end as before).
    """
    import pyarrow as pa

    dtype = _arrow_dtype(kind) if pa.types.is_string(kind) or pa.types.is_large_string(kind) else None
    if dtype is None or not hasattr(dtype, "__from_arrow__"):
        return None
    held = getattr(dtype.__from_arrow__(pa.chunked_array([], kind)), "_pa_array", None)
    return None if held is None else held.type


def returning_pool() -> Any:
    """Arrow's jemalloc pool, else the system allocator's: memory the read frees goes back at once.

    Arrow sets jemalloc's decay to 0 (freed pages returned to the system at once); its default pool
    (mimalloc in the wheels) keeps them for a while.
    """
    import pyarrow as pa

    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc
        return pa.system_memory_pool()


def _new_map(size: int) -> mmap.mmap:
    """Private anonymous memory of `size` bytes, returned to the system when unmapped."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)


def is_growable(kind: pa.DataType) -> bool:
    """Whether a column of Arrow type `kind` goes straight into a NumPy array (integers and floats)."""
    import pyarrow as pa

    return pa.types.is_integer(kind) or pa.types.is_float32(kind) or pa.types.is_float64(kind)


Growing = GrowingColumn | GrowingCategorical | GrowingTimes | GrowingDates | GrowingText
"""A column built batch by batch: `append` each batch's column, `finish` once for the frame's column."""


def growing_column(kind: pa.DataType) -> Growing | None:
    """How a column of Arrow type `kind` is built batch by batch; None: gathered, converted at the end."""
    import pyarrow as pa

    if is_growable(kind):
        return GrowingColumn(np.dtype(kind.to_pandas_dtype()))
    if pa.types.is_dictionary(kind):
        return GrowingCategorical(kind)
    if pa.types.is_timestamp(kind):
        return GrowingTimes(kind)
    if pa.types.is_date(kind):
        return GrowingDates(kind)
    text = _text_kind(kind)
    return None if text is None else GrowingText(_arrow_dtype(kind), text)


def frame_of_batches(reader: pa.RecordBatchReader,
                     gather: Callable[[pa.RecordBatchReader], pa.Table]) -> pd.DataFrame:
    """`reader`'s batches as `reader.read_all().to_pandas()` gives them, at about one copy of the values.

    Each batch is let go once copied; `gather` keeps the other columns' batches as an Arrow table (in
    memory the batch does not hold), converted column by column at the end, each freed once converted.
    """
    import pyarrow as pa

    schema = reader.schema
    growing = {i: column for i, column in enumerate(map(growing_column, schema.types)) if column is not None}
    others = [i for i in range(len(schema)) if i not in growing]

    def rest() -> Iterator[pa.RecordBatch]:
        for batch in reader:
            for i, column in growing.items():
                column.append(batch.column(i))
            if others:
                yield batch.select(others)
            del batch

    other_schema = pa.schema([schema.field(i) for i in others])
    if others:
        table = gather(pa.RecordBatchReader.from_batches(other_schema, rest()))
        converted = table.to_pandas(self_destruct=True, split_blocks=True, use_threads=False)
        del table
    else:
        for _ in rest():
            pass
    columns: dict[int, Any] = {i: column.finish() for i, column in growing.items()}
    columns.update({i: converted.iloc[:, j] for j, i in enumerate(others)})
    frame = pd.DataFrame({i: columns[i] for i in range(len(schema))}, copy=False)
    frame.columns = pd.Index(schema.names)
    return frame
