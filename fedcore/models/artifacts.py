"""Model directories: Arrow IPC tables plus a JSON manifest that lists every file with its SHA-256.

    <directory>/manifest.json   format_version, created_at, files [{name, sha256, bytes}], model facts
    <directory>/master.arrow    the master's forest structure (see fedcore.models.tables)
    <directory>/<party>.arrow   one partial forest per party

`write_version` is all-or-nothing: files go into a temporary sibling directory that is renamed into place
only once complete, so a crash never leaves a half-written model. `read_version` refuses a directory whose
files are missing, altered or of an unknown format. `fedcore.vertical.persistence` maps the vertical
estimators onto this layout.

Signing seam: `write_version(signer=...)` and `read_version(verifier=...)` receive the canonical manifest
bytes (`manifest_bytes`, everything but "signature"); the Ed25519 signer/verifier and the versioned
registry plug in there and are not built here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from fedcore.errors import ArtifactError
from fedcore.files import FOLDER, PUBLIC, make_folders, write_file
from fedcore.names import check_name

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MASTER = "master"
RESERVED_STEMS = {MASTER, "manifest"}

Signer = Callable[[bytes], Any]
"""signer(canonical manifest bytes) -> JSON-ready signature stored under manifest["signature"]."""
Verifier = Callable[[bytes, Any], None]
"""verifier(canonical manifest bytes, manifest.get("signature")): raises ArtifactError if invalid."""


# -- generic versions: tables + manifest ------------------------------------------------------------
def write_version(directory: str | os.PathLike, manifest: dict, tables: dict[str, pa.Table],
                  signer: Signer | None = None) -> dict:
    """Write `tables` as `<name>.arrow` and a manifest into the new `directory`, atomically.

    Returns the manifest.

    Entries of top-level manifest lists that carry a "file" (e.g. parties) get that file's "sha256" filled in.
    """
    target = Path(directory)
    if target.exists():
        raise ArtifactError(f"{target}: already exists; a model version is never overwritten")
    for name in tables:
        _check_file_stem(name)
    make_folders(target.parent)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    os.chmod(staging, FOLDER)  # the version's folder once published: readable by all, writable by the owner
    try:
        files = [_write_table(staging / f"{name}.arrow", table) for name, table in tables.items()]
        body = {k: v for k, v in manifest.items() if k not in ("format_version", "created_at", "files")}
        body = json.loads(_json_bytes(body))  # what is signed is exactly what a reader parses back
        full = {"format_version": FORMAT_VERSION, "created_at": datetime.now(UTC).isoformat(),
                **_link_digests(body, {f["name"]: f["sha256"] for f in files}), "files": files}
        if signer is not None:
            full["signature"] = signer(manifest_bytes(full))
        _write_bytes(staging / MANIFEST, _json_bytes(full))
        _publish(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return full


def read_version(directory: str | os.PathLike,
                 verifier: Verifier | None = None) -> tuple[dict, dict[str, pa.Table]]:
    """Read a directory written by `write_version`.

    Verifies the format, and the presence, size and SHA-256 of every file.
    """
    source = Path(directory)
    manifest = _read_manifest(source)
    if verifier is not None:
        verifier(manifest_bytes(manifest), manifest.get("signature"))
    tables = {}
    for entry in manifest["files"]:
        name = str(entry.get("name", "")) if isinstance(entry, dict) else ""
        if not name.endswith(".arrow"):
            raise ArtifactError(f"{source / MANIFEST}: file entry {name!r} is not an .arrow file")
        _check_file_stem(name[: -len(".arrow")])
        tables[name[: -len(".arrow")]] = _read_table(source / name, entry)
    return manifest, tables


def _link_digests(body: dict, digests: dict[str, str]) -> dict:
    """Copy of `body` where every entry of a top-level list that names a written "file" gets its "sha256"."""
    def link(item: Any) -> Any:
        if isinstance(item, dict) and item.get("file") in digests:
            return {**item, "sha256": digests[item["file"]]}
        return item

    return {k: [link(x) for x in v] if isinstance(v, list) else v for k, v in body.items()}


def manifest_bytes(manifest: dict) -> bytes:
    """Canonical bytes of a manifest without its signature: what a signature covers."""
    body = {k: v for k, v in manifest.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def table_file_bytes(table: pa.Table) -> bytes:
    """`table` as the Arrow IPC file a version stores (deterministic: equal tables give equal bytes)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def table_sha256(table: pa.Table) -> str:
    """The SHA-256 that `write_version` will record for `table`, known before it is written."""
    return hashlib.sha256(table_file_bytes(table)).hexdigest()


