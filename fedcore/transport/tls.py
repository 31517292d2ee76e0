"""The consortium's certificates: two CAs, and one ECDSA P-256 certificate per master and institution.

    init_ca("certs")                                              # certs/ca.pem, certs/ca.key
    init_master_ca("certs")                                       # certs/master-ca.pem, certs/master-ca.key
    issue_certificate("certs", "master", "certs", role="master")  # certs/master.pem, certs/master.key
    issue_certificate("certs", "bank", "certs", role="institution", hosts=("bank.example.org",))

The consortium CA (`ca.pem`) signs the institutions' certificates: the master checks an agent's server
certificate against it, and institutions check each other's signing keys with it
(`fedcore.privacy.keyauth`). The master CA (`master-ca.pem`, config `tls.master_ca`) is a second
self-signed root that signs master certificates only; `issue_certificate` signs a master's certificate
with it when the folder holds one, and refuses to sign an institution's with it. An agent given the
master CA trusts only it for clients, so another institution's certificate fails the TLS handshake and
nothing that institution sends is ever read (`fedcore.transport.flight`). Without a master CA the master's
certificate comes from the consortium CA, as before, and every member passes the agents' handshake.

Every certificate names its holder and role three ways: CN = name and OU = role (for people), the first
subject-alternative name `urn:fedforest:<role>:<name>` (what an agent checks: gRPC reports the first SAN as
the TLS peer identity, and Arrow Flight hands it to the server as `ServerCallContext.peer_identity()`),
and the DNS name `<name>.<role>.fedforest` (what the master checks: it connects to an institution with that
name as the TLS target, so an endpoint held by another consortium member is refused). The hosts the
agent listens on follow as further SANs. P-256 because every TLS stack accepts it (gRPC here also accepts
Ed25519, older peers may not). Private keys are written with mode 0600 and never overwritten by accident.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedcore.errors import FedForestError
from fedcore.files import PRIVATE, PUBLIC, write_file
from fedcore.names import DNS_LABEL

ROLES = ("master", "institution")
CONSORTIUM_CA = "ca"
MASTER_CA = "master-ca"
"""File stem of the master CA (`master-ca.pem`, `master-ca.key`), beside the consortium CA's `ca.pem`."""
IDENTITY_PREFIX = "urn:fedforest:"
CLOCK_SKEW = dt.timedelta(minutes=5)


class TLSError(FedForestError):
    """A certificate or key is missing, unreadable, invalid or would be overwritten."""


def identity_uri(name: str, role: str) -> str:
    """The URI SAN that identifies `name` in `role` (the TLS peer identity agents check)."""
    return f"{IDENTITY_PREFIX}{role}:{name}"


def server_name(name: str, role: str = "institution") -> str:
    """The DNS SAN the master expects from an agent: `<name>.<role>.fedforest`."""
    return f"{name}.{role}.fedforest"


def parse_identity(identity: str) -> tuple[str, str] | None:
    """(name, role) from an identity URI, or None when it is not a fedforest identity."""
    if not identity.startswith(IDENTITY_PREFIX):
        return None
    role, _, name = identity[len(IDENTITY_PREFIX):].partition(":")
    return (name, role) if role in ROLES and name else None


def init_ca(directory: str | os.PathLike, name: str = "fedforest consortium CA", days: int = 3650,
            overwrite: bool = False, stem: str = CONSORTIUM_CA) -> tuple[Path, Path]:
    """Create a CA in `directory`: `<stem>.pem` and `<stem>.key` (0600); returns their paths.

    By default the consortium CA (ca.pem, ca.key); `init_master_ca` makes the master CA.
    """
    directory = Path(directory)
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
    _refuse_overwrite([cert_path, key_path], overwrite)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + dt.timedelta(days=_positive_days(days)))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(cert_path, key_path, cert, key, overwrite)
    return cert_path, key_path


def init_master_ca(directory: str | os.PathLike, name: str = "fedforest master CA", days: int = 3650,
                   overwrite: bool = False) -> tuple[Path, Path]:
    """Create the master CA in `directory`: master-ca.pem and master-ca.key (0600); returns their paths.

    It signs master certificates only. Agents given it (`tls.master_ca`) accept no other client.
    """
    return init_ca(directory, name=name, days=days, overwrite=overwrite, stem=MASTER_CA)


def has_master_ca(ca_dir: str | os.PathLike) -> bool:
    """Whether `ca_dir` holds a master CA (`master-ca.pem`)."""
    return (Path(ca_dir) / f"{MASTER_CA}.pem").exists()


