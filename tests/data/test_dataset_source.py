"""A Parquet dataset folder (Hive-style partitions) or URL as an institution's table (issue #30).

A URL is opened by pyarrow's file systems (`file://` here), or by fsspec's when pyarrow has none for its
protocol (`memory://` here: no cloud service in the suite).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcore.agents.data import institution_from_config, read_files
from fedcore.config import parse_config
from fedcore.data.io import read_dataset
from fedcore.errors import DataReadError


def _frame(n: int = 60) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame({"customer_id": [f"C{i:03d}" for i in range(n)], "balance": rng.normal(size=n),
                         "region": rng.choice(["south", "north", "east"], n),
                         "churned": rng.integers(0, 2, n)})


def _write_partitioned(frame: pd.DataFrame, root: Path) -> pd.DataFrame:
    """`frame` as a dataset partitioned by region; the table a reader must give back (folders in order)."""
    for region, rows in frame.groupby("region", sort=True):
        folder = root / f"region={region}"
        folder.mkdir(parents=True)
        rows.drop(columns=["region"]).to_parquet(folder / "part-0.parquet", index=False)
    (root / ".tmp-unfinished").mkdir()  # what a writer in progress leaves: never read
    (root / ".tmp-unfinished" / "part-0.parquet").write_bytes(b"not parquet")
    (root / "_SUCCESS").write_text("")
    ordered = pd.concat([rows for _, rows in frame.groupby("region", sort=True)], ignore_index=True)
    return ordered[["customer_id", "balance", "churned", "region"]]


def test_a_partitioned_folder_and_its_url_read_as_its_files_in_order_with_the_partition_column(
        tmp_path) -> None:
    frame = _frame()
    expected = _write_partitioned(frame, tmp_path / "customers")
    for location in (str(tmp_path / "customers"), (tmp_path / "customers").as_uri()):
        read = read_dataset(location)
        pd.testing.assert_frame_equal(read, expected, check_exact=True, check_dtype=False)
        assert list(read["region"]) == list(expected["region"]) and read["region"].dtype.kind in "OT"
    pd.testing.assert_frame_equal(read_files(str(tmp_path / "customers"), "test"), read, check_exact=True)


def test_an_institution_reads_its_dataset_folder_or_url(tmp_path) -> None:
    """A folder is found beside the config; a URL is taken as given (not as a path beside the config)."""
    expected = _write_partitioned(_frame(), tmp_path / "customers")
    (tmp_path / "config").mkdir()
    for location in ("../customers", (tmp_path / "customers").as_uri()):
        raw = {"federation": "f", "consortium_key": {"env": "UNUSED"}, "institutions": [
            {"name": "bank", "data": location, "id_column": "customer_id", "label": "churned"}]}
        data = institution_from_config(parse_config(raw, tmp_path / "config" / "federation.yaml"), "bank")
        pd.testing.assert_frame_equal(data.frame, expected, check_exact=True, check_dtype=False)


def test_a_folder_without_parquet_files_is_one_line(tmp_path) -> None:
    (tmp_path / "empty" / "region=x").mkdir(parents=True)
    with pytest.raises(DataReadError) as refused:
        read_dataset(str(tmp_path / "empty"))
    assert str(refused.value) == (f"cannot read {str(tmp_path / 'empty')!r}: the dataset holds no .parquet "
                                  "file")


@pytest.fixture
def memory_url(tmp_path) -> Iterator[str]:
    """A URL in fsspec's in-memory file system (a protocol pyarrow has no file system for), emptied after."""
    import fsspec

    url = f"memory://{tmp_path.name}/customers"
    yield url
    memory = fsspec.filesystem("memory")
    if memory.exists(f"/{tmp_path.name}"):
        memory.rm(f"/{tmp_path.name}", recursive=True)


def test_a_url_pyarrow_cannot_open_is_read_through_fsspec_as_the_folder_is(tmp_path, memory_url) -> None:
    """memory:// (fsspec's, no mock): the same rows as the folder, in process and block by block."""
    import pickle

    import fsspec

    from fedcore.compute.blocks import parquet_blocks, read_block
    from fedcore.data.io import dataset_files

    expected = _write_partitioned(_frame(), tmp_path / "customers")
    fsspec.filesystem("memory").put(str(tmp_path / "customers"), memory_url.removeprefix("memory://"),
                                    recursive=True)
    pd.testing.assert_frame_equal(read_dataset(memory_url), expected, check_exact=True, check_dtype=False)
    files, schema = dataset_files(memory_url)
    assert [f.path.rsplit("/", 2)[1:] for f in files] == [[f"region={r}", "part-0.parquet"]
                                                          for r in ("east", "north", "south")]
    blocks = pickle.loads(pickle.dumps(parquet_blocks(files, block_rows=7)))  # as a Dask task carries them
    read = pd.concat([read_block(b, schema.names) for b in blocks], ignore_index=True)
    pd.testing.assert_frame_equal(read, read_dataset(str(tmp_path / "customers")), check_exact=True)
    raw = {"federation": "f", "consortium_key": {"env": "UNUSED"}, "institutions": [
        {"name": "bank", "data": memory_url, "id_column": "customer_id", "label": "churned"}]}
    data = institution_from_config(parse_config(raw, tmp_path / "federation.yaml"), "bank")
    pd.testing.assert_frame_equal(data.frame, expected, check_exact=True, check_dtype=False)


def test_a_url_no_file_system_reads_is_one_line(monkeypatch) -> None:
    """An unknown protocol, a protocol whose fsspec package is missing, and fsspec itself missing."""
    import importlib.util
    import sys

    with pytest.raises(DataReadError) as refused:
        read_dataset("bogus://lake/customers")
    assert str(refused.value) == (
        "cannot read the dataset 'bogus://lake/customers': neither pyarrow nor fsspec knows the protocol "
        "bogus://: use a URL of a file system they read (file://, s3://, gs://, ...), or a folder")
    assert importlib.util.find_spec("webdav4") is None, "this test needs webdav4 absent"
    with pytest.raises(DataReadError) as refused:
        read_dataset("webdav://lake/customers")
    assert str(refused.value) == ("cannot read the dataset 'webdav://lake/customers': webdav:// needs a "
                                  "package that is not installed: Install webdav4 to access WebDAV")
    monkeypatch.setitem(sys.modules, "fsspec", None)  # `import fsspec` then fails as if it were absent
    with pytest.raises(DataReadError) as refused:
        read_dataset("memory://lake/customers")
    assert str(refused.value) == (
        "cannot read the dataset 'memory://lake/customers': pyarrow has no file system for memory://, and "
        "fsspec, which may have one, is not installed: pip install fsspec")
