"""Model directories: save -> load gives identical predictions.

Tampered, partial or foreign versions are refused.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from fedcore.data.split import split_vertical
from fedcore.errors import ArtifactError
from fedcore.models import artifacts
from fedcore.models.artifacts import (
    decode_classes,
    encode_classes,
    read_version,
    write_version,
)
from fedcore.vertical.estimators import FederatedForestClassifier, FederatedForestRegressor
from fedcore.vertical.persistence import party_file_stem
from tests.conftest import mixed_table

LABEL = "target"


def _features(parties: list[pd.DataFrame]) -> list[pd.DataFrame]:
    return [p.drop(columns=LABEL, errors="ignore") for p in parties]


def _fit(cls, frame: pd.DataFrame):
    parties = split_vertical(frame, 3, label=LABEL, seed=0)
    return cls(n_estimators=5, max_depth=5).fit(parties, label=LABEL), _features(parties)


@pytest.fixture(scope="module")
def string_labels():
    return _fit(FederatedForestClassifier, mixed_table(n_rows=300, seed=0))


@pytest.fixture(scope="module")
def int_labels():
    frame = mixed_table(n_rows=300, seed=1)
    frame[LABEL] = frame[LABEL].map({"class_0": 10, "class_1": 20, "class_2": 30}).astype(np.int64)
    return _fit(FederatedForestClassifier, frame)


@pytest.fixture(scope="module")
def regression():
    return _fit(FederatedForestRegressor, mixed_table(n_rows=300, seed=2, task="regression"))


@pytest.fixture
def saved(string_labels, tmp_path):
    model, _ = string_labels
    path = tmp_path / "model"
    model.save(path)
    return path


def _assert_same_predictions(model, loaded, X) -> None:
    for method in ("one-round", "node-by-node"):
        before, after = model.predict(X, method), loaded.predict(X, method)
        assert before.dtype == after.dtype
        assert np.array_equal(before, after)
        if hasattr(model, "predict_proba"):
            assert np.array_equal(model.predict_proba(X, method), loaded.predict_proba(X, method))


@pytest.mark.parametrize("fixture", ["string_labels", "int_labels", "regression"])
def test_save_then_load_predicts_identically(fixture, request, tmp_path) -> None:
    model, X = request.getfixturevalue(fixture)
    model.save(tmp_path / "model")
    loaded = type(model).load(tmp_path / "model")
    _assert_same_predictions(model, loaded, X)
    assert loaded.params == model.params


def test_loaded_classes_keep_their_dtype(int_labels, string_labels, tmp_path) -> None:
    for name, (model, _) in {"ints": int_labels, "strings": string_labels}.items():
        model.save(tmp_path / name)
        classes = FederatedForestClassifier.load(tmp_path / name).classes_
        assert classes.dtype == model.classes_.dtype and np.array_equal(classes, model.classes_)
        assert [type(c) for c in classes] == [type(c) for c in model.classes_]


def test_manifest_describes_the_model(string_labels, saved) -> None:
    model, _ = string_labels
    manifest = json.loads((saved / "manifest.json").read_text())
    assert manifest["format_version"] == 1 and manifest["algorithm"] == "forest"
    assert manifest["setting"] == "vertical" and manifest["task"] == "classification"
    assert manifest["params"] == model.params.to_dict()
    files = {f["name"]: f for f in manifest["files"]}
    assert set(files) == {"master.arrow"} | {f"{p.name}.arrow" for p in model.parties_}
    roles = {p["name"]: p["role"] for p in manifest["parties"]}
    assert roles == {p.name: "label_holder" if p.is_label_holder else "passive" for p in model.parties_}
    for party in manifest["parties"]:
        assert files[party["file"]]["sha256"] == party["sha256"]
    assert manifest["label"] == LABEL and manifest["n_rows"] == 300


def test_tables_hold_the_split_of_knowledge(saved) -> None:
    manifest, tables = read_version(saved)
    assert not {"feature", "threshold"} & set(tables["master"].column_names)
    owner = tables["master"].column("owner").to_numpy()
    for index, party in enumerate(manifest["parties"]):
        named = tables[party["file"][:-6]].column("feature").is_valid().to_numpy(zero_copy_only=False)
        assert np.array_equal(named, owner == index)


@pytest.mark.parametrize("victim", ["master.arrow", "party1.arrow"])
def test_tampered_file_is_refused(saved, victim) -> None:
    path = saved / victim
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=victim.replace(".", r"\.")):
        FederatedForestClassifier.load(saved)


def test_missing_party_file_is_refused(saved) -> None:
    (saved / "party2.arrow").unlink()
    with pytest.raises(ArtifactError, match=r"party2\.arrow.*missing"):
        FederatedForestClassifier.load(saved)


def test_unknown_format_version_is_refused(saved) -> None:
    manifest = json.loads((saved / "manifest.json").read_text())
    manifest["format_version"] = 99
    (saved / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="format_version 99"):
        FederatedForestClassifier.load(saved)


def test_wrong_estimator_class_is_refused(saved) -> None:
    with pytest.raises(ArtifactError, match="classification"):
        FederatedForestRegressor.load(saved)


def test_existing_directory_is_never_overwritten(string_labels, saved, tmp_path) -> None:
    model, _ = string_labels
    before = (saved / "manifest.json").read_bytes()
    with pytest.raises(ArtifactError, match="already exists"):
        model.save(saved)
    assert (saved / "manifest.json").read_bytes() == before
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactError, match="already exists"):
        model.save(tmp_path / "empty")


def test_crash_mid_write_leaves_nothing(string_labels, tmp_path, monkeypatch) -> None:
    model, _ = string_labels
    real_write = artifacts._write_table
    calls = []

    def failing_write(path, table):
        if calls:
            raise OSError("disk full")
        calls.append(path)
        return real_write(path, table)

    monkeypatch.setattr(artifacts, "_write_table", failing_write)
    with pytest.raises(OSError, match="disk full"):
        model.save(tmp_path / "model")
    assert len(calls) == 1
    assert list(tmp_path.iterdir()) == []


def test_write_and_read_version_round_trip(tmp_path) -> None:
    table = pa.table({"x": [1, 2, 3]})
    written = write_version(tmp_path / "v", {"note": "hello"}, {"data": table})
    manifest, tables = read_version(tmp_path / "v")
    assert manifest == written and manifest["note"] == "hello"
    assert tables["data"].equals(table)


def test_unsafe_table_names_are_refused(tmp_path) -> None:
    with pytest.raises(ArtifactError, match=r"^table name '\.\./escape' is not a safe name: it becomes a "
                                            r"file or folder name, so it must start with a letter or digit"):
        write_version(tmp_path / "v", {}, {"../escape": pa.table({"x": [1]})})
    assert not (tmp_path / "v").exists()


def test_party_file_names() -> None:
    assert party_file_stem("bank A") == "bank_A"
    for bad in ("a/b", "a\\b", ""):
        with pytest.raises(ArtifactError, match="path separator"):
            party_file_stem(bad)


@pytest.mark.parametrize("classes", [
    np.array([0, 1, 2]), np.array([1.5, 2.25]), np.array([False, True]), np.array(["a", "bb"]),
    np.array(["no", "yes"], dtype=object), np.array([3, 7], dtype=object),
])
def test_classes_round_trip_with_their_dtype(classes) -> None:
    back = decode_classes(json.loads(json.dumps(encode_classes(classes))))
    assert back.dtype == classes.dtype and np.array_equal(back, classes)
    assert [type(c) for c in back.tolist()] == [type(c) for c in classes.tolist()]


def test_a_manifest_with_the_old_algorithm_spelling_still_loads(string_labels, saved) -> None:
    """Models saved before the algorithm registry say 'federated-forest'.

    Reading accepts the old name; nothing writes it.
    """
    model, parties = string_labels
    path = saved / "manifest.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "algorithm": "federated-forest"}))
    loaded = FederatedForestClassifier.load(saved)
    assert np.array_equal(loaded.predict(parties), model.predict(parties))
    path.write_text(json.dumps({**manifest, "algorithm": "fet"}))
    with pytest.raises(ArtifactError, match="holds a 'fet'/'vertical' model, expected 'forest'/'vertical'"):
        FederatedForestClassifier.load(saved)
