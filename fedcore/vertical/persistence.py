"""Saving and loading the simulation estimators as a model directory (see fedcore.models.artifacts).

master.arrow, one <party>.arrow per party and a manifest. Lives in `vertical` because rebuilding an estimator
needs the party, master and transport classes, which `models` must not know about.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from fedcore.errors import ArtifactError
from fedcore.models.artifacts import (
    MANIFEST,
    MASTER,
    RESERVED_STEMS,
    decode_classes,
    encode_classes,
    read_version,
    write_version,
)
from fedcore.models.tables import (
    combination_from_table,
    master_table,
    partial_forest_from_table,
    party_table,
    structure_from_table,
)
from fedcore.names import UNSAFE_NAME_CHARS
from fedcore.transport.inprocess import InProcessTransport
from fedcore.vertical.master import FederationInfo, VerticalMaster
from fedcore.vertical.party import VerticalParty


def party_file_stem(name: str) -> str:
    """File name stem for a party's table: unsafe characters become '_'; path separators are refused."""
    if not name or "/" in name or "\\" in name or "\0" in name or (os.altsep and os.altsep in name):
        raise ArtifactError(f"party name {name!r} cannot name a file: it is empty or contains a path "
                            "separator")
    stem = UNSAFE_NAME_CHARS.sub("_", name).lstrip(".") or "_"
    return stem


def save_simulation(model: Any, path: str | os.PathLike) -> dict:
    """Save a fitted vertical estimator to the new directory `path`.

    The master table, every party's table and the manifest.
    """
    if getattr(model, "master_", None) is None or model.master_.structure is None:
        raise ArtifactError(f"{type(model).__name__} is not fitted: nothing to save")
    stems = _party_stems([p.name for p in model.parties_])
    tables = {MASTER: master_table(model.master_.structure, model.master_.combination)}
    tables.update({stems[p.name]: party_table(p.model) for p in model.parties_})
    return write_version(path, _simulation_manifest(model, stems), tables)


def load_simulation(cls: type, path: str | os.PathLike) -> Any:
    """Rebuild an estimator of class `cls` saved by `save_simulation`.

    Its predictions equal the saved model's.
    """
    manifest, tables = read_version(path)
    _check_kind(manifest, cls, Path(path))
    try:
        kind = cls._algorithm.params_class()  # type: ignore[attr-defined]
        params = kind.from_dict(manifest["params"])
        model = cls(**cls._constructor_params(params),  # type: ignore[attr-defined]
                    **_estimator_settings(manifest))
        parties = [_load_party(entry, manifest, tables, Path(path)) for entry in manifest["parties"]]
        structure = structure_from_table(tables[MASTER], manifest["n_trees"])
    except (KeyError, TypeError) as exc:
        raise ArtifactError(f"{Path(path) / MANIFEST}: incomplete or malformed "
                            f"({type(exc).__name__}: {exc})") from exc
    _check_consistent(structure, parties, Path(path))
    model.parties_ = parties
    model.label_ = manifest["label"]
    model.transport_ = InProcessTransport({p.name: p.handle for p in parties},
                                          record_transcript=model.record_transcript)
    model.master_ = VerticalMaster(model.transport_, params)
    model.master_.structure = structure
    model.master_.combination = combination_from_table(tables[MASTER])
    model.master_.info = _federation_info(manifest)
    model.fit_seconds_ = float(manifest["training"]["fit_seconds"])
    model.manifest_ = manifest
    return model


def _simulation_manifest(model: Any, stems: dict[str, str]) -> dict:
    """The estimator's facts as manifest fields (`write_version` adds the file list and parties' sha256)."""
    info, holder = model.master_.info, model.label_holder_
    return {
        "algorithm": type(model)._algorithm.id,
        "setting": type(model)._algorithm.setting,
        "task": model.params.task,
        "params": model.params.to_dict(),
        "estimator": {"prediction": model.prediction, "predict_batch_rows": model.predict_batch_rows},
        "parties": [
            {"name": p.name, "role": "label_holder" if p.is_label_holder else "passive",
             "feature_count": len(p.model.column_names), "file": f"{stems[p.name]}.arrow"}
            for p in model.parties_
        ],
        "classes": encode_classes(holder.classes_) if model.params.task == "classification" else None,
        "label": model.label_,
        "n_rows": int(info.n_rows),
        "n_classes": int(info.n_classes),
        "n_trees": int(model.master_.structure.n_trees),
        "feature_ids": list(info.feature_ids),
        "feature_owner": [int(x) for x in info.feature_owner],
        "training": {"fit_seconds": float(model.fit_seconds_),
                     "communication": (getattr(model, "training_communication_", None)
                                       or model.communication_)},
    }


