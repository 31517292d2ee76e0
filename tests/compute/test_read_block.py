"""A Parquet block read batch by batch is its row group's slice as `to_pandas()` makes it (`read_block`)."""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedcore.compute.blocks import Block, parquet_blocks, read_block

ROWS = 90


def _table() -> pa.Table:
    """Floats, integers whose first null is in the last row group, text, categoricals, dates, times."""
    rng = np.random.default_rng(3)
    ids = np.arange(ROWS)
    return pa.table({
        "x": pa.array(rng.normal(size=ROWS)), "n": pa.array(ids, mask=(ids > 70) & (ids % 4 == 0)),
        "name": pa.array([None if i % 9 == 0 else f"n{i % 13}" for i in ids]),
        "plan": pa.array([f"p{i % 5}" for i in ids]).dictionary_encode(),
        "day": pa.array([datetime.date(2025, 1, 1) + datetime.timedelta(days=int(i % 17)) for i in ids],
                        mask=ids % 11 == 0),
        "at": pa.array(ids * 10**9, pa.timestamp("ns", tz="UTC"), mask=ids % 6 == 5),
        "flag": pa.array(ids % 3 == 0, mask=ids % 10 == 1)})


def _as_before(block: Block, columns: list[str]) -> pd.DataFrame:
    """What `read_block` gave before it read batch by batch: the row group read whole, sliced, converted."""
    table = pq.ParquetFile(str(block.path)).read_row_group(block.row_group, columns=[
        c for c in columns if c not in dict(block.partition)]).slice(block.group_start, block.n_rows)
    for name, value in block.partition:
        if name in columns:
            table = table.append_column(pa.field(name, value.type), pa.repeat(value, table.num_rows))
    return table.to_pandas()


def _recorded(monkeypatch) -> list[int]:
    """Count the reads that go batch by batch (`frame_of_batches`)."""
    import fedcore.data.batch_frame as batch_frame

    calls: list[int] = []
    built = batch_frame.frame_of_batches
    monkeypatch.setattr(batch_frame, "frame_of_batches", lambda *a: calls.append(1) or built(*a))
    return calls


@pytest.mark.parametrize("batch_rows", [7, 8_192])  # blocks cut across batches; a block in one batch
def test_every_block_is_the_row_groups_slice_as_before(tmp_path: Path, monkeypatch, batch_rows) -> None:
    monkeypatch.setattr("fedcore.compute.blocks.BLOCK_BATCH_ROWS", batch_rows)
    calls = _recorded(monkeypatch)
    path = tmp_path / "party.parquet"
    pq.write_table(_table(), path, row_group_size=40)  # row groups of 40, 40, 10
    blocks = parquet_blocks(path, 15)
    assert any(b.group_start for b in blocks) and len(blocks) == 7
    columns = ["flag", "x", "n", "name", "plan", "day", "at"]
    for block in blocks:
        frame, before = read_block(block, columns), _as_before(block, columns)
        pd.testing.assert_frame_equal(frame, before, check_exact=True)
        assert list(frame.dtypes) == list(before.dtypes)
        assert [repr(v) for v in frame["day"]] == [repr(v) for v in before["day"]]  # None where null
    assert len(calls) == len(blocks)
    whole = pd.concat([read_block(b, columns) for b in blocks], ignore_index=True)
    assert str(whole["n"].dtype) == "float64" and whole["n"].isna().sum() == 5


def test_partition_values_follow_the_files_columns(tmp_path: Path) -> None:
    path = tmp_path / "part.parquet"
    pq.write_table(_table(), path, row_group_size=50)
    partition = (("site", pa.scalar("north")), ("tier", pa.scalar(2, pa.int32())), ("gone", pa.scalar(None)))
    block = Block(1, 50, 75, str(path), row_group=1, group_start=0, partition=partition)
    frame = read_block(block, ["x", "tier", "name", "site"])
    pd.testing.assert_frame_equal(frame, _as_before(block, ["x", "tier", "name", "site"]), check_exact=True)
    assert list(frame.columns) == ["x", "name", "site", "tier"] and len(frame) == 25


def test_pandas_metadata_that_changes_a_dtype_is_kept(tmp_path: Path, monkeypatch) -> None:
    """A nullable integer column written by pandas comes back as pandas wrote it (converted whole)."""
    calls = _recorded(monkeypatch)
    frame = pd.DataFrame({"a": pd.array([1, None, 3] * 10, dtype="Int64"), "b": np.arange(30.0)})
    frame.to_parquet(tmp_path / "meta.parquet", row_group_size=30)
    plain = pd.DataFrame({"b": np.arange(30.0), "s": [f"s{i}" for i in range(30)]})
    plain.to_parquet(tmp_path / "plain.parquet")
    for name, expected, batched in (("meta", frame, 0), ("plain", plain, 1)):
        block = parquet_blocks(tmp_path / f"{name}.parquet", 100)[0]
        got = read_block(block, list(expected.columns))
        pd.testing.assert_frame_equal(got, _as_before(block, list(expected.columns)), check_exact=True)
        pd.testing.assert_frame_equal(got, expected, check_exact=True)
        assert len(calls) == batched, name
