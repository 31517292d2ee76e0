"""Predictions delivered into a Parquet dataset partitioned by model and version (Hive style).

One file per flow run of a model, named by the agent: a retried run replaces its own file whatever rows it
read (under any version), other runs' files stay; a failed write is one line and leaves the dataset as it
was.
"""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime, timedelta

import pandas as pd
import pyarrow.dataset as ds
import pytest

from fedcore.data.delivery import PredictionBatches
from fedcore.data.parquet_sink import deliver_to_dataset
from fedcore.errors import DataWriteError

WHEN = datetime(2026, 11, 27, 8, 30, tzinfo=UTC)


def _predictions(n: int, offset: int = 0) -> pd.DataFrame:
    return pd.DataFrame({"customer_id": [f"C{i:03d}" for i in range(offset, offset + n)],
                         "prediction": ["churn" if i % 3 else "stay" for i in range(n)],
                         "proba_churn": [i / n for i in range(n)]})


def _rows(root) -> pd.DataFrame:
    table = ds.dataset(root, format="parquet", partitioning="hive").to_table().to_pandas()
    return table.sort_values(["version", "run_id", "customer_id"], ignore_index=True)


def test_a_retried_delivery_replaces_its_own_file_and_other_runs_stay(tmp_path) -> None:
    root = tmp_path / "scores"
    first = deliver_to_dataset(root, _predictions(4, 10), "churn", "v0001", "run-a", "bank", WHEN)
    retried = deliver_to_dataset(root, _predictions(4, 10), "churn", "v0001", "run-a", "bank",
                                 WHEN + timedelta(minutes=5))
    assert retried == first and first.parent == root / "model=churn" / "version=v0001"
    assert stat.S_IMODE(os.stat(first).st_mode) == 0o640
    rows = _rows(root)
    pd.testing.assert_frame_equal(rows[["customer_id", "prediction", "proba_churn"]], _predictions(4, 10),
                                  check_exact=True)
    assert (rows["predicted_at"] == pd.Timestamp(WHEN + timedelta(minutes=5))).all()
    deliver_to_dataset(root, _predictions(3), "churn", "v0001", "run-b", "bank", WHEN)
    deliver_to_dataset(root, _predictions(2), "upsell", "v0001", "run-a", "bank", WHEN)
    counts = _rows(root).groupby(["model", "version", "run_id"]).size().to_dict()
    assert counts == {("churn", "v0001", "run-a"): 4, ("churn", "v0001", "run-b"): 3,
                      ("upsell", "v0001", "run-a"): 2}
    assert sorted(p.name for p in root.iterdir()) == ["model=churn", "model=upsell"], "no temporary folder"
    empty = deliver_to_dataset(root, _predictions(0), "churn", "v0003", "run-c", "bank", WHEN)
    assert empty == root / "model=churn" / "version=v0003" and not empty.exists(), "no rows, no file"


def test_a_retry_that_read_other_rows_leaves_exactly_its_new_rows_once(tmp_path) -> None:
    """The run's batch lost, gained and changed rows since its first attempt, which delivered them.

    The retry (same run id) replaces the first attempt's file, also under another version; others stay.
    """
    root = tmp_path / "scores"
    deliver_to_dataset(root, _predictions(3, 20), "churn", "v0001", "run-b", "bank", WHEN)
    first = deliver_to_dataset(root, _predictions(5), "churn", "v0001", "run-a", "bank", WHEN)
    changed = pd.concat([_predictions(5).iloc[1:], _predictions(2, 10)], ignore_index=True)
    changed.loc[0, "proba_churn"] = 0.5
    assert deliver_to_dataset(root, changed, "churn", "v0001", "run-a", "bank", WHEN) == first
    rows = _rows(root)
    retried = rows.loc[rows["run_id"] == "run-a"].reset_index(drop=True)
    pd.testing.assert_frame_equal(retried[changed.columns], changed.sort_values("customer_id",
                                                                                ignore_index=True),
                                  check_exact=True)
    assert rows["run_id"].value_counts().to_dict() == {"run-a": 6, "run-b": 3}
    moved = deliver_to_dataset(root, _predictions(2, 30), "churn", "v0002", "run-a", "bank", WHEN)
    assert moved.parent.name == "version=v0002" and not first.exists()
    assert _rows(root).groupby(["run_id", "version"]).size().to_dict() == {("run-a", "v0002"): 2,
                                                                           ("run-b", "v0001"): 3}
    deliver_to_dataset(root, PredictionBatches.nothing(), "churn", "v0001", "run-a", "bank", WHEN)
    assert _rows(root)["run_id"].tolist() == ["run-b"] * 3, "a retry that found no rows leaves none"
    assert sorted(p.name for p in root.iterdir()) == ["model=churn"], "no temporary folder left"


