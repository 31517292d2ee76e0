"""What an institution keeps.

Its partial model tables, stored and loaded only under the master's signed manifest, and the predictions
it receives.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa

from fedcore.agents.data import InstitutionData
from fedcore.errors import ArtifactError, ProtocolError
from fedcore.files import DATA, make_folders, set_mode
from fedcore.models.artifacts import table_sha256
from fedcore.models.registry import ModelRegistry
from fedcore.protocol.messages import Message

log = logging.getLogger(__name__)


def store_signed_table(data: InstitutionData, header: dict, stem: str, table: pa.Table, extra: dict) -> str:
    """Store this institution's model table under the master's version; returns the version's folder.

    It is stored only after checking that the master's signed manifest lists exactly this table's SHA-256.
    """
    master_manifest = json.loads(header["manifest"])
    registry = data.registry_store()
    try:
        registry.verify_signed(master_manifest, "the master's manifest")
    except ArtifactError as error:
        raise ProtocolError(f"institution {data.name!r}: refusing to store {header['model']!r} "
                            f"{header['version']}: {error}") from error
    signed = signed_digest(master_manifest, data.name)
    if signed != table_sha256(table):
        raise ProtocolError(f"institution {data.name!r}: the master's manifest signs partial model digest "
                            f"{signed!r}, not this party's model; refusing to store "
                            f"{header['model']!r} {header['version']}")
    manifest = {"institution": data.name, "master_manifest": master_manifest, **extra}
    version = registry.register(header["model"], manifest, {stem: table}, version=header["version"])
    folder = data.registry / header["model"] / version
    log.info("%s: stored %s %s (signed by the master; table sha256 %s) in %s", data.name, header["model"],
             version, signed[:12], folder)
    return str(folder)


def load_signed_table(data: InstitutionData, header: dict, stem: str) -> tuple[dict, pa.Table]:
    """This institution's stored table of the requested version, after checking it against the manifest.

    Refused unless it belongs to that master version and its SHA-256 is the one the master's signed manifest
    lists (`header["table_sha256"]`).
    """
    model_name, version = header["model"], header["version"]
    try:
        manifest, tables = data.registry_store().load(model_name, version)
    except ArtifactError as error:
        raise ArtifactError(f"institution {data.name!r}: {error}") from error
    master_version = (manifest.get("master_manifest") or {}).get("version")
    if master_version != version:
        raise ProtocolError(f"institution {data.name!r}: its stored {model_name!r} {manifest.get('version')} "
                            f"belongs to master version {master_version!r}, not the requested {version!r}")
    if stem not in tables:
        raise ArtifactError(f"institution {data.name!r}: model {model_name!r} {version} has no "
                            f"table {stem!r}")
    stored = next((f["sha256"] for f in manifest.get("files", []) if f["name"] == f"{stem}.arrow"), None)
    signed = header.get("table_sha256")
    if signed is not None and signed != stored:
        raise ArtifactError(f"institution {data.name!r}: its {model_name!r} {version} partial model (sha256 "
                            f"{str(stored)[:12]}) is not the one the master's signed manifest lists "
                            f"({signed[:12]}); refusing to predict with it")
    return manifest, tables[stem]


def withdraw_version(data: InstitutionData, header: dict) -> Message:
    """Take back this institution's part of a version that could not be stored everywhere."""
    ModelRegistry(data.registry).withdraw(header["model"], header["version"])  # needs no trust: only removes
    return Message("withdrawn")


def signed_digest(master_manifest: dict, institution: str) -> str | None:
    """The model-table SHA-256 the master's manifest lists for `institution`."""
    entry: dict = next((p for p in master_manifest.get("parties") or [] if p.get("name") == institution), {})
    return entry.get("table_sha256")


def write_predictions(data: InstitutionData, frame: pd.DataFrame, file_stem: str) -> Path:
    """Write predictions atomically as Parquet in this institution's predictions folder.

    The file gets mode 0640 whatever the umask: the predictions are derived from its rows.
    """
    path = data.predictions_dir / f"{file_stem}.parquet"
    make_folders(path.parent)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, DATA)
    set_mode(fd, DATA)
    with os.fdopen(fd, "wb") as handle:
        frame.to_parquet(handle, index=False)
    tmp.replace(path)
    log.info("%s: wrote %d predictions to %s", data.name, len(frame), path)
    return path
