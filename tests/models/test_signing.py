"""Ed25519 manifest signatures: keys on disk, sign/verify, the write_version/read_version seam."""

from __future__ import annotations

import json
import stat

import pyarrow as pa
import pytest

from fedcore.errors import ArtifactError
from fedcore.models import signing
from fedcore.models.artifacts import MANIFEST, manifest_bytes, read_version, write_version

PAYLOAD = b'{"model_name":"credit","version":"v0001"}'


@pytest.fixture
def key_path(tmp_path):
    path = tmp_path / "keys" / "master.pem"
    signing.generate_signing_key(path)
    return path


def test_generated_key_is_private_and_never_overwritten(key_path):
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in key_path.read_bytes()
    before = key_path.read_bytes()
    with pytest.raises(ArtifactError, match="already exists; refusing to overwrite"):
        signing.generate_signing_key(key_path)
    assert key_path.read_bytes() == before


def test_sign_and_verify_round_trip(key_path):
    key = signing.load_signing_key(key_path)
    signature = signing.sign_manifest(PAYLOAD, key)
    signing.verify_manifest(PAYLOAD, signature, key.public_key())
    signing.verify_manifest(PAYLOAD, signature, signing.public_key_pem(key))  # PEM text works too


def test_altered_bytes_do_not_verify(key_path):
    key = signing.load_signing_key(key_path)
    signature = signing.sign_manifest(PAYLOAD, key)
    with pytest.raises(ArtifactError, match="signature does not verify"):
        signing.verify_manifest(PAYLOAD.replace(b"v0001", b"v0002"), signature, key.public_key())


def test_wrong_key_names_both_keys(key_path, tmp_path):
    key = signing.load_signing_key(key_path)
    other = signing.generate_signing_key(tmp_path / "other.pem")
    stored = signing.signer(key)(PAYLOAD)
    with pytest.raises(ArtifactError, match=f"signed by key {signing.key_id(key)}, not by the trusted key "
                                            f"{signing.key_id(other)}"):
        signing.verify_manifest(PAYLOAD, stored, other.public_key())
    with pytest.raises(ArtifactError, match="signature does not verify"):  # bare base64: no key id to compare
        signing.verify_manifest(PAYLOAD, stored["value"], other.public_key())


@pytest.mark.parametrize("bad, message", [("not base64!", "not valid base64"), ("AAAA", "64 bytes, found 3"),
                                          (42, "expected base64 text")])
def test_malformed_signatures_are_refused(key_path, bad, message):
    key = signing.load_signing_key(key_path)
    with pytest.raises(ArtifactError, match=message):
        signing.verify_manifest(PAYLOAD, bad, key.public_key())


def test_public_key_file_and_private_key_file_both_load(key_path, tmp_path):
    key = signing.load_signing_key(key_path)
    public_file = tmp_path / "master.pub"
    public_file.write_text(signing.public_key_pem(key))
    for source in (public_file, key_path, str(public_file), key):
        assert signing.key_id(signing.load_public_key(source)) == signing.key_id(key)


def test_bad_key_files_give_clear_errors(tmp_path):
    with pytest.raises(ArtifactError, match="signing key file not found"):
        signing.load_signing_key(tmp_path / "missing.pem")
    junk = tmp_path / "junk.pem"
    junk.write_text("hello")
    with pytest.raises(ArtifactError, match="not an unencrypted PEM private key"):
        signing.load_signing_key(junk)
    with pytest.raises(ArtifactError, match="not a PEM public key"):
        signing.load_public_key(junk)


def test_verifier_without_trusted_key(key_path):
    key = signing.load_signing_key(key_path)
    stored = signing.signer(key)(PAYLOAD)
    signing.verifier()(PAYLOAD, stored)  # checks against the embedded key
    with pytest.raises(ArtifactError, match="signature does not verify"):
        signing.verifier()(PAYLOAD + b" ", stored)
    signing.verifier(required=False)(PAYLOAD, None)
    with pytest.raises(ArtifactError, match="not signed, but a signature by key .* is required"):
        signing.verifier(key.public_key())(PAYLOAD, None)


def test_seam_with_write_and_read_version(key_path, tmp_path):
    key = signing.load_signing_key(key_path)
    tables = {"master": pa.table({"node": pa.array([0, 1, 2], pa.int32())})}
    written = write_version(tmp_path / "v", {"algorithm": "demo"}, tables, signer=signing.signer(key))
    assert written["signature"]["key_id"] == signing.key_id(key)
    manifest, _ = read_version(tmp_path / "v", verifier=signing.verifier(key.public_key()))
    signing.verify_manifest(manifest_bytes(manifest), manifest["signature"], key.public_key())

    path = tmp_path / "v" / MANIFEST
    edited = json.loads(path.read_text())
    edited["algorithm"] = "something-else"
    path.write_text(json.dumps(edited))
    with pytest.raises(ArtifactError, match="altered after signing"):
        read_version(tmp_path / "v", verifier=signing.verifier(key.public_key()))