def issue_certificate(ca_dir: str | os.PathLike, name: str, out_dir: str | os.PathLike,
                      role: str = "institution", hosts: Sequence[str] = ("127.0.0.1", "localhost"),
                      days: int = 825, overwrite: bool = False,
                      ca: str | None = None) -> tuple[Path, Path]:
    """Issue `<name>.pem`/`<name>.key` in `out_dir`, signed by a CA in `ca_dir`; returns their paths.

    `ca` is the signing CA's file stem: by default the master CA for a master when `ca_dir` holds one
    (`has_master_ca`), the consortium CA otherwise. The master CA never signs an institution's certificate.
    """
    if role not in ROLES:
        raise TLSError(f"role must be one of {ROLES}, got {role!r}")
    if ca is None:
        ca = MASTER_CA if role == "master" and has_master_ca(ca_dir) else CONSORTIUM_CA
    if ca == MASTER_CA and role != "master":
        raise TLSError(f"the master CA signs master certificates only, not {role} {name!r}'s: an agent "
                       "accepts as its client whoever holds a certificate from it")
    if not DNS_LABEL.match(name):
        raise TLSError(f"certificate name {name!r} must be 1-63 letters, digits, '-' or '_', starting with a "
                       "letter or digit (it becomes part of a DNS name)")
    out_dir = Path(out_dir)
    cert_path, key_path = out_dir / f"{name}.pem", out_dir / f"{name}.key"
    _refuse_overwrite([cert_path, key_path], overwrite)
    ca_cert, ca_key = load_ca(ca_dir, stem=ca)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    not_after = min(now + dt.timedelta(days=_positive_days(days)), ca_cert.not_valid_after_utc)
    subject = x509.Name([
        x509.NameAttribute(NameOID.COMMON_NAME, name),
        x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
    ])
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity_uri(name, role)),
                                    x509.DNSName(server_name(name, role))]
    sans += [_host_name(h) for h in hosts]
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write(cert_path, key_path, cert, key, overwrite)
    return cert_path, key_path


def load_ca(ca_dir: str | os.PathLike,
            stem: str = CONSORTIUM_CA) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A CA's certificate and key from `ca_dir` (made by `init_ca`; `stem` "master-ca" for the master CA)."""
    ca_dir = Path(ca_dir)
    what = "master CA" if stem == MASTER_CA else "CA"
    cert_pem = read_pem(ca_dir / f"{stem}.pem", f"{what} certificate")
    key_pem = read_pem(ca_dir / f"{stem}.key", f"{what} key")
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        # cryptography returns any private key type; init_ca writes an EC one
        key = cast(ec.EllipticCurvePrivateKey, serialization.load_pem_private_key(key_pem, password=None))
    except (ValueError, TypeError) as exc:
        raise TLSError(f"{ca_dir}: {stem}.pem/{stem}.key are not a PEM certificate and "
                       f"unencrypted key: {exc}") from exc
    if _spki(cert.public_key()) != _spki(key.public_key()):
        raise TLSError(f"{ca_dir}: {stem}.key does not belong to {stem}.pem")
    return cert, key


def issued_by(certificate: bytes, ca_certificate: bytes) -> bool:
    """Whether the PEM `certificate` was signed by the PEM `ca_certificate` (its signature only)."""
    try:
        cert = x509.load_pem_x509_certificate(certificate)
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_certificate))
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        return False
    return True


def certificate_identity(pem: bytes) -> tuple[str, str] | None:
    """(name, role) a PEM certificate was issued for, or None when it carries no fedforest identity."""
    cert = x509.load_pem_x509_certificate(pem)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    uris = sans.get_values_for_type(x509.UniformResourceIdentifier)
    return parse_identity(uris[0]) if uris else None


def read_pem(source: str | os.PathLike | bytes, what: str) -> bytes:
    """PEM bytes given either directly or as a file path; a missing file is a TLSError naming `what`."""
    if isinstance(source, bytes):
        return source
    try:
        return Path(source).read_bytes()
    except OSError as exc:
        raise TLSError(f"cannot read the {what} {source}: {exc.strerror}") from exc


def _spki(public_key) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER,
                                   serialization.PublicFormat.SubjectPublicKeyInfo)


def _host_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _key_usage(ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
                         encipher_only=False, decipher_only=False)


def _positive_days(days: int) -> int:
    if days < 1:
        raise TLSError(f"validity must be at least one day, got {days}")
    return days


def _refuse_overwrite(paths: list[Path], overwrite: bool) -> None:
    existing = [str(p) for p in paths if p.exists()]
    if existing and not overwrite:
        raise TLSError(f"refusing to overwrite {', '.join(existing)} (pass overwrite=True / --force to "
                       "replace)")


def _write(cert_path: Path, key_path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey,
           overwrite: bool) -> None:
    """Write the key (mode 0600, created exclusively unless overwriting) and then the certificate (0644)."""
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    # explicit modes whatever the umask: the key 0600, the certificate 0644 (a writable CA is a forged CA)
    try:
        write_file(key_path, key_pem, PRIVATE, exclusive=not overwrite)
        write_file(cert_path, cert.public_bytes(serialization.Encoding.PEM), PUBLIC)
    except OSError as exc:
        raise TLSError(f"cannot write {exc.filename}: {exc.strerror}") from exc
