"""What an institution brings to a session, in any setting: its table read from the configured files,
checked against its data contract, and the contract result as it may leave the institution."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa

from fedcore.config import FederationConfig
from fedcore.contracts.expectations import ValidationReport
from fedcore.contracts.model import DataContract
from fedcore.data.numbers import check_finite_columns
from fedcore.errors import ArtifactError, ColumnNotFoundError, ConfigError, DataReadError, ProtocolError
from fedcore.files import DATA, make_folders, set_mode
from fedcore.models.artifacts import table_sha256
from fedcore.models.registry import ModelRegistry
from fedcore.models.signing import PublicKeySource
from fedcore.protocol.messages import Message

log = logging.getLogger(__name__)
"""Also what an operator wants in the agent's run log (`fedforest agent serve` prints it; the agent flow
forwards it to its Prefect run): contract violations, the versions stored, the predictions written."""


@dataclass
class InstitutionData:
    """What an institution brings to a session: its (validated) table and how to read its new batches."""

    name: str
    frame: pd.DataFrame
    id_column: str
    label: str | None
    registry: Path
    predictions_dir: Path
    load_batch: Callable[[], pd.DataFrame] | None = None
    validation: ValidationReport | None = None
    contract: DataContract | None = None
    memory_budget_mb: int | None = None
    """Memory the agent's party grows tree batches in (None: half of what its process may allocate)."""
    privacy: dict | None = None
    """The federation's `privacy:` settings as this institution's own config reads them; its party runs
    with these, and refuses a master that asks for others. None (in-process use): the master's."""
    master_key: PublicKeySource | None = None
    """The master's public key this institution's registry trusts (`master.public_key`); without one it
    stores nothing and loads nothing."""

    def registry_store(self) -> ModelRegistry:
        """This institution's model registry, trusting only the master's key."""
        if self.master_key is None:
            raise ConfigError(f"institution {self.name!r}: no trusted master key, so no model version can be "
                              "stored or loaded here: set master.public_key in the federation config (the "
                              "master's public key, written beside its signing key as <signing_key>.pub)")
        return ModelRegistry(self.registry, public_key=self.master_key)

    @property
    def memory_budget(self) -> int:
        """The party's budget in bytes (`fedcore.trees.budget`)."""
        from fedcore.trees.budget import resolve_budget

        return resolve_budget(self.memory_budget_mb)

    @property
    def valid(self) -> bool:
        """Whether the table kept its data contract (True when there is no contract)."""
        return self.validation is None or self.validation.success


def institution_from_config(config: FederationConfig, name: str) -> InstitutionData:
    """Load one institution's training table from its configured files and validate it against its
    contract (examples of bad values stay in the local report). Runs where the data lives."""
    inst = config.institution(name)
    master_key = _master_key(config, name)  # before reading data: a missing key file fails at once
    frame = read_files(inst.data, f"institution {name!r}", skip=[inst.id_column, inst.label])
    report = contract = None
    if inst.contract is not None:
        from fedcore.contracts import load_contract, validate_frame

        contract = load_contract(inst.contract)
        # no example values, not even in this institution's own log: counts and columns only (the
        # institution inspects its data with `fedforest contract check`, which shows examples on screen)
        report = validate_frame(frame, contract, name, include_label=inst.is_label_holder, max_examples=0)
        for line in report.failure_lines():
            log.warning("data contract violation: %s", line)
    elif inst.id_column not in frame.columns:
        raise ColumnNotFoundError(f"institution {name!r}: id column {inst.id_column!r} not in {inst.data!r}")
    batch = (lambda: read_files(inst.predict_data, f"institution {name!r} prediction data",
                                skip=[inst.id_column])) if inst.predict_data else None
    return InstitutionData(
        name=name, frame=frame, id_column=inst.id_column, label=inst.label, registry=inst.registry,
        predictions_dir=inst.registry.parent / "predictions" / name if inst.predictions is None else inst.predictions,
        load_batch=batch, validation=report, contract=contract, memory_budget_mb=inst.memory_budget_mb,
        privacy=dict(config.privacy), master_key=master_key,
    )


def _master_key(config: FederationConfig, name: str) -> Path | None:
    """The master's public key file the config names, checked to exist where this institution runs."""
    path = config.master_public_key
    if path is not None and not path.is_file():
        raise ConfigError(f"institution {name!r}: the master's public key {str(path)!r} (master.public_key) is not "
                          "there: copy the master's public key file to this host (fedforest models keygen writes "
                          "it beside the signing key)")
    return path


def read_files(pattern: str, what: str, skip: Collection[str | None] = ()) -> pd.DataFrame:
    """All .parquet/.csv files matching `pattern` (a path or glob) as one table; refused if a numeric
    column other than `skip` holds an infinity (`fedcore.data.numbers`)."""
    import glob

    from fedcore.data.io import read_table

    files = sorted(glob.glob(pattern)) or ([pattern] if not glob.has_magic(pattern) else [])
    if not files:
        raise DataReadError(f"{what}: no file matches {pattern!r}")
    frame = pd.concat([read_table(f) for f in files], ignore_index=True)
    check_finite_columns(frame, what, skip=[c for c in skip if c is not None])
    return frame


def validation_reply(report: ValidationReport | None) -> Message:
    """The contract result for the master: pass/fail and counts per expectation, never example values."""
    if report is None:
        return Message("validation", {"checked": False, "success": True, "rows": [], "errors": []})
    rows = [{k: row[k] for k in ("expectation", "column", "success", "unexpected_count", "expected")}
            for row in report.rows]
    return Message("validation", {"checked": True, "success": report.success, "rows": rows,
                                  "errors": report.failure_lines(), "contract": report.contract,
                                  "contract_version": report.version})