def _party_stems(names: list[str]) -> dict[str, str]:
    """Distinct, safe file stems for the parties (case-insensitively distinct, never 'master')."""
    stems = {name: party_file_stem(name) for name in names}
    seen: dict[str, str] = {}
    for name, stem in stems.items():
        key = stem.lower()
        if key in RESERVED_STEMS:
            raise ArtifactError(f"party name {name!r} collides with the reserved file {stem}.arrow; rename "
                                "the party")
        if key in seen:
            raise ArtifactError(f"parties {seen[key]!r} and {name!r} would share the file {stem}.arrow; "
                                "rename one")
        seen[key] = name
    return stems


def _load_party(entry: dict, manifest: dict, tables: dict[str, pa.Table], source: Path) -> VerticalParty:
    """One party object holding its partial forest (and, at the label holder, the classes)."""
    stem = str(entry["file"])[: -len(".arrow")]
    if stem not in tables:
        raise ArtifactError(f"{source / str(entry['file'])}: party {entry['name']!r}'s file is not listed in "
                            "the manifest")
    if tables[stem].schema.metadata is None:
        raise ArtifactError(f"{source / str(entry['file'])}: not a party table")
    model = partial_forest_from_table(tables[stem])
    party = VerticalParty(str(entry["name"]), pd.DataFrame(columns=model.column_names))
    party.model = model
    if entry["role"] == "label_holder":
        party.is_label_holder = True
        party.label = manifest["label"]
        if manifest.get("classes") is not None:
            party.classes_ = decode_classes(manifest["classes"])
    return party


def _check_kind(manifest: dict, cls: type, source: Path) -> None:
    """Refuse a directory that holds another kind of model than `cls` fits."""
    found = (manifest.get("algorithm"), manifest.get("setting"))
    expected = cls._algorithm  # type: ignore[attr-defined]
    if found[0] not in (expected.id, *expected.old_ids) or found[1] != expected.setting:
        raise ArtifactError(f"{source}: holds a {found[0]!r}/{found[1]!r} model, "
                            f"expected {expected.id!r}/{expected.setting!r}")
    task = getattr(cls, "_task", None)
    if manifest.get("task") != task:
        raise ArtifactError(f"{source}: holds a {manifest.get('task')} model; {cls.__name__} loads {task} "
                            "models")


def _check_consistent(structure: Any, parties: list[VerticalParty], source: Path) -> None:
    """Every party's partial forest must share the master's structure and own exactly the master's nodes."""
    for index, party in enumerate(parties):
        m = party.trained_model
        for field in ("tree", "node", "left", "right"):
            if not np.array_equal(getattr(m, field), getattr(structure, field)):
                raise ArtifactError(f"{source}: party {party.name!r}'s table disagrees with master.arrow on "
                                    f"'{field}'")
        if not np.array_equal(m.feature >= 0, structure.owner == index):
            raise ArtifactError(f"{source}: party {party.name!r}'s owned nodes differ from the owners in "
                                "master.arrow")


def _federation_info(manifest: dict) -> FederationInfo:
    """The master's setup facts, as saved."""
    holder = next(p["name"] for p in manifest["parties"] if p["role"] == "label_holder")
    return FederationInfo(
        parties=[p["name"] for p in manifest["parties"]], label_holder=holder, n_rows=int(manifest["n_rows"]),
        n_classes=int(manifest["n_classes"]), feature_ids=list(manifest["feature_ids"]),
        feature_owner=np.array(manifest["feature_owner"], dtype=np.int64),
    )


def _estimator_settings(manifest: dict) -> dict:
    """Non-forest estimator settings (prediction method, batch size) as constructor keywords."""
    saved = manifest.get("estimator") or {}
    return {k: saved[k] for k in ("prediction", "predict_batch_rows") if k in saved}


