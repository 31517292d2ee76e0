"""Reading a user's table from disk: .parquet or .csv, with one-line errors naming the file."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fedcore.data.dialect import CsvDialect
from fedcore.errors import DataReadError, FedForestError

TABLE_SUFFIXES = (".parquet", ".csv")


def read_table(path: str | Path, dialect: CsvDialect | None = None) -> pd.DataFrame:
    """Read a .parquet or .csv table (`dialect`: how a CSV is written).

    Any failure becomes a one-line `DataReadError` naming the file.
    """
    from fedcore.data.datasets import load_table

    path = Path(path)
    if path.suffix.lower() not in TABLE_SUFFIXES:
        raise DataReadError(f"cannot read {str(path)!r}: expected a .parquet or .csv file, found suffix "
                            f"{path.suffix!r}")
    if not path.exists():
        raise DataReadError(f"cannot read {str(path)!r}: no such file")
    if path.is_dir():
        raise DataReadError(f"cannot read {str(path)!r}: it is a directory")
    try:
        return load_table(path, dialect)
    except FedForestError:
        raise
    except Exception as error:  # pandas and pyarrow raise many unrelated types for a bad file
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DataReadError(f"cannot read {str(path)!r}: {type(error).__name__}: {reason}") from error