def _write_table(path: Path, table: pa.Table) -> dict:
    """Write one table as an Arrow IPC file; return its manifest entry (name, sha256, bytes)."""
    data = table_file_bytes(table)
    _write_bytes(path, data)
    return {"name": path.name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _read_table(path: Path, entry: dict) -> pa.Table:
    """Read one listed file after checking it exists and matches its recorded size and SHA-256."""
    if not path.is_file():
        raise ArtifactError(f"{path}: listed in the manifest but missing")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.get("sha256") or len(data) != entry.get("bytes"):
        raise ArtifactError(f"{path}: contents do not match the manifest (expected sha256 "
                            f"{entry.get('sha256')} and {entry.get('bytes')} bytes, found sha256 {digest} "
                            f"and {len(data)} bytes); the file was altered or truncated")
    try:
        return pa.ipc.open_file(pa.py_buffer(data)).read_all()
    except pa.ArrowException as exc:
        raise ArtifactError(f"{path}: not a readable Arrow IPC file ({exc})") from exc


def _read_manifest(source: Path) -> dict:
    """Load and sanity-check manifest.json (format version, file list)."""
    path = source / MANIFEST
    if not source.is_dir():
        raise ArtifactError(f"{source}: no such model directory")
    if not path.is_file():
        raise ArtifactError(f"{path}: missing; {source} is not a complete model version")
    try:
        manifest = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{path}: expected a JSON object, found {type(manifest).__name__}")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise ArtifactError(f"{path}: unknown format_version {version!r}; this fedforest reads "
                            f"format_version {FORMAT_VERSION}")
    if not isinstance(manifest.get("files"), list):
        raise ArtifactError(f"{path}: expected a 'files' list")
    return manifest


def _publish(staging: Path, target: Path) -> None:
    """Move the complete staging directory to `target`, refusing to replace anything already there."""
    if target.exists():
        raise ArtifactError(f"{target}: appeared while writing; a model version is never overwritten")
    os.rename(staging, target)
    fsync_directory(target.parent)


def _write_bytes(path: Path, data: bytes) -> None:
    """Write and fsync one file, mode 0644 whatever the umask."""
    write_file(path, data, PUBLIC)


def fsync_directory(path: Path) -> None:
    """Make a rename durable (best effort: not every platform can open a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _json_bytes(manifest: dict) -> bytes:
    """Pretty, strict JSON (no NaN) or ArtifactError naming the problem."""
    try:
        return json.dumps(manifest, indent=2, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"manifest is not JSON-serialisable: {exc}") from exc


def _check_file_stem(name: str) -> None:
    """A table name must be a plain, safe file name stem (it is used as `<name>.arrow`)."""
    check_name(name, "table name", ArtifactError)


# -- class labels ----------------------------------------------------------------------------------
_ELEMENT_TYPES: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}


def encode_classes(classes: np.ndarray) -> dict:
    """Class labels as strings plus their dtype, so loading gives back the same values and dtype."""
    classes = np.asarray(classes)
    encoded: dict[str, Any] = {"dtype": classes.dtype.str, "values": [str(v) for v in classes.tolist()]}
    if classes.dtype.kind == "O":
        kinds = {type(v).__name__ for v in classes.tolist()}
        if len(kinds) != 1 or next(iter(kinds)) not in _ELEMENT_TYPES:
            raise ArtifactError(f"class labels of Python types {sorted(kinds)} cannot be saved; use str, "
                                "int, float or bool")
        encoded["element_type"] = kinds.pop()
    elif classes.dtype.kind not in "biufU":
        raise ArtifactError(f"class labels of dtype {classes.dtype} cannot be saved; use numbers, booleans "
                            "or strings")
    return encoded


def decode_classes(encoded: dict) -> np.ndarray:
    """Inverse of `encode_classes`."""
    dtype, values = np.dtype(encoded["dtype"]), list(encoded["values"])
    if dtype.kind == "O":
        convert = _ELEMENT_TYPES[encoded["element_type"]]
        items = [v == "True" if convert is bool else convert(v) for v in values]
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out
    if dtype.kind == "b":
        return np.array([v == "True" for v in values], dtype=dtype)
    if dtype.kind == "f":
        return np.array([float(v) for v in values], dtype=dtype)
    if dtype.kind in "iu":
        return np.array([int(v) for v in values], dtype=dtype)
    return np.array(values, dtype=dtype)
