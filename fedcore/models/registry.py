"""The versioned model registry: numbered, verified, immutable versions plus movable aliases.

    <root>/<model-name>/v0001/         one `fedcore.models.artifacts` directory per version (never rewritten)
    <root>/<model-name>/aliases.log    the signed alias log (`fedcore.models.aliases`): who promoted what when
    <root>/<model-name>/.lock          taken (flock) while a version number or the alias log changes
    <root>/<model-name>/.v0003.pending a version being registered across the federation (see below)

The master's registry holds master.arrow and the signed manifest; each institution keeps its own registry
(same class, no signing key) with its partial table and a copy of the master's signed manifest under
"master_manifest", usually registered under the master's version number (`register(..., version=...)`).
Only complete versions (a directory named vNNNN with a manifest.json) are listed; leftovers of a crashed
write (`.vNNNN.tmp-*`) never are, and the next write removes them. Loading verifies every file's SHA-256
and the Ed25519 signature(s).

Trust: a registry verifies signatures under the master's public key (`public_key`, or the public half of
its `signing_key`) and refuses unsigned or otherwise-signed manifests and alias entries. Without a key it
refuses to load anything, unless opened with `trust_any_key=True` (inspection only: a signature is then
checked against the key it carries, which anyone who can write the folder can replace).

Two-phase registering (the master's registry, `register(..., pending=True)` then `commit`): a pending
record `.vNNNN.pending` is written (and synced) before the version's directory appears, and removed, as
the commit, only after every institution has stored its part. A pending version is not listed, resolved,
promoted or loaded; `pending()` names them so that the next run withdraws them everywhere
(`fedcore/models/publish.py`): a version exists at every institution or is not a version.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedcore.algorithms import read_algorithm
from fedcore.errors import ArtifactError, ParameterError
from fedcore.files import PUBLIC, make_folders, set_mode, write_file
from fedcore.models.aliases import LOG_FILE, append_entry, read_log, replay
from fedcore.models.artifacts import MANIFEST, fsync_directory, manifest_bytes, read_version, write_version
from fedcore.models.signing import (
    PublicKeySource,
    embedded_public_key,
    key_id,
    load_public_key,
    load_signing_key,
    signer,
    verify_manifest,
)
from fedcore.names import SAFE_NAME

LATEST, PRODUCTION = "latest", "production"
LOCK_FILE = ".lock"
MASTER_COPY = "master_manifest"
VERSION_NAME = re.compile(r"^v(\d{4,})$")
PENDING = re.compile(r"^\.(v\d{4,})\.pending$")
STAGING = re.compile(r"^\.(v\d{4,}|aliases\.json|aliases\.log)\.tmp-")
VERSION_REF = re.compile(r"^v?(\d+)$")


class ModelRegistry:
    """Versions of named models under `root`.

    Signs new versions and alias moves with `signing_key`, trusts `public_key` (default: the signing key's
    public half); `trust_any_key` is for inspection only.
    """

    def __init__(self, root: str | os.PathLike,
                 signing_key: Ed25519PrivateKey | str | os.PathLike | None = None,
                 public_key: PublicKeySource | None = None, lock_timeout: float = 60.0,
                 trust_any_key: bool = False) -> None:
        """A registry under `root`; refuses a signing key that is not the trusted key."""
        self.root = Path(root)
        self.signing_key = (signing_key if signing_key is None or isinstance(signing_key, Ed25519PrivateKey)
                            else load_signing_key(signing_key))
        trusted = public_key if public_key is not None else self.signing_key
        self.public_key: Ed25519PublicKey | None = None if trusted is None else load_public_key(trusted)
        if self.signing_key is not None and self.public_key is not None \
                and key_id(self.signing_key) != key_id(self.public_key):
            raise ArtifactError(f"{self.root}: the signing key ({key_id(self.signing_key)}) is not the "
                                f"trusted key ({key_id(self.public_key)}); versions it signs "
                                "would be refused")
        self.trust_any_key = trust_any_key and self.public_key is None
        self.lock_timeout = lock_timeout

    # -- listing ------------------------------------------------------------------------------------
    def models(self) -> list[str]:
        """Names of the models with at least one complete version, sorted."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and SAFE_NAME.match(p.name) and self.versions(p.name))

    def versions(self, model_name: str) -> list[str]:
        """Committed versions of a model, oldest first.

        Half-written, pending or foreign directories are skipped.
        """
        model_dir = self._model_dir(model_name)
        return [name for name in _version_names(model_dir)
                if (model_dir / name / MANIFEST).is_file() and not _pending_record(model_dir, name).exists()]

    def pending(self, model_name: str) -> list[str]:
        """Versions registered as pending and never committed, oldest first.

        A run stopped while registering them.
        """
        model_dir = self._model_dir(model_name)
        if not model_dir.is_dir():
            return []
        names = (PENDING.match(p.name) for p in model_dir.iterdir())
        return sorted((m.group(1) for m in names if m), key=_number)

    def aliases(self, model_name: str) -> dict[str, str]:
        """Alias -> version from the verified alias log, plus `latest` (the newest committed version)."""
        aliases, _ = replay(self.alias_log(model_name))
        available = self.versions(model_name)
        return {**aliases, LATEST: available[-1]} if available else aliases

    def history(self, model_name: str, alias: str = PRODUCTION) -> list[dict]:
        """The promotions still in effect for `alias`, oldest first.

        The last is current; rollback pops it.
        """
        return replay(self.alias_log(model_name))[1].get(alias, [])

    def alias_log(self, model_name: str) -> list[dict]:
        """Every alias move (promote, rollback) with when and by whom, oldest first, each entry verified."""
        return read_log(self._model_dir(model_name), self._verify)

    def resolve(self, model_name: str, ref: str = LATEST) -> str:
        """The version a reference names: an alias, `latest`, or a version such as v0003 (or 3)."""
        available = self.versions(model_name)
        if not available:
            known = ", ".join(self.models()) or "none"
            raise ArtifactError(f"{self.root}: no versions of model {model_name!r} (models here: {known})")
        # a version or `latest` never reads the alias log (aliases cannot look like versions)
        aliases = {} if ref == LATEST or VERSION_REF.match(str(ref)) else self.aliases(model_name)
        if ref in aliases:
            version = aliases[ref]
            if version not in available:
                raise ArtifactError(f"model {model_name!r}: alias {ref!r} points to {version}, which is "
                                    f"missing or incomplete (versions: {', '.join(available)})")
            return version
        if ref == LATEST:
            return available[-1]
        match = VERSION_REF.match(str(ref))
        if match and format_version(int(match.group(1))) in available:
            return format_version(int(match.group(1)))
        if match:
            raise ArtifactError(f"model {model_name!r} has no version {ref!r} (versions: "
                                f"{', '.join(available)})")
        raise ArtifactError(f"model {model_name!r} has no alias or version {ref!r} (versions: "
                            f"{', '.join(available)}; aliases: {', '.join(sorted(aliases))})")

    # -- writing ------------------------------------------------------------------------------------
    def register(self, model_name: str, manifest: dict, tables: dict[str, pa.Table],
                 version: str | int | None = None, pending: bool = False) -> str:
        """Store a new version atomically (signed when a signing key is set), point `latest` at it; return it.

        The number is the next free one, taken under the model's lock so concurrent writers never collide;
        an institution may pass the master's `version` instead to keep the numbering in step. With
        `pending`, the version stays invisible (and `latest` unchanged) until `commit`.
        """
        body = _plain_json(manifest, model_name)
        body.pop("signature", None)
        model_dir = self._model_dir(model_name)  # `_lock` creates it
        sign = None if self.signing_key is None else signer(self.signing_key)
        with self._lock(model_name):
            _remove_staging(model_dir)  # leftovers of a crashed write: under the lock nobody is writing
            taken = _version_names(model_dir) + self.pending(model_name)
            if version is None:
                number = max((_number(v) for v in taken), default=0) + 1
                chosen = format_version(number)
            else:
                chosen = _parse_version(version)
                if chosen in taken:
                    raise ArtifactError(f"model {model_name!r} already has a version {chosen}; versions are "
                                        "never overwritten")
            body.update(model_name=model_name, version=chosen)
            if pending:  # first, so that the directory is never visible uncommitted, even after a crash
                _write_record(_pending_record(model_dir, chosen),
                              {"version": chosen, "pending_since": _now()})
            write_version(model_dir / chosen, body, tables, signer=sign)
        return chosen

    def commit(self, model_name: str, version: str) -> str:
        """Make a pending version visible (every part of it is stored).

        Removing the pending record is the commit. Returns the version.
        """
        chosen = _parse_version(version)
        model_dir = self._model_dir(model_name)
        with self._lock(model_name):
            record = _pending_record(model_dir, chosen)
            if not record.exists():
                raise ArtifactError(f"model {model_name!r} has no pending version {chosen} to commit")
            if not (model_dir / chosen / MANIFEST).is_file():
                raise ArtifactError(f"model {model_name!r}: pending version {chosen} has no files to commit")
            record.unlink()
            fsync_directory(model_dir)
        return chosen

    def discard_pending(self, model_name: str, version: str) -> None:
        """Remove a pending version that will never be committed: its directory, then its record."""
        chosen = _parse_version(version)
        model_dir = self._model_dir(model_name)
        with self._lock(model_name):
            record = _pending_record(model_dir, chosen)
            if not record.exists():
                raise ArtifactError(f"model {model_name!r} has no pending version {chosen} to discard")
            if (model_dir / chosen).is_dir():
                shutil.rmtree(model_dir / chosen)
            record.unlink()
            fsync_directory(model_dir)

    def promote(self, model_name: str, version: str, alias: str = PRODUCTION) -> str:
        """Point `alias` (default production) at a version after verifying it loads; return the version.

        The move is a signed entry of the alias log.
        """
        _check_alias(alias)
        key = self._alias_signer(model_name)
        chosen = self.resolve(model_name, version)
        self.load(model_name, chosen)
        with self._lock(model_name):
            entries = read_log(self._model_dir(model_name), self._verify, replacing_legacy=True)
            if replay(entries)[0].get(alias) != chosen:
                append_entry(self._model_dir(model_name), entries, "promote", alias, chosen, key)
        return chosen

    def rollback(self, model_name: str, alias: str = PRODUCTION) -> str:
        """Point `alias` back at the version it had before the last promotion; return it.

        The version is verified first; the move is a signed entry of the alias log.
        """
        _check_alias(alias)
        key = self._alias_signer(model_name)
        with self._lock(model_name):
            entries = self.alias_log(model_name)
            aliases, history = replay(entries)
            if alias not in aliases:
                raise ArtifactError(f"model {model_name!r} has no {alias!r} version to roll back")
            if len(history[alias]) < 2:
                raise ArtifactError(f"model {model_name!r}: {alias!r} ({aliases[alias]}) has no earlier "
                                    "version to roll back to")
            previous = history[alias][-2]["version"]
            self.load(model_name, self.resolve(model_name, previous))
            append_entry(self._model_dir(model_name), entries, "rollback", alias, previous, key)
        return previous

    def withdraw(self, model_name: str, version: str) -> None:
        """Take back a just-registered version whose other parts could not be stored elsewhere.

        A federated version is all parties' files or none. Never for a version an alias other than latest
        points to.
        """
        chosen = _parse_version(version)
        model_dir = self._model_dir(model_name)
        with self._lock(model_name):
            if (model_dir / LOG_FILE).is_file():  # institutions' registries have no aliases
                aliases = replay(self.alias_log(model_name))[0]
                held = sorted(alias for alias, v in aliases.items() if v == chosen)
                if held:
                    raise ArtifactError(f"model {model_name!r} {chosen} is {', '.join(held)}; roll back "
                                        "before withdrawing")
            if not (model_dir / chosen).is_dir():
                return
            withdrawn = model_dir / f".withdrawn-{chosen}-{datetime.now(UTC):%Y%m%dT%H%M%S%f}"
            (model_dir / chosen).rename(withdrawn)
            fsync_directory(model_dir)

    # -- reading ------------------------------------------------------------------------------------
    def load(self, model_name: str, ref: str = LATEST) -> tuple[dict, dict[str, pa.Table]]:
        """Manifest and tables of a version, after checking every file's SHA-256 and the signature(s)."""
        version = self.resolve(model_name, ref)
        directory = self._model_dir(model_name) / version
        seen: dict[str, Any] = {}

        def verify_own(payload: bytes, signature: Any) -> None:
            seen["checked"] = signature is not None
            if signature is not None:
                self._verify(payload, signature)

        try:
            manifest, tables = read_version(directory, verifier=_located(verify_own, directory / MANIFEST))
            self._check_manifest(manifest, model_name, version, directory,
                                 own_checked=seen.get("checked", False))
        except ArtifactError as error:
            raise ArtifactError(f"model {model_name!r} {version} refused: {error}") from error
        return manifest, tables

    def read_manifest(self, model_name: str, ref: str = LATEST, pending: bool = False) -> dict:
        """A version's manifest with its signature(s) verified, without reading the tables.

        `pending`: `ref` names a pending version (the one being registered), which is not visible otherwise.
        """
        if pending:
            version = _parse_version(ref)
            if version not in self.pending(model_name):
                raise ArtifactError(f"model {model_name!r} has no pending version {version}")
        else:
            version = self.resolve(model_name, ref)
        directory = self._model_dir(model_name) / version
        try:
            manifest = _read_json(directory / MANIFEST)
            if manifest.get("signature") is not None:
                _located(self._verify, directory / MANIFEST)(manifest_bytes(manifest), manifest["signature"])
            self._check_manifest(manifest, model_name, version, directory,
                                 own_checked=manifest.get("signature") is not None)
        except ArtifactError as error:
            raise ArtifactError(f"model {model_name!r} {version} refused: {error}") from error
        return manifest

    def describe(self, model_name: str, ref: str = LATEST, verify: bool = True) -> dict:
        """A JSON-ready summary of one version; integrity problems are reported in it, not raised.

        An institution's copy is described by the master's manifest it holds (algorithm, metrics, parties),
        with its own `importances` (a vertical institution's: of its own features only).
        """
        version = self.resolve(model_name, ref)
        own = _read_json(self._model_dir(model_name) / version / MANIFEST)
        copy = own.get(MASTER_COPY)
        manifest = copy if isinstance(copy, dict) else own
        parties = [p for p in manifest.get("parties") or [] if isinstance(p, dict)]
        columns = ("name", "role", "feature_count", "file",
                   *(("importance_share",) if any("importance_share" in p for p in parties) else ()))
        integrity = "not checked"
        if verify:
            try:
                self.load(model_name, version)
                integrity = "ok"
            except ArtifactError as error:
                integrity = f"FAILED: {error}"
        return {
            "model_name": model_name,
            "version": version,
            "aliases": sorted(a for a, v in self.aliases(model_name).items() if v == version),
            "created_at": own.get("created_at"),
            "algorithm": _algorithm_id(manifest.get("algorithm")),
            **{key: manifest.get(key) for key in ("setting", "task", "metrics")},
            "parties": [{k: p.get(k) for k in columns} for p in parties],
            "importances": own.get("importances") or manifest.get("importances"),
            "files": [{k: f.get(k) for k in ("name", "bytes", "sha256")} for f in own.get("files") or []
                      if isinstance(f, dict)],
            "signature": self.signature_status(own),
            "integrity": integrity,
        }

    def signature_status(self, manifest: dict) -> str:
        """One line on a manifest's signature: valid (by which key), unsigned, or INVALID and why."""
        copy = manifest.get(MASTER_COPY)
        if manifest.get("signature") is None and isinstance(copy, dict) and copy.get("signature") is not None:
            return f"master manifest copy: {self.signature_status(copy)}"
        signature = manifest.get("signature")
        if signature is None:
            if self.trust_any_key:
                return "unsigned (accepted: --trust-any-key)"
            return f"unsigned ({self._required()} required)"
        try:
            self._verify(manifest_bytes(manifest), signature)
        except ArtifactError as error:
            return f"INVALID: {error}"
        if self.public_key is not None:
            return f"valid (trusted key {key_id(self.public_key)})"
        return f"valid (embedded key {key_id(embedded_public_key(signature))}; NOT TRUSTED: --trust-any-key)"

    def verify_signed(self, manifest: dict, what: str = "manifest") -> None:
        """Raise ArtifactError unless `manifest` carries a signature by the trusted key.

        For a master manifest an institution is asked to store.
        """
        if manifest.get("signature") is None and not self.trust_any_key:
            raise ArtifactError(f"{what} is not signed, but {self._required()} is required")
        if manifest.get("signature") is not None:
            self._verify(manifest_bytes(manifest), manifest["signature"])

    # -- internals ----------------------------------------------------------------------------------
    def _verify(self, payload: bytes, signature: Any) -> None:
        """Verify under the trusted key; with none, refuse, unless opened to trust any key (inspection)."""
        if self.public_key is None and not self.trust_any_key:
            raise ArtifactError(f"{self.root}: no trusted master key configured, so no signature can be "
                                "trusted: give the registry the master's public key (master.public_key in "
                                "the federation config, or --public-key); --trust-any-key only checks "
                                "integrity")
        verify_manifest(payload, signature, self.public_key or embedded_public_key(signature))

    def _required(self) -> str:
        return "a signature" if self.public_key is None else f"a signature by key {key_id(self.public_key)}"

    def _alias_signer(self, model_name: str) -> Ed25519PrivateKey:
        """The key alias moves are signed with: only the master's registry moves aliases."""
        if self.signing_key is None:
            raise ArtifactError(f"model {model_name!r}: moving an alias needs the master's signing key "
                                "(every alias move is a signed entry of the alias log): pass --config with "
                                "master.signing_key, or --signing-key")
        return self.signing_key

    def _check_manifest(self, manifest: dict, model_name: str, version: str, directory: Path,
                        own_checked: bool) -> None:
        """The manifest belongs here, its master copy (if any) verifies, and a trusted key saw a signature."""
        where = directory / MANIFEST
        if (manifest.get("model_name"), manifest.get("version")) != (model_name, version):
            raise ArtifactError(f"{where}: says model {manifest.get('model_name')!r} version "
                                f"{manifest.get('version')!r}; a version moved or copied from elsewhere is "
                                "refused")
        copy = manifest.get(MASTER_COPY)
        if copy is not None and not isinstance(copy, dict):
            raise ArtifactError(f"{where}: '{MASTER_COPY}' is not a JSON object")
        copy_checked = copy is not None and copy.get("signature") is not None
        if copy is not None and copy_checked:
            _located(self._verify, where, f"'{MASTER_COPY}'")(manifest_bytes(copy), copy["signature"])
        if not (own_checked or copy_checked or self.trust_any_key):
            raise ArtifactError(f"{where}: not signed, but this registry requires {self._required()}")

    def _model_dir(self, model_name: str) -> Path:
        if not isinstance(model_name, str) or not SAFE_NAME.match(model_name):
            raise ArtifactError(f"model name {model_name!r} is not a safe directory name "
                                "(letters, digits, '.', '_', '-'; not starting with '.', '_' or '-')")
        return self.root / model_name

    @contextmanager
    def _lock(self, model_name: str) -> Iterator[None]:
        """Exclusive lock on the model directory, across threads and processes.

        ArtifactError on timeout.
        """
        path = make_folders(self._model_dir(model_name)) / LOCK_FILE
        try:  # a new lock file gets an explicit mode; an existing one (perhaps another user's) is only opened
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, PUBLIC)
            set_mode(fd, PUBLIC)
        except FileExistsError:
            fd = os.open(path, os.O_RDWR)
        with os.fdopen(fd, "a+b") as handle:
            deadline = time.monotonic() + self.lock_timeout
            while not _try_lock(handle):
                if time.monotonic() > deadline:
                    raise ArtifactError(f"{path}: still locked by another writer after "
                                        f"{self.lock_timeout:g} s")
                time.sleep(0.01)
            try:
                yield
            finally:
                _unlock(handle)