def test_a_retry_that_fails_puts_the_earlier_attempts_file_back(tmp_path) -> None:
    """The new file cannot take its place (a folder holds its name) after the v0001 file was moved aside."""
    from fedcore.data.delivery import prepare_delivery

    root = tmp_path / "scores"
    first = deliver_to_dataset(root, _predictions(5), "churn", "v0001", "run-a", "bank", WHEN)
    stem = prepare_delivery(_predictions(2, 30), "churn", "v0002", "run-a", "bank", WHEN).stem
    assert first.name == f"{stem}-0.parquet", "one name per run of the model, whatever the version"
    blocker = root / "model=churn" / "version=v0002" / first.name
    (blocker / "inside").mkdir(parents=True)
    with pytest.raises(DataWriteError) as refused:
        deliver_to_dataset(root, _predictions(2, 30), "churn", "v0002", "run-a", "institution 'bank'", WHEN)
    assert str(refused.value).startswith(f"institution 'bank': cannot write predictions to the dataset "
                                         f"{str(root)!r}, nothing written: ")
    pd.testing.assert_frame_equal(pd.read_parquet(first)[["customer_id", "prediction", "proba_churn"]],
                                  _predictions(5), check_exact=True)
    assert sorted(p.name for p in root.iterdir()) == ["model=churn"], "no temporary folder left"


def test_a_failed_write_is_one_line_and_leaves_nothing(tmp_path) -> None:
    root = tmp_path / "scores"
    deliver_to_dataset(root, _predictions(4), "churn", "v0001", "run-a", "bank", WHEN)
    (root / "model=churn" / "version=v0002").write_text("a file where the partition's folder goes")
    with pytest.raises(DataWriteError) as refused:
        deliver_to_dataset(root, _predictions(2), "churn", "v0002", "run-b", "institution 'bank'", WHEN)
    assert str(refused.value) == (
        f"institution 'bank': cannot write predictions to the dataset {str(root)!r}, nothing written: Not a "
        "directory; let the agent's user write there, or set predictions.parquet.path to a folder it may "
        "write")
    assert sorted(p.name for p in root.iterdir()) == ["model=churn"]
    assert len(pd.read_parquet(root / "model=churn" / "version=v0001")) == 4


def test_a_column_the_delivery_adds_is_refused(tmp_path) -> None:
    with pytest.raises(DataWriteError, match="^bank: the predictions already have a column 'run_id', which "):
        deliver_to_dataset(tmp_path, _predictions(2).rename(columns={"customer_id": "run_id"}), "churn",
                           "v0001", "run-a", "bank", WHEN)
    assert list(tmp_path.iterdir()) == []


def test_the_config_names_the_dataset_and_nothing_else(tmp_path) -> None:
    from fedcore.config import parse_config
    from fedcore.errors import ConfigError

    raw = {"federation": "f", "setting": "horizontal", "consortium_key": {"env": "UNUSED"},
           "institutions": [{"name": "bank", "id_column": "id", "label": "y", "data": "t.parquet",
                             "predictions": {"parquet": {"path": "scores"}}}]}
    bank = parse_config(raw, tmp_path / "federation.yaml").institution("bank")
    assert bank.predictions_dataset == tmp_path / "scores" and bank.predictions_sql is None
    raw["institutions"][0]["predictions"] = {"parquet": {"path": "scores", "partition_by": ["run_id"]}}
    with pytest.raises(ConfigError) as refused:
        parse_config(raw, tmp_path / "federation.yaml")
    assert str(refused.value) == (f"{tmp_path / 'federation.yaml'}: institution 'bank': predictions: "
                                  "expected {parquet: {path: folder}} (a dataset partitioned by model and "
                                  "version)")