def store_signed_table(data: InstitutionData, header: dict, stem: str, table: pa.Table, extra: dict) -> str:
    """Store this institution's model table under the master's version, after checking that the master's
    signed manifest lists exactly this table's SHA-256; returns the version's folder."""
    master_manifest = json.loads(header["manifest"])
    registry = data.registry_store()
    try:
        registry.verify_signed(master_manifest, "the master's manifest")
    except ArtifactError as error:
        raise ProtocolError(f"institution {data.name!r}: refusing to store {header['model']!r} {header['version']}: "
                            f"{error}") from error
    signed = signed_digest(master_manifest, data.name)
    if signed != table_sha256(table):
        raise ProtocolError(f"institution {data.name!r}: the master's manifest signs partial model digest {signed!r}, "
                            f"not this party's model; refusing to store {header['model']!r} {header['version']}")
    manifest = {"institution": data.name, "master_manifest": master_manifest, **extra}
    version = registry.register(header["model"], manifest, {stem: table}, version=header["version"])
    folder = data.registry / header["model"] / version
    log.info("%s: stored %s %s (signed by the master; table sha256 %s) in %s", data.name, header["model"], version,
             signed[:12], folder)
    return str(folder)


def load_signed_table(data: InstitutionData, header: dict, stem: str) -> tuple[dict, pa.Table]:
    """This institution's stored table of the requested version, refused unless it belongs to that master
    version and its SHA-256 is the one the master's signed manifest lists (`header["table_sha256"]`)."""
    model_name, version = header["model"], header["version"]
    try:
        manifest, tables = data.registry_store().load(model_name, version)
    except ArtifactError as error:
        raise ArtifactError(f"institution {data.name!r}: {error}") from error
    master_version = (manifest.get("master_manifest") or {}).get("version")
    if master_version != version:
        raise ProtocolError(f"institution {data.name!r}: its stored {model_name!r} {manifest.get('version')} belongs "
                            f"to master version {master_version!r}, not the requested {version!r}")
    if stem not in tables:
        raise ArtifactError(f"institution {data.name!r}: model {model_name!r} {version} has no table {stem!r}")
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
    entry = next((p for p in master_manifest.get("parties") or [] if p.get("name") == institution), {})
    return entry.get("table_sha256")


def write_predictions(data: InstitutionData, frame: pd.DataFrame, file_stem: str) -> Path:
    """Write predictions atomically as Parquet in this institution's predictions folder (mode 0640,
    whatever the umask: they are derived from its rows)."""
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


class SessionAgent:
    """What every institution agent does around its engine, in either setting: reload the data at each
    session start and report its validation, pass engine messages to the party (checkpointing the batch
    just finished first), dispatch the others to `_on_<kind>`, withdraw a version, and close.

    Subclasses name their engine's message kinds, reset their own session state in `_start_session`, and
    say what a finished batch's checkpoint holds (`_batch_checkpoint`)."""

    engine_kinds: frozenset[str] = frozenset()
    not_ready = "no party yet"
    """Why an engine message that arrives before the party exists is refused."""

    def __init__(self, data: InstitutionData | Callable[[], InstitutionData], name: str = "") -> None:
        """`data` is the institution's table, or a loader called afresh at the start of every session
        (a long-lived agent then trains each session on the data as it is then)."""
        self._loader = data if callable(data) else None
        self.data = None if callable(data) else data
        self.name = data.name if not callable(data) else name
        self.party = None
        self._checkpoints = None  # the run's CheckpointStore, once the master asked to resume or checkpoint
        self.closed = False
        self.sessions = 0

    def handle(self, message: Message) -> Message:
        """Dispatch a session message, or pass an engine message to the party."""
        if self.data is None and message.kind != "validation_report":
            raise ProtocolError(f"institution agent: session not started ({message.kind!r} before validation_report)")
        if message.kind in self.engine_kinds:
            if self.party is None:
                raise ProtocolError(f"institution {self.name!r}: {self.not_ready} ({message.kind!r} too early)")
            if "save_batch" in message.header and self._checkpoints is not None:
                # the batch just finished, before the next one (or the final model) changes anything
                self._checkpoints.save(int(message.header["save_batch"]), self._batch_checkpoint())
            return self._engine_reply(message)
        handler = getattr(self, f"_on_{message.kind}", None)
        if handler is None:
            raise ProtocolError(f"institution {self.name!r} cannot handle message kind {message.kind!r}")
        return handler(message)

    def _engine_reply(self, message: Message) -> Message:
        return self.party.handle(message)

    def _batch_checkpoint(self) -> dict:
        """The arrays this institution keeps for the tree batch it just finished."""
        raise NotImplementedError

    def _start_session(self) -> None:
        """Forget the previous session's state (the party and checkpoints are reset already)."""

    def _on_validation_report(self, message: Message) -> Message:
        """Start of a session: (re)load the data if a loader was given, then report its validation:
        pass/fail per expectation with counts, never the example values (they are raw data)."""
        if self._loader is not None:
            self.data = self._loader()
            self.name = self.data.name
        self.party, self._checkpoints, self.closed = None, None, False
        self._start_session()
        self.sessions += 1
        return validation_reply(self.data.validation)

    def _on_withdraw_model(self, message: Message) -> Message:
        return withdraw_version(self.data, message.header)

    def _on_close(self, message: Message) -> Message:
        self.closed = True
        return Message("ack")
