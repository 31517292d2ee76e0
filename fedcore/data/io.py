"""Reading a user's table from disk: .parquet or .csv files, or a Parquet dataset folder or URL.

Errors are one line naming the file or dataset.
"""

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


def is_dataset(location: str) -> bool:
    """Whether `location` names a Parquet dataset: a folder, or a URL pyarrow opens (s3://, gs://, file://)."""
    return "://" in location or Path(location).is_dir()


def read_dataset(location: str) -> pd.DataFrame:
    """A Parquet dataset folder or URL as one table.

    Its `.parquet` files in path order (hidden `.`/`_` entries skipped), with the values of Hive-style
    `key=value` folders as columns after the files' own (`region=north/part-0.parquet` adds `region`).
    Object storage is reached through pyarrow's own file systems (S3, GCS, ...), with their usual
    credentials in the environment.
    """
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs

    try:
        if "://" in location:
            filesystem, root = pafs.FileSystem.from_uri(location)
        else:
            filesystem, root = pafs.LocalFileSystem(), str(Path(location).resolve())
        entries = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
        files = sorted(e.path for e in entries if e.is_file and e.path.endswith(".parquet")
                       and not any(part.startswith((".", "_")) for part in e.path[len(root):].split("/")))
        if not files:
            raise DataReadError(f"cannot read {location!r}: the dataset holds no .parquet file")
        partitioning = ds.HivePartitioning.discover(infer_dictionary=False)
        dataset = ds.dataset(files, filesystem=filesystem, format="parquet", partitioning=partitioning,
                             partition_base_dir=root)
        return dataset.to_table().to_pandas()
    except FedForestError:
        raise
    except (OSError, pa.ArrowException) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DataReadError(f"cannot read the dataset {location!r}: {type(error).__name__}: "
                            f"{reason}") from None
