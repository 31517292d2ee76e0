"""A predictions dataset folder (an agent on Dask) takes the in-process file's name and never overwrites."""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd

from fedcore.agents.data import InstitutionData
from fedcore.agents.storage import new_prediction_folder, part_file, place_parts, write_parquet

WHEN = datetime(2026, 11, 27, 19, 5, 0, tzinfo=UTC)


def test_a_predictions_folder_is_named_like_the_file_and_never_reuses_a_name(tmp_path) -> None:
    data = InstitutionData(name="north", frame=pd.DataFrame(), id_column="id", label=None,
                           registry=tmp_path / "registry", predictions_dir=tmp_path / "predictions")
    tmp, path = new_prediction_folder(data, ("waveform", "v0003"), WHEN)
    assert path == tmp_path / "predictions" / "waveform-v0003-20261127T190500Z.parquet"
    assert tmp == path.with_name(".waveform-v0003-20261127T190500Z.parquet.tmp") and tmp.is_dir()
    write_parquet(part_file(tmp, 0), pd.DataFrame({"id": ["a"], "prediction": [1.0]}))
    write_parquet(part_file(tmp, 12), pd.DataFrame({"id": ["b"], "prediction": [2.0]}))
    assert sorted(p.name for p in tmp.iterdir()) == ["part-00000.parquet", "part-00012.parquet"]
    assert (part_file(tmp, 0).stat().st_mode & 0o777) == 0o640
    tmp.replace(path)
    assert list(pd.read_parquet(path)["id"]) == ["a", "b"]

    stale = tmp_path / "predictions" / ".waveform-v0003-20261127T190500Z-2.parquet.tmp"
    stale.mkdir()
    (stale / "part-00007.parquet").touch()
    tmp, again = new_prediction_folder(data, ("waveform", "v0003"), WHEN)  # the name is taken: -2
    assert again == tmp_path / "predictions" / "waveform-v0003-20261127T190500Z-2.parquet"
    assert tmp.is_dir() and list(tmp.iterdir()) == []  # a crashed run's parts are gone
    assert list(pd.read_parquet(path)["id"]) == ["a", "b"]


def test_no_prediction_parts_deliver_nothing_into_a_sink_and_leave_no_folder(tmp_path) -> None:
    """A batch of no rows on Dask has no blocks, so no part: no columns to deliver, nothing written."""
    data = InstitutionData(name="north", frame=pd.DataFrame(), id_column="id", label=None,
                           registry=tmp_path / "registry", predictions_dir=tmp_path / "predictions",
                           predictions_dataset=tmp_path / "scores")
    tmp, path = new_prediction_folder(data, ("waveform", "v0003"), WHEN)
    where = place_parts(data, tmp, path, 0, ("waveform", "v0003"), "run-1")
    assert where == tmp_path / "scores" / "model=waveform" / "version=v0003"  # where its rows would be
    assert list((tmp_path / "predictions").iterdir()) == [] and not (tmp_path / "scores").exists()
