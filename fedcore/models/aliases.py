"""The signed alias log: which version each alias (production, staging, ...) names, who moved it, when.

    <root>/<model-name>/aliases.log   one JSON object per line, oldest first:
        {"seq": 3, "at": "2026-11-24T10:00:00+00:00", "action": "promote" | "rollback",
         "alias": "production", "version": "v0002", "by": {"user", "host", "key_id"},
         "previous": "<SHA-256 hex of the line before>" | null, "signature": {ed25519, as on manifests}}

The log is the only source of aliases: replaying it gives every alias and its history (promote pushes a
version, rollback pops one). Each entry is signed with the master's key over its canonical JSON (every
field but "signature") and names the SHA-256 of the line before, so an edited, inserted, reordered or
deleted entry breaks a signature or the chain, and the registry refuses to resolve any alias until the
log is repaired. `latest` is not logged: it is the newest committed version.

What the log cannot show on its own: removing entries from its end leaves an earlier, once-valid log
(aliases as they were before those promotions). Keep the registry on storage only the master writes,
and compare `fedforest models list` with the master's own record of promotions if in doubt.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedcore.errors import ArtifactError
from fedcore.files import PUBLIC, set_mode
from fedcore.models.artifacts import fsync_directory
from fedcore.models.signing import key_id, signer

LOG_FILE = "aliases.log"
LEGACY_FILE = "aliases.json"
ACTIONS = ("promote", "rollback")
ENTRY_FIELDS = {"seq", "at", "action", "alias", "version", "by", "previous", "signature"}

Verify = Callable[[bytes, Any], None]
"""Raises ArtifactError unless a signature (the stored dict) signs the given bytes under a trusted key."""


def entry_bytes(entry: dict) -> bytes:
    """Canonical bytes of an entry without its signature: what the signature covers."""
    body = {k: v for k, v in entry.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def read_log(model_dir: Path, verify: Verify, replacing_legacy: bool = False) -> list[dict]:
    """Every entry of the model's alias log, each checked.

    Its signature, its sequence number and the SHA-256 of the line before. Raises ArtifactError naming the
    first line that fails, or when only an unsigned alias file of an older version names aliases (unless a
    promotion is `replacing_legacy` it).
    """
    path = model_dir / LOG_FILE
    if not path.is_file():
        if not replacing_legacy:
            _refuse_legacy(model_dir)
        return []
    entries, previous = [], None
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        where = f"{path} line {number}"
        try:
            entry = json.loads(line)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ArtifactError(f"{where}: not a JSON entry ({exc}); the alias log was altered") from exc
        _check_entry(entry, number, previous, where)
        try:
            verify(entry_bytes(entry), entry["signature"])
        except ArtifactError as error:
            raise ArtifactError(f"{where}: {error}") from error
        entries.append(entry)
        previous = hashlib.sha256(line).hexdigest()
    return entries


def replay(entries: list[dict]) -> tuple[dict[str, str], dict[str, list[dict]]]:
    """Aliases (alias -> version) and each alias's promotions still in effect, oldest first, after the log."""
    history: dict[str, list[dict]] = {}
    for entry in entries:
        stack = history.setdefault(entry["alias"], [])
        if entry["action"] == "promote":
            stack.append({"version": entry["version"], "promoted_at": entry["at"], "by": entry["by"]})
        elif stack:
            stack.pop()
    history = {alias: stack for alias, stack in history.items() if stack}
    return {alias: stack[-1]["version"] for alias, stack in history.items()}, history


def append_entry(model_dir: Path, entries: list[dict], action: str, alias: str, version: str,
                 key: Ed25519PrivateKey) -> dict:
    """Sign a new entry after the (verified) `entries` and replace the log with them plus it.

    Atomically: a reader sees the old log or the new one. The caller holds the model's lock.
    """
    path = model_dir / LOG_FILE
    lines = path.read_bytes().splitlines() if path.is_file() else []
    if len(lines) != len(entries):
        raise ArtifactError(f"{path}: changed while it was being extended; try again")
    entry = {"seq": len(entries) + 1, "at": datetime.now(UTC).isoformat(), "action": action, "alias": alias,
             "version": version, "by": {"user": _user(), "host": socket.gethostname(), "key_id": key_id(key)},
             "previous": hashlib.sha256(lines[-1]).hexdigest() if lines else None}
    entry["signature"] = signer(key)(entry_bytes(entry))
    text = b"".join(line + b"\n" for line in lines) + json.dumps(entry, sort_keys=True).encode() + b"\n"
    _replace(path, text)
    legacy = model_dir / LEGACY_FILE
    if legacy.exists():  # its aliases were re-promoted into the signed log (or never mattered)
        legacy.unlink()
    return entry


def _check_entry(entry: Any, number: int, previous: str | None, where: str) -> None:
    """The entry's shape, its place in the sequence and its link to the line before."""
    if not isinstance(entry, dict) or set(entry) != ENTRY_FIELDS:
        raise ArtifactError(f"{where}: not an alias entry (fields {sorted(ENTRY_FIELDS)}); the alias log was "
                            "altered")
    if entry["seq"] != number:
        raise ArtifactError(f"{where}: entry {entry['seq']!r} where entry {number} belongs; entries were "
                            "removed, inserted or reordered")
    if entry["previous"] != previous:
        raise ArtifactError(f"{where}: does not follow the line before it (its SHA-256 differs); the alias "
                            "log was altered")
    if (entry["action"] not in ACTIONS or not isinstance(entry["alias"], str)
            or not isinstance(entry["version"], str)):
        raise ArtifactError(f"{where}: malformed entry (action {entry['action']!r})")


def _refuse_legacy(model_dir: Path) -> None:
    """An aliases.json of an older fedforest (unsigned) must not name production silently."""
    legacy = model_dir / LEGACY_FILE
    if not legacy.is_file():
        return
    try:
        aliases = json.loads(legacy.read_bytes()).get("aliases") or {}
        named = sorted(alias for alias in aliases if alias != "latest")
    except (ValueError, AttributeError, UnicodeDecodeError):
        named = ["(unreadable)"]
    if named:
        raise ArtifactError(f"{legacy}: unsigned aliases ({', '.join(named)}) from an older fedforest are "
                            "not trusted; promote the version again (`fedforest models promote`), which "
                            f"starts the signed {LOG_FILE} and removes {LEGACY_FILE}")


def _replace(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path` (mode 0644), sync it, and move it over `path`."""
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        set_mode(fd, PUBLIC)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
        fsync_directory(path.parent)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (some containers)
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"
