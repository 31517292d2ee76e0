"""The delivered rows and their digest do not depend on how the predictions arrive (issue #30).

A frame predicted in the agent's process and the part files a Dask party's workers wrote (one per block, of
any sizes) give the same digest, row count and delivered batches; the digest is the SHA-256 of the rows'
Arrow IPC stream in BATCH_ROWS-row batches, each made anew (a sliced batch's IPC bytes differ).
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedcore.agents.storage import part_file, write_parquet
from fedcore.data.delivery import BATCH_ROWS, PredictionBatches, prepare_delivery, rows_sha256
from fedcore.data.parquet_sink import deliver_to_dataset
from fedcore.errors import DataWriteError

WHEN = datetime(2026, 11, 27, 8, 30, tzinfo=UTC)
ROWS = 2 * BATCH_ROWS + 17_000  # three digest batches, the last one short


def _predictions(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    proba = rng.random(n)
    return pd.DataFrame({"customer_id": [f"C{i:06d}" for i in range(n)],
                         "prediction": np.where(proba > 0.5, "churn", "stay"), "proba_churn": proba,
                         "proba_stay": 1 - proba})


def _parts(frame: pd.DataFrame, folder, cuts: list[int]) -> list:
    """`frame` as the workers write it: a part file per block, the blocks cut at `cuts`."""
    folder.mkdir()
    bounds = [0, *cuts, len(frame)]
    for index, (start, end) in enumerate(zip(bounds, bounds[1:], strict=False)):
        write_parquet(part_file(folder, index), frame.iloc[start:end])
    return sorted(folder.iterdir())


def test_the_digest_and_the_delivered_rows_do_not_depend_on_how_the_rows_arrive(tmp_path) -> None:
    frame = _predictions(ROWS)
    whole = PredictionBatches.of_frame(frame)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    uneven = PredictionBatches(whole.schema, lambda: table.to_batches(max_chunksize=7_001))
    parts = PredictionBatches.of_parts(_parts(frame, tmp_path / "parts", [1, 40_000, 40_003, 131_072]),
                                       "institution 'bank'")
    sink = pa.BufferOutputStream()  # the definition: the IPC stream of BATCH_ROWS-row batches, each made
    with pa.ipc.new_stream(sink, whole.schema) as writer:  # anew (a slice's IPC bytes are another's)
        for start in range(0, ROWS, BATCH_ROWS):
            rows = frame.iloc[start:start + BATCH_ROWS]
            writer.write_batch(pa.RecordBatch.from_pydict({c: rows[c].tolist() for c in rows}, whole.schema))
    expected = hashlib.sha256(sink.getvalue())
    assert rows_sha256(whole) == rows_sha256(uneven) == rows_sha256(parts) == (expected.hexdigest(), ROWS)
    deliveries = [prepare_delivery(p, "churn", "v0001", "run-a", "bank", WHEN)
                  for p in (whole, uneven, parts)]
    assert len({d.key for d in deliveries}) == 1 and len({d.stem for d in deliveries}) == 1
    delivered = [pa.Table.from_batches(list(d.batches(16_384)), d.schema) for d in deliveries]
    assert [b.num_rows for b in deliveries[2].batches(16_384)] == [16_384] * 9 + [ROWS - 9 * 16_384]
    assert delivered[1].equals(delivered[0]) and delivered[2].equals(delivered[0])
    assert delivered[0].select(list(frame.columns)).to_pandas().equals(frame)
    path = deliver_to_dataset(tmp_path / "scores", parts, "churn", "v0001", "run-a", "bank", WHEN)
    written = pq.ParquetFile(path)  # streamed: a row group per digest batch, never the whole at once
    assert path.name == f"{deliveries[0].stem}-0.parquet"
    assert [written.metadata.row_group(i).num_rows for i in range(written.metadata.num_row_groups)] == [
        BATCH_ROWS, BATCH_ROWS, ROWS - 2 * BATCH_ROWS]
    assert written.read().equals(delivered[0].drop_columns(["model", "version"]))
    changed = frame.copy()
    changed.loc[ROWS - 1, "proba_stay"] += 1e-12  # one value in the last batch: another digest
    assert rows_sha256(PredictionBatches.of_frame(changed))[0] != expected.hexdigest()


def test_a_part_of_other_types_is_refused_before_anything_is_written(tmp_path) -> None:
    frame = _predictions(10)
    files = _parts(frame, tmp_path / "parts", [4])
    write_parquet(files[1], frame.iloc[4:].astype({"proba_churn": "float32"}))
    parts = PredictionBatches.of_parts(files, "institution 'bank'")
    with pytest.raises(DataWriteError) as refused:
        prepare_delivery(parts, "churn", "v0001", "run-a", "institution 'bank'", WHEN)
    assert str(refused.value) == (
        f"institution 'bank': the prediction part {str(files[1])!r} has other columns or types than "
        f"{str(files[0])!r}, nothing written: the Dask workers must run the agent's fedforest version")
