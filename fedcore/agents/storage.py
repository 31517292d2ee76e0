"""What an institution keeps.

Its partial model tables, stored and loaded only under the master's signed manifest, and the predictions
it receives (Parquet files in its predictions folder, or rows of its database table or Parquet dataset:
`fedcore.data.delivery`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow as pa

from fedcore.agents.data import InstitutionData
from fedcore.errors import ArtifactError, MalformedMessage, ProtocolError
from fedcore.files import DATA, make_folders, set_mode
from fedcore.models.artifacts import table_sha256
from fedcore.models.registry import VERSION_NAME, ModelRegistry
from fedcore.names import check_name
from fedcore.protocol.messages import Header, Message

if TYPE_CHECKING:
    from fedcore.data.delivery import PredictionBatches

log = logging.getLogger(__name__)
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
"""A flow run's id as a master may send it with a prediction request (a value in a column, never a name)."""


def store_signed_table(data: InstitutionData, header: Header, stem: str, table: pa.Table, extra: dict) -> str:
    """Store this institution's model table under the master's version; returns the version's folder.

    It is stored only after checking that the master's signed manifest lists exactly this table's SHA-256.
    """
    model_version(header)
    master_manifest = signed_manifest(header)
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


def load_signed_table(data: InstitutionData, header: Header, stem: str) -> tuple[dict, pa.Table]:
    """This institution's stored table of the requested version, after checking it against the manifest.

    Refused unless it belongs to that master version and its SHA-256 is the one the master's signed manifest
    lists (`header["table_sha256"]`).
    """
    model_name, version = model_version(header)
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
    signed = header.text("table_sha256") if header.get("table_sha256") is not None else None
    if signed is not None and signed != stored:
        raise ArtifactError(f"institution {data.name!r}: its {model_name!r} {version} partial model (sha256 "
                            f"{str(stored)[:12]}) is not the one the master's signed manifest lists "
                            f"({signed[:12]}); refusing to predict with it")
    return manifest, tables[stem]


def withdraw_version(data: InstitutionData, header: Header) -> Message:
    """Take back this institution's part of a version that could not be stored everywhere."""
    ModelRegistry(data.registry).withdraw(*model_version(header))  # needs no trust: only removes
    return Message("withdrawn")


def model_version(header: Header) -> tuple[str, str]:
    """The (model, version) a store, load or withdraw request names (MalformedMessage if not text)."""
    return header.text("model"), header.text("version")


def signed_manifest(header: Header) -> dict:
    """The master's signed manifest a store request carries: a JSON object (MalformedMessage if not)."""
    try:
        manifest = json.loads(header.text("manifest"))
    except json.JSONDecodeError:
        manifest = None
    if not isinstance(manifest, dict):
        raise MalformedMessage("header field 'manifest' must be a JSON object")
    return manifest


def signed_digest(master_manifest: dict, institution: str) -> str | None:
    """The model-table SHA-256 the master's manifest lists for `institution`."""
    entry: dict = next((p for p in master_manifest.get("parties") or [] if p.get("name") == institution), {})
    return entry.get("table_sha256")


