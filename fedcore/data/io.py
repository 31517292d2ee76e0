"""Reading a user's table from disk: .parquet or .csv files, or a Parquet dataset folder or URL.

A URL is opened with pyarrow's own file systems, else with fsspec's (`url_filesystem`).

Errors are one line naming the file or dataset.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from fedcore.data.dialect import CsvDialect
from fedcore.errors import DataReadError, FedForestError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyarrow.dataset import Dataset
    from pyarrow.fs import FileSystem

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
    """Whether `location` names a Parquet dataset: a folder, or a URL (s3://, gs://, file://, ...)."""
    return "://" in location or Path(location).is_dir()


@dataclass(frozen=True)
class DatasetFile:
    """One `.parquet` file of a dataset: its path on `filesystem` and its Hive partition values.

    `partition`: (column, value) per partition column of the dataset, in its order, each value typed as the
    whole dataset types that column (a file outside a `key=value` folder, or under `key=__HIVE_DEFAULT_...`,
    has a null there), so a reader that appends them to the file's own columns gets `read_dataset`'s rows.
    """

    path: str
    filesystem: FileSystem | None
    """None: the local disk."""
    partition: tuple[tuple[str, pa.Scalar], ...] = ()


def read_dataset(location: str) -> pd.DataFrame:
    """A Parquet dataset folder or URL as one table.

    Its `.parquet` files in path order (hidden `.`/`_` entries skipped), with the values of Hive-style
    `key=value` folders as columns after the files' own (`region=north/part-0.parquet` adds `region`).
    Object storage is reached through pyarrow's own file systems (S3, GCS, ...), with their usual
    credentials in the environment, or through fsspec's for a protocol pyarrow has none for
    (`url_filesystem`).
    """
    dataset, _ = _open_dataset(location)
    with _read_errors(location):
        return dataset.to_table().to_pandas()


def dataset_files(location: str) -> tuple[list[DatasetFile], pa.Schema]:
    """The files of the dataset `read_dataset` reads, in its order, and the schema of its table.

    Metadata only (a listing and one file's footer): what Dask workers need to read the dataset file by
    file and give `read_dataset`'s rows (`fedcore.compute.blocks`). The schema is the first file's columns
    and then the partition columns.
    """
    import pyarrow as pa
    import pyarrow.dataset as ds

    dataset, filesystem = _open_dataset(location)
    with _read_errors(location):
        schema = dataset.schema
        fragments = [(f.path, ds.get_partition_keys(f.partition_expression)) for f in dataset.get_fragments()]
    # the partition columns: those a file's folders name (`dataset.partitioning.schema` is the whole schema
    # when there are none), in the table's order; a file whose folders do not name one has a null there
    named = {name for _, keys in fragments for name in keys}
    columns = [name for name in schema.names if name in named]
    typed = [(name, schema.field(name).type) for name in columns]
    files = [DatasetFile(path, filesystem, tuple((name, pa.scalar(keys.get(name), type=kind))
                                                 for name, kind in typed))
             for path, keys in fragments]
    return files, schema


def _open_dataset(location: str) -> tuple[Dataset, FileSystem]:
    """The dataset at `location` (files listed, Hive partitions parsed, no row read) and its file system.

    The one place a dataset's files and partition values are decided, for the agent and for the workers.
    """
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs

    with _read_errors(location):
        if "://" in location:
            filesystem, root = url_filesystem(location)
        else:
            filesystem, root = pafs.LocalFileSystem(), str(Path(location).resolve())
        entries = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
        files = sorted(e.path for e in entries if e.is_file and e.path.endswith(".parquet")
                       and not any(part.startswith((".", "_")) for part in e.path[len(root):].split("/")))
        if not files:
            raise DataReadError(f"cannot read {location!r}: the dataset holds no .parquet file")
        partitioning = ds.HivePartitioning.discover(infer_dictionary=False)
        return ds.dataset(files, filesystem=filesystem, format="parquet", partitioning=partitioning,
                          partition_base_dir=root), filesystem


def url_filesystem(location: str) -> tuple[FileSystem, str]:
    """The file system of a dataset URL and the dataset's path on it.

    pyarrow's own file system where it has one (file://, s3://, gs://, hdfs://, abfs://); else fsspec's
    for the protocol (memory://, az://, sftp://, ... with the fsspec package that implements it, e.g.
    adlfs), wrapped as a pyarrow file system, so the rest reads it as it reads pyarrow's. A protocol
    neither knows, or whose fsspec package is missing, is one line naming it.
    """
    import pyarrow as pa
    import pyarrow.fs as pafs

    try:
        return pafs.FileSystem.from_uri(location)
    except pa.ArrowInvalid as error:
        if "Unrecognized filesystem type" not in str(error):
            raise
    protocol = location.split("://", 1)[0]
    try:
        import fsspec
    except ImportError:
        raise DataReadError(f"cannot read the dataset {location!r}: pyarrow has no file system for "
                            f"{protocol}://, and fsspec, which may have one, is not installed: pip install "
                            "fsspec") from None
    try:
        filesystem, root = fsspec.core.url_to_fs(location)
    except ValueError as error:
        if not str(error).startswith("Protocol not known"):
            raise
        raise DataReadError(f"cannot read the dataset {location!r}: neither pyarrow nor fsspec knows the "
                            f"protocol {protocol}://: use a URL of a file system they read (file://, s3://, "
                            "gs://, ...), or a folder") from None
    except ImportError as error:  # fsspec knows the protocol; the package implementing it is missing
        raise DataReadError(f"cannot read the dataset {location!r}: {protocol}:// needs a package that "
                            f"is not installed: {error}") from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(filesystem)), root


@contextmanager
def _read_errors(location: str) -> Iterator[None]:
    """The errors of pyarrow reading the dataset at `location` as one line naming it."""
    import pyarrow as pa

    try:
        yield
    except FedForestError:
        raise
    except (OSError, pa.ArrowException) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DataReadError(f"cannot read the dataset {location!r}: {type(error).__name__}: "
                            f"{reason}") from None