# -- helpers ----------------------------------------------------------------------------------------
def format_version(number: int) -> str:
    """Version directory name of a version number: 3 -> v0003."""
    if number < 1:
        raise ArtifactError(f"version numbers start at 1, got {number}")
    return f"v{number:04d}"


def _parse_version(version: str | int) -> str:
    match = VERSION_REF.match(str(version))
    if not match:
        raise ArtifactError(f"{version!r} is not a version (expected e.g. v0003 or 3)")
    return format_version(int(match.group(1)))


def _number(version: str) -> int:
    match = VERSION_NAME.match(version)
    return int(match.group(1)) if match else 0


def _version_names(model_dir: Path) -> list[str]:
    """Every vNNNN directory name, complete or not, by number (used for numbering, filtered for listing)."""
    if not model_dir.is_dir():
        return []
    return sorted((p.name for p in model_dir.iterdir() if VERSION_NAME.match(p.name) and p.is_dir()),
                  key=_number)


def _check_alias(alias: str) -> None:
    if alias == LATEST or not SAFE_NAME.match(alias) or VERSION_REF.match(alias):
        raise ArtifactError(f"{alias!r} cannot be promoted to: aliases are names like 'production' or "
                            f"'staging' ('{LATEST}' follows register)")


def _plain_json(manifest: dict, model_name: str) -> dict:
    """A JSON round-trip of the manifest, so what is signed is exactly what a reader will parse back."""
    try:
        return json.loads(json.dumps(manifest, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"manifest of model {model_name!r} is not plain JSON (no NaN, numpy values or "
                            f"objects): {exc}") from exc


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise ArtifactError(f"{path}: missing") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def _located(verify: Any, where: Path, what: str = "") -> Any:
    """Wrap a verifier so its errors name the manifest file (and which signature) they are about."""
    def located(payload: bytes, signature: Any) -> None:
        try:
            verify(payload, signature)
        except ArtifactError as error:
            raise ArtifactError(f"{where}{' ' + what if what else ''}: {error}") from error

    return located


def _pending_record(model_dir: Path, version: str) -> Path:
    return model_dir / f".{version}.pending"


def _write_record(path: Path, record: dict) -> None:
    """Write a small JSON record durably (mode 0644): the file and its directory entry."""
    write_file(path, json.dumps(record).encode(), PUBLIC)
    fsync_directory(path.parent)


def _remove_staging(model_dir: Path) -> None:
    """Remove what a crashed write left behind: staging directories of versions and of aliases.json."""
    for path in model_dir.iterdir():
        if STAGING.match(path.name):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def _now() -> str:
    return datetime.now(UTC).isoformat()


try:  # POSIX
    import fcntl

    def _try_lock(handle: Any) -> bool:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _unlock(handle: Any) -> None:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

except ImportError:  # Windows
    import msvcrt

    def _try_lock(handle: Any) -> bool:
        handle.seek(0)
        try:
            msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]  # win32 stubs
        except OSError:
            return False
        return True

    def _unlock(handle: Any) -> None:
        handle.seek(0)
        msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)  # type: ignore[attr-defined]  # win32 stubs


def _algorithm_id(stored: Any) -> Any:
    """A manifest's algorithm by its canonical id (versions written before the registry use older spellings).

    A name fedforest does not know is shown as stored.
    """
    try:
        return read_algorithm(stored).id if isinstance(stored, str) else stored
    except ParameterError:
        return stored