def prediction_file(folder: Path, version: tuple[str, str] | None, when: datetime | None = None) -> Path:
    """A new file for predictions of `version` (model, version), named by the institution, never by a peer.

    `<model>-<version>-<UTC time>.parquet` in `folder` (`unregistered-<UTC time>.parquet` for a model
    trained but not stored), with `-2`, `-3`, ... if that name is taken, so every prediction run keeps its
    own file. The model and version are those this agent stored or loaded itself (checked safe again here).
    """
    stem = "unregistered" if version is None else "-".join(checked_version(version))
    stem += "-" + (when or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    path, copy = folder / f"{stem}.parquet", 1
    while path.exists():
        copy += 1
        path = folder / f"{stem}-{copy}.parquet"
    return path


def run_id(institution: str, header: dict) -> str | None:
    """The flow run id a prediction request carries (`run`), refused unless it looks like one.

    Checked when the request arrives, before any work: a database sink writes it as a value, never a name.
    """
    run = header.get("run")
    if run is not None and not (isinstance(run, str) and RUN_ID.fullmatch(run)):
        raise ProtocolError(f"institution {institution!r}: run id {str(run)[:40]!r} is not a flow run id "
                            "(letters, digits, '.', '_', ':', '-'; at most 128)")
    return run


def checked_version(version: tuple[str, str]) -> tuple[str, str]:
    """(model, version) this agent stored or loaded, checked safe again before it names anything."""
    model, number = version
    check_name(model, "model name")
    if not VERSION_NAME.match(str(number)):
        raise ProtocolError(f"version {number!r} is not a version name like 'v0001'")
    return model, str(number)


def write_predictions(data: InstitutionData, frame: pd.DataFrame, version: tuple[str, str] | None,
                      run: str | None = None, until: datetime | None = None) -> Path | str:
    """Write predictions of `version` (model, version) atomically as Parquet in the predictions folder.

    The agent names the file (`prediction_file`); the file gets mode 0640 whatever the umask: the
    predictions are derived from its rows. With a sink (`predictions: {sql: ...}` or `{parquet: ...}`) the
    rows go to its table or dataset instead, replacing those an earlier attempt of the same flow run `run`
    (checked by `run_id`) delivered (without a run id, each delivery is its own); returns `table '<name>'`
    or the dataset file then. Once delivered, a batch selected by time is recorded as delivered up to
    `until` for `version`'s model (`fedcore.agents.batches`): a failed delivery leaves the next batch where
    it was.
    """
    if has_sink(data):
        where: Path | str = _deliver(data, frame, len(frame), version, run)
    else:
        make_folders(data.predictions_dir)
        where = prediction_file(data.predictions_dir, version)
        write_parquet(where, frame)
        log.info("%s: wrote %d predictions to %s", data.name, len(frame), where)
    _delivered_batch(data, version, until)
    return where


def place_parts(data: InstitutionData, tmp: Path, path: Path, rows: int, version: tuple[str, str] | None,
                run: str | None = None, until: datetime | None = None) -> Path | str:
    """The Dask workers' prediction parts in `tmp` (`new_prediction_folder`) where the institution wants them.

    Without a sink, `tmp` is renamed to `path`, a Parquet dataset folder. With one, the parts are delivered
    as `write_predictions` delivers a frame, streamed in their order (`PredictionBatches.of_parts`), and
    `tmp` is removed, delivered or not. Returns what `write_predictions` returns; the batch ending at
    `until` is then recorded as delivered, as `write_predictions` records it.
    """
    if not has_sink(data):
        tmp.replace(path)
        _delivered_batch(data, version, until)
        return path
    from fedcore.data.delivery import PredictionBatches

    try:
        parts = sorted(tmp.glob("part-*.parquet"))  # name order: the blocks' order (`part_file`)
        # no part (no rows): a retry's earlier rows still go
        batches = PredictionBatches.of_parts(parts, f"institution {data.name!r}") if parts else \
            PredictionBatches.nothing()
        where = _deliver(data, batches, rows, version, run)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _delivered_batch(data, version, until)
    return where


def _delivered_batch(data: InstitutionData, version: tuple[str, str] | None, until: datetime | None) -> None:
    """Once its predictions are delivered, record a batch selected by time as delivered up to `until`."""
    if data.batches is not None and until is not None:
        data.batches.delivered(version, until)


def has_sink(data: InstitutionData) -> bool:
    """Whether the institution's predictions go to a database table or a Parquet dataset (not a folder)."""
    return data.predictions_sql is not None or data.predictions_dataset is not None


def _deliver(data: InstitutionData, predictions: pd.DataFrame | PredictionBatches, rows: int,
             version: tuple[str, str] | None, run: str | None) -> Path | str:
    """The predictions into the institution's database table or Parquet dataset (`fedcore.data.delivery`)."""
    model, number = ("unregistered", "-") if version is None else checked_version(version)
    run = str(run or uuid.uuid4().hex)
    what = f"institution {data.name!r}"
    if data.predictions_sql is not None:
        from fedcore.data.sql_sink import deliver_predictions

        deliver_predictions(data.predictions_sql, predictions, model, number, run, what)
        where: Path | str = data.predictions_sql.describe()
    else:
        from fedcore.data.parquet_sink import deliver_to_dataset

        assert data.predictions_dataset is not None, "only with a sink"
        where = deliver_to_dataset(data.predictions_dataset, predictions, model, number, run, what)
    log.info("%s: wrote %d predictions of %s %s (run %s) to %s", data.name, rows, model, number, run, where)
    return where


def write_parquet(path: Path, frame: pd.DataFrame) -> None:
    """Write `frame` to `path` atomically (a hidden temporary file renamed), mode 0640 whatever the umask."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, DATA)
    set_mode(fd, DATA)
    with os.fdopen(fd, "wb") as handle:
        frame.to_parquet(handle, index=False)
    tmp.replace(path)


def part_file(folder: Path, index: int) -> Path:
    """Block `index`'s part of a predictions dataset folder: `part-00000.parquet`, ... (name order = rows)."""
    return folder / f"part-{index:05d}.parquet"


def new_prediction_folder(data: InstitutionData, version: tuple[str, str] | None,
                          when: datetime | None = None) -> tuple[Path, Path]:
    """(hidden temporary folder, final folder) for a predictions dataset written block by block.

    The final folder takes the name the in-process file would (`prediction_file`: never one that exists,
    named by the institution); the parts are written into the temporary folder and it is renamed once all
    are there, so a failed run leaves no half dataset under that name (with a sink, `place_parts` delivers
    them and removes the folder).
    """
    make_folders(data.predictions_dir)
    path = prediction_file(data.predictions_dir, version, when)
    tmp = path.with_name(f".{path.name}.tmp")
    if tmp.exists():  # what a crashed run left: its parts would mix with these
        shutil.rmtree(tmp)
    make_folders(tmp)
    return tmp, path
