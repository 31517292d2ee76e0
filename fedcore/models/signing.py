"""Ed25519 signatures on model manifests: the master signs, everyone who loads a version verifies.

A signature covers `fedcore.models.artifacts.manifest_bytes(manifest)`: every manifest field but
"signature", including each file's SHA-256, so one signature protects the manifest and all tables.
`signer(key)` and `verifier(public_key)` plug into `write_version(signer=...)` / `read_version(verifier=...)`.

Stored form (manifest["signature"]): {"algorithm": "ed25519", "key_id", "public_key", "value"}. The embedded
public key only lets a reader without a trusted key detect accidental or naive tampering; trust comes from
verifying against a public key obtained out of band (`verifier(public_key=...)`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedcore.errors import ArtifactError
from fedcore.files import write_file

ALGORITHM = "ed25519"
KEY_FILE_MODE = 0o600
PUBLIC_FILE_MODE = 0o644
PUBLIC_SUFFIX = ".pub"

PublicKeySource = Ed25519PublicKey | Ed25519PrivateKey | bytes | str | os.PathLike
"""A public key as an object, PEM text/bytes, a PEM file path, or a private key (its public half is used)."""


# -- keys -------------------------------------------------------------------------------------------
def generate_signing_key(path: str | os.PathLike) -> Ed25519PrivateKey:
    """Create a new Ed25519 private key as an unencrypted PKCS#8 PEM file readable by its owner only.

    The file is 0600; its public key goes beside it (`public_key_path`, 0644) for every registry that must
    trust it.
    """
    target = Path(path)
    if public_key_path(target).exists():
        raise ArtifactError(f"{public_key_path(target)}: already exists; refusing to overwrite a key file")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    write_new_file(target, pem, KEY_FILE_MODE)
    write_public_key(key, public_key_path(target))
    return key


def public_key_path(signing_key_path: str | os.PathLike) -> Path:
    """Where the public key of a signing key file lives by default: beside it, with '.pub' appended."""
    path = Path(signing_key_path)
    return path.with_name(path.name + PUBLIC_SUFFIX)


def write_public_key(key: Ed25519PrivateKey | Ed25519PublicKey, path: str | os.PathLike) -> None:
    """Write the public key as PEM (mode 0644), never over an existing file."""
    write_new_file(Path(path), public_key_pem(key).encode(), PUBLIC_FILE_MODE)


def write_new_file(path: Path, data: bytes, mode: int) -> None:
    """Create `path` with exactly `mode` and write `data`; refuse (ArtifactError) if it already exists."""
    try:
        write_file(path, data, mode, exclusive=True)
    except FileExistsError:
        raise ArtifactError(f"{path}: already exists; refusing to overwrite a key file") from None


def load_signing_key(path: str | os.PathLike) -> Ed25519PrivateKey:
    """Read an Ed25519 private key from a PEM file written by `generate_signing_key`."""
    source = Path(path)
    try:
        data = source.read_bytes()
    except FileNotFoundError:
        raise ArtifactError(f"{source}: signing key file not found (create one with `fedforest models "
                            "keygen`)") from None
    return _private_from_pem(data, str(source))


def load_public_key(source: PublicKeySource) -> Ed25519PublicKey:
    """An Ed25519 public key from a key object, PEM text/bytes or a PEM file (public or private key)."""
    if isinstance(source, Ed25519PublicKey):
        return source
    if isinstance(source, Ed25519PrivateKey):
        return source.public_key()
    # bytes are key data, never a path (Path takes no bytes): non-PEM bytes fail as "not a PEM public key"
    if isinstance(source, bytes) or (isinstance(source, str) and _looks_like_pem(source)):
        data, where = (source.encode() if isinstance(source, str) else source), "public key"
    else:
        where = str(source)
        try:
            data = Path(source).read_bytes()
        except FileNotFoundError:
            raise ArtifactError(f"{where}: public key file not found") from None
    if b"PRIVATE KEY" in data:
        return _private_from_pem(data, where).public_key()
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise ArtifactError(f"{where}: not a PEM public key ({exc})") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise ArtifactError(f"{where}: holds a {type(key).__name__}, expected an Ed25519 public key")
    return key


def public_key_pem(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The public key as SubjectPublicKeyInfo PEM text, to hand to everyone who verifies."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.PEM,
                               serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def key_id(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """A short fingerprint of a public key (first 16 hex digits of SHA-256 of its raw bytes), for messages."""
    return hashlib.sha256(_raw_public(key)).hexdigest()[:16]


# -- signing and verifying --------------------------------------------------------------------------
def sign_manifest(manifest_bytes: bytes, key: Ed25519PrivateKey) -> str:
    """Ed25519 signature of the canonical manifest bytes, base64-encoded."""
    return base64.b64encode(key.sign(manifest_bytes)).decode("ascii")


def verify_manifest(manifest_bytes: bytes, signature: str | dict, public_key: PublicKeySource) -> None:
    """Raise ArtifactError unless `signature` signs the bytes under `public_key`.

    The signature is base64 text or the stored dict.
    """
    trusted = load_public_key(public_key)
    value = _signature_value(signature)
    if isinstance(signature, dict) and signature.get("key_id") not in (None, key_id(trusted)):
        raise ArtifactError("signature does not verify: the manifest was signed by key "
                            f"{signature.get('key_id')}, not by the trusted key {key_id(trusted)}")
    try:
        trusted.verify(value, manifest_bytes)
    except InvalidSignature:
        raise ArtifactError(f"signature does not verify with key {key_id(trusted)}: the manifest was altered "
                            "after signing, or signed by another key") from None


def signer(key: Ed25519PrivateKey) -> Callable[[bytes], dict]:
    """A `write_version(signer=...)` callable.

    It signs the manifest bytes and returns the stored signature dict.
    """
    def sign(manifest_bytes: bytes) -> dict:
        return {"algorithm": ALGORITHM, "key_id": key_id(key),
                "public_key": base64.b64encode(_raw_public(key)).decode("ascii"),
                "value": sign_manifest(manifest_bytes, key)}

    return sign


def verifier(public_key: PublicKeySource | None = None,
             required: bool = True) -> Callable[[bytes, Any], None]:
    """A `read_version(verifier=...)` callable.

    With `public_key`, the signature must verify under that trusted key. Without one, a present signature is
    checked against the key embedded in it (integrity only); `required` makes an unsigned manifest an error.
    """
    trusted = None if public_key is None else load_public_key(public_key)

    def verify(manifest_bytes: bytes, signature: Any) -> None:
        if signature is None:
            if required:
                expected = f" by key {key_id(trusted)}" if trusted is not None else ""
                raise ArtifactError(f"manifest is not signed, but a signature{expected} is required")
            return
        verify_manifest(manifest_bytes, signature,
                        trusted if trusted is not None else embedded_public_key(signature))

    return verify


def embedded_public_key(signature: Any) -> Ed25519PublicKey:
    """The public key a stored signature dict carries.

    Not a trusted key: anyone can re-sign with their own.
    """
    raw = signature.get("public_key") if isinstance(signature, dict) else None
    if not isinstance(raw, str):
        raise ArtifactError("signature does not verify: it carries no public key and no trusted key is "
                            "configured")
    try:
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(raw, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise ArtifactError("signature does not verify: its embedded public key is "
                            f"malformed ({exc})") from exc


def _signature_value(signature: Any) -> bytes:
    """The raw signature bytes from base64 text or a stored signature dict."""
    if isinstance(signature, dict):
        if signature.get("algorithm", ALGORITHM) != ALGORITHM:
            raise ArtifactError(f"signature algorithm {signature.get('algorithm')!r} is not supported "
                                f"(expected {ALGORITHM})")
        signature = signature.get("value")
    if not isinstance(signature, str):
        raise ArtifactError(f"signature is malformed: expected base64 text, found {type(signature).__name__}")
    try:
        value = base64.b64decode(signature, validate=True)
    except binascii.Error as exc:
        raise ArtifactError(f"signature is not valid base64 ({exc})") from exc
    if len(value) != 64:
        raise ArtifactError(f"signature is malformed: an Ed25519 signature has 64 bytes, found {len(value)}")
    return value


def _raw_public(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _private_from_pem(data: bytes, where: str) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ArtifactError(f"{where}: not an unencrypted PEM private key ({exc})") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise ArtifactError(f"{where}: holds a {type(key).__name__}, expected an Ed25519 private key")
    return key


def _looks_like_pem(source: str) -> bool:
    return "-----BEGIN" in source
