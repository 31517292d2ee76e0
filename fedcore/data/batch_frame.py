"""Arrow record batches into a pandas frame as they arrive: the read holds one copy of the values, not two.

A numeric column (integers, floats) is copied batch by batch into a NumPy array that grows in place
(`GrowingColumn`); the other columns (text, booleans, times) are gathered as Arrow chunks
(`fedcore.data.sql.owned_batches`) and converted at the end. The frame is `pa.Table.to_pandas()` of the
same batches (values, dtypes; an integer column with a null becomes float64 with NaN), with one pandas
block per column.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    import pyarrow as pa

RESERVE_BYTES = 64 * 2**20
"""Address space a growing column reserves at first (its pages are used only as rows arrive).

Above glibc's largest mmap threshold (32 MiB): the array is its own mapping, so growing it is a remap
(no copy, no second array) and shrinking it to its rows hands the rest back."""


class GrowingColumn:
    """A NumPy column filled batch by batch, grown (and finally shrunk) in place by `ndarray.resize`."""

    def __init__(self, dtype: np.dtype) -> None:
        """An empty column of `dtype` with RESERVE_BYTES reserved."""
        self.values = np.empty(max(1, RESERVE_BYTES // dtype.itemsize), dtype)
        self.rows = 0

    def append(self, column: pa.Array) -> None:
        """Add one batch's `column`; an integer column's first null turns the column into float64 with NaN.

        The same values as Arrow's `to_pandas`: nulls of a float column are NaN there too.
        """
        values = column.to_numpy(zero_copy_only=False)  # a batch's integers with nulls: float64, NaN
        if values.dtype != self.values.dtype and values.dtype.kind == "f":
            self.values = self.values[:self.rows].astype(values.dtype)
        end = self.rows + len(values)
        if end > len(self.values):
            self.values.resize(max(end, 2 * len(self.values)), refcheck=False)
        self.values[self.rows:end] = values
        self.rows = end

    def finish(self) -> np.ndarray:
        """The column, its spare capacity given back."""
        self.values.resize(self.rows, refcheck=False)
        return self.values


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
    numeric = [i for i, field in enumerate(schema) if is_growable(field.type)]
    others = [i for i in range(len(schema)) if i not in numeric]
    growing = {i: GrowingColumn(np.dtype(schema.field(i).type.to_pandas_dtype())) for i in numeric}

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
