"""A Parquet dataset folder (Hive-style partitions) or URL as an institution's table (issue #30)."""

from __future__ import annotations

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
