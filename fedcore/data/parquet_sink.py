"""Predictions delivered into a Parquet dataset partitioned by model and version (Hive style).

`<root>/model=<model>/version=<version>/<stem>-0.parquet`: one file per flow run of a model, named by the
agent from a digest of what a retry shares (`fedcore.data.delivery`), so a retried flow run replaces its
own file (whatever rows it read this time) and no other; an earlier attempt's file under another version
(a retry that loaded a newer `production`) is removed in the same step. The file is written into a hidden
temporary folder of the root, the earlier attempt's other files are moved into that folder, then the new
file is renamed into place: a failed write puts them back and leaves nothing half-written under the
dataset's partitions; a process killed between the two renames leaves no copy of the run, which its retry
writes. The root is the institution's own config's; model and version are those it stored or loaded itself
(safe names: `fedcore.names`).

The rows are streamed by pyarrow's ParquetWriter, a row group per BATCH_ROWS rows, so memory stays bounded
whatever the batch: pyarrow.dataset's writer reads ahead of the disk (4,000,000 predictions streamed from
16 parts peaked about 620 MiB above the process's baseline, more than the whole batch's 474 MiB of Arrow;
this writer about 55 MiB).
"""

from __future__ import annotations

import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from fedcore.data.delivery import BATCH_ROWS, prepare_delivery
from fedcore.errors import DataWriteError
from fedcore.files import DATA, make_folders

if TYPE_CHECKING:
    from fedcore.data.delivery import Delivery, PredictionBatches

PARTITIONS = ("model", "version")
"""The dataset's Hive partition columns, outermost first: folder names, not columns of the files."""


def deliver_to_dataset(root: Path, predictions: pd.DataFrame | PredictionBatches, model: str, version: str,
                       run_id: str, what: str, when: datetime | None = None) -> Path:
    """Write `predictions` (IDs and predicted values) into the dataset at `root` as run `run_id`.

    Returns the file written. Replaces the files of the same flow run of the model (`Delivery.key`),
    under any version; the other runs' files stay. A batch without rows writes no file and removes the
    run's earlier ones (a retry that found no rows leaves none), and returns the partition's folder.
    """
    delivery = prepare_delivery(predictions, model, version, run_id, what, when)
    partition = root / f"model={model}" / f"version={version}"
    path = partition / f"{delivery.stem}-0.parquet"
    tmp = root / f".tmp-{delivery.stem}"
    aside: list[tuple[Path, Path]] = []  # (an earlier attempt's file, where it waits in `tmp`)
    try:
        if delivery.num_rows == 0 and not _earlier_files(root, model, path.name, None):
            return partition
        make_folders(root)
        if tmp.exists():  # what a crashed attempt of this delivery left
            shutil.rmtree(tmp)
        make_folders(tmp)
        written = tmp / path.name
        if delivery.num_rows:
            _write_file(delivery, written)
            os.chmod(written, DATA)
            make_folders(partition)
        for index, earlier in enumerate(_earlier_files(root, model, path.name, path if delivery.num_rows
                                                       else None)):
            aside.append((earlier, tmp / f"earlier-{index}"))
            os.replace(earlier, aside[-1][1])
        if delivery.num_rows:
            os.replace(written, path)
        aside = []
    except OSError as error:
        for earlier, waiting in reversed(aside):  # the dataset as it was
            os.replace(waiting, earlier)
        raise DataWriteError(f"{what}: cannot write predictions to the dataset {str(root)!r}, nothing "
                             f"written: {error.strerror or error}; let the agent's user write there, or set "
                             "predictions.parquet.path to a folder it may write") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path if delivery.num_rows else partition


def _earlier_files(root: Path, model: str, name: str, kept: Path | None) -> list[Path]:
    """The run's files `name` under every version of `model` in the dataset but `kept` (replaced in place)."""
    folder = root / f"model={model}"
    if not folder.is_dir():
        return []
    return sorted(p for p in (v / name for v in folder.iterdir() if v.name.startswith("version="))
                  if p != kept and p.is_file())


def _write_file(delivery: Delivery, path: Path) -> None:
    """The delivery's rows but the partition columns into one Parquet file, BATCH_ROWS rows at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    kept = [i for i, field in enumerate(delivery.schema) if field.name not in PARTITIONS]
    schema = pa.schema([delivery.schema.field(i) for i in kept])
    with pq.ParquetWriter(path, schema) as writer:
        for batch in delivery.batches(BATCH_ROWS):
            writer.write_batch(batch.select(kept))
