"""Arrow record batches into a pandas frame as they arrive: the read holds one copy of the values, not two.

A numeric column (integers, floats) is copied batch by batch into a NumPy array in a memory map that
grows in place (`GrowingColumn`), and so are a categorical (dictionary) column's codes, its batches'
dictionaries unified as they arrive (`GrowingCategorical`); the other columns (text, booleans, times) are
gathered as Arrow chunks
(`fedcore.data.sql.owned_batches`) and converted at the end. The frame is `pa.Table.to_pandas()` of the
same batches (values, dtypes; an integer column with a null becomes float64 with NaN), with one pandas
block per column.
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


def _new_map(size: int) -> mmap.mmap:
    """Private anonymous memory of `size` bytes, returned to the system when unmapped."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)


def is_growable(kind: pa.DataType) -> bool:
    """Whether a column of Arrow type `kind` goes straight into a NumPy array (integers and floats)."""
    import pyarrow as pa

    return pa.types.is_integer(kind) or pa.types.is_float32(kind) or pa.types.is_float64(kind)


def frame_of_batches(reader: pa.RecordBatchReader,
                     gather: Callable[[pa.RecordBatchReader], pa.Table]) -> pd.DataFrame:
    """`reader`'s batches as `reader.read_all().to_pandas()` gives them, at about one copy of the values.

    Each batch is let go once copied; `gather` keeps the other columns' batches as an Arrow table (in
    memory the batch does not hold), converted column by column at the end, each freed once converted.
    """
    import pyarrow as pa

    schema = reader.schema
    growing: dict[int, GrowingColumn | GrowingCategorical] = {}
    for i, field in enumerate(schema):
        if is_growable(field.type):
            growing[i] = GrowingColumn(np.dtype(field.type.to_pandas_dtype()))
        elif pa.types.is_dictionary(field.type):
            growing[i] = GrowingCategorical(field.type)
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
