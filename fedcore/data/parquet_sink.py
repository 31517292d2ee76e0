"""Predictions delivered into a Parquet dataset partitioned by model and version (Hive style).

`<root>/model=<model>/version=<version>/<stem>-0.parquet`, streamed by pyarrow.dataset: one file per
delivery, named by the agent from a digest of what a retry shares (`fedcore.data.delivery`), so a retried
flow run replaces its own file and no other. The file is written into a hidden temporary folder of the
root, then renamed into place: a failed write leaves nothing half-written under the dataset's partitions.
The root is the institution's own config's; model and version are those it stored or loaded itself.
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
    from fedcore.data.delivery import PredictionBatches

PARTITIONS = ("model", "version")
"""The dataset's Hive partition columns, outermost first."""


def deliver_to_dataset(root: Path, predictions: pd.DataFrame | PredictionBatches, model: str, version: str,
                       run_id: str, what: str, when: datetime | None = None) -> Path:
    """Write `predictions` (IDs and predicted values) into the dataset at `root` as run `run_id`.

    Returns the file written. Replaces the file of the same delivery (`Delivery.key`); the other runs'
    files stay. The rows are streamed in BATCH_ROWS-row batches, in order. A batch without rows writes no
    file (a dataset has no rows to add) and returns the partition's folder.
    """
    import pyarrow.dataset as ds

    delivery = prepare_delivery(predictions, model, version, run_id, what, when)
    if delivery.num_rows == 0:
        return root / f"model={model}" / f"version={version}"
    tmp = root / f".tmp-{delivery.stem}"
    try:
        make_folders(root)
        if tmp.exists():  # what a crashed attempt of this delivery left
            shutil.rmtree(tmp)
        ds.write_dataset(delivery.reader(BATCH_ROWS), tmp, format="parquet", partitioning=list(PARTITIONS),
                         partitioning_flavor="hive", basename_template=f"{delivery.stem}-{{i}}.parquet",
                         preserve_order=True)
        (written,) = tmp.rglob("*.parquet")  # one partition, one file: renamed at once
        path = root / written.relative_to(tmp)
        os.chmod(written, DATA)
        make_folders(path.parent)
        os.replace(written, path)
    except OSError as error:
        raise DataWriteError(f"{what}: cannot write predictions to the dataset {str(root)!r}, nothing "
                             f"written: {error.strerror or error}; let the agent's user write there, or set "
                             "predictions.parquet.path to a folder it may write") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
