"""Authenticated key exchange keys.

Every party signs its X25519 public key with a long-term identity, and every party checks every other party's
signed key before it derives a pair mask (PPD-ERT's secure aggregation) or a sealed channel (vertical Paillier
mode; `purpose="sealing"`).

Without this, the master that relays the public keys could hand each party a key of its own and unmask
every individual vector (man in the middle). With it, a substituted key carries no valid signature of the
party it claims to come from, and the session stops with `KeyAuthenticationError` naming that party.

What is signed. Party P signs

    statement = lp("fedforest secagg public key v1") + lp(context) + lp(P's name) + lp(P's X25519 key)

(`lp`: 4-byte big-endian length, then the bytes). `context` binds the signature to one session: PPD-ERT
uses a digest of the master's hello (session id, schema and domain fingerprints, k, party count), which
every party receives and checks itself, so a key signed for another session (or a different hello sent
to another party) is refused. The master relays (key, signature, credential) unchanged.

Who is trusted (`TrustAnchor`):

* deployments, `ConsortiumCA`: the credential is the party's mutual-TLS certificate (ECDSA P-256, from
  `fedforest certs issue`) and the signature is made with that certificate's private key. A verifier
  accepts it when the consortium CA issued the certificate, it is valid now, and its identity
  (`urn:fedforest:institution:<name>`, the first URI SAN) names the party the key is relayed for.
  `PartyIdentity.from_certificate(name, cert, key, ca)` builds a party's identity from its agent files.
* simulation, `PinnedKeys`: `ephemeral_identities(names)` gives every simulated party a fresh Ed25519
  key; every party's anchor pins each name to its public key, handed over in process (never through the
  master). The signing, relaying and checking are the same code as in a deployment.

The master itself signs nothing here and cannot produce a signature that a party accepts for another
party: it holds neither the parties' private keys nor a certificate naming them (its own certificate
names the master role). Trust rests on the consortium CA key: whoever holds it can issue certificates.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from fedcore.errors import KeyAuthenticationError

STATEMENT_PREFIX = b"fedforest secagg public key v1"
PURPOSES = {"secure-aggregation": STATEMENT_PREFIX, "sealing": b"fedforest sealing key v1"}
"""What a signed X25519 key is for: PPD-ERT's pair masks, or vertical Paillier mode's sealed channels. The
purpose is part of the signed statement, so a key signed for one cannot be replayed as the other."""
ROLE = "institution"

PrivateKey = Ed25519PrivateKey | ec.EllipticCurvePrivateKey
PublicKey = Ed25519PublicKey | ec.EllipticCurvePublicKey


class Untrusted(Exception):
    """Why a credential or signature is refused (the text completes "refuses the key of P: ...")."""


def key_statement(context: bytes, party: str, public_key: bytes,
                  purpose: str = "secure-aggregation") -> bytes:
    """The exact bytes a party signs for its key of `purpose` in the session `context`."""
    fields = (PURPOSES[purpose], bytes(context), party.encode(), bytes(public_key))
    return b"".join(len(f).to_bytes(4, "big") + f for f in fields)


@dataclass(frozen=True)
class SignedKey:
    """A party's secure-aggregation public key with its signature and the credential to check it."""

    party: str
    public_key: bytes
    signature: bytes
    credential: bytes
    """A PEM certificate (ConsortiumCA) or a raw Ed25519 public key (PinnedKeys)."""

    def to_header(self) -> dict[str, str]:
        """The signature and credential as hex strings, for a message header."""
        return {"key_signature": self.signature.hex(), "key_credential": self.credential.hex()}

    @classmethod
    def from_header(cls, party: str, public_key: bytes, signature: str | None,
                    credential: str | None) -> SignedKey:
        """Parse what `to_header` produced.

        Absent or malformed fields become empty (and are refused later).
        """
        return cls(party, bytes(public_key), _unhex(signature), _unhex(credential))


def _unhex(value: object) -> bytes:
    try:
        return bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        return b""


class TrustAnchor(Protocol):
    """What a party trusts to tell which signing key belongs to which party."""

    def verification_key(self, party: str, credential: bytes) -> PublicKey:
        """The public key that signs for `party`, taken from `credential`; raises Untrusted."""


class ConsortiumCA:
    """Trusts certificates the consortium CA issued to `<role>` `<name>` and that are valid now."""

    def __init__(self, ca_certificate, role: str = ROLE) -> None:
        """`ca_certificate`: the CA's PEM bytes or the path of its file (`ca.pem`)."""
        from cryptography import x509

        from fedcore.transport.tls import TLSError, read_pem

        try:
            self.certificate = x509.load_pem_x509_certificate(read_pem(ca_certificate, "CA certificate"))
        except ValueError as exc:
            raise TLSError(f"the consortium CA certificate is not a PEM certificate: {exc}") from exc
        self.role = role

    def verification_key(self, party: str, credential: bytes) -> PublicKey:
        """The key that signs for `party`: that of a valid certificate the consortium CA issued to it."""
        from cryptography import x509

        from fedcore.transport.tls import certificate_identity

        try:
            certificate = x509.load_pem_x509_certificate(credential)
        except ValueError:
            raise Untrusted("its credential is not a PEM certificate") from None
        try:
            certificate.verify_directly_issued_by(self.certificate)
        except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
            raise Untrusted("its certificate was not issued by the consortium CA") from None
        now = dt.datetime.now(dt.UTC)
        if not certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc:
            raise Untrusted("its certificate is not valid now (valid "
                            f"{certificate.not_valid_before_utc:%Y-%m-%d %H:%M} to "
                            f"{certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC)")
        identity = certificate_identity(credential)
        if identity != (party, self.role):
            holder = f"{identity[1]} {identity[0]!r}" if identity else "no fedforest identity"
            raise Untrusted(f"its certificate names {holder}, not {self.role} {party!r}")
        key = certificate.public_key()
        if not isinstance(key, (Ed25519PublicKey, ec.EllipticCurvePublicKey)):
            raise Untrusted(f"its certificate holds a {type(key).__name__}; expected an EC or Ed25519 key")
        return key


class PinnedKeys:
    """Trusts exactly one raw Ed25519 public key per party name (the simulator's identities)."""

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        """Trust exactly `keys`: each party's pinned raw Ed25519 identity key."""
        self._keys = {name: bytes(key) for name, key in keys.items()}

    def verification_key(self, party: str, credential: bytes) -> PublicKey:
        """The identity key pinned for `party`, if `credential` is exactly it."""
        pinned = self._keys.get(party)
        if pinned is None:
            raise Untrusted("no identity key is pinned for that party")
        if not hmac.compare_digest(bytes(credential), pinned):
            raise Untrusted("its credential is not the identity key pinned for that party")
        return Ed25519PublicKey.from_public_bytes(pinned)


def _sign(key: PrivateKey, data: bytes) -> bytes:
    if isinstance(key, Ed25519PrivateKey):
        return key.sign(data)
    return key.sign(data, ec.ECDSA(hashes.SHA256()))


def _verify(key: PublicKey, signature: bytes, data: bytes) -> None:
    if isinstance(key, Ed25519PublicKey):
        key.verify(signature, data)
    else:
        key.verify(signature, data, ec.ECDSA(hashes.SHA256()))


def _spki(key: PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


class PartyIdentity:
    """A party's long-term signing key, the credential that vouches for it, and the anchor it trusts."""

    def __init__(self, name: str, private_key: PrivateKeyTypes, credential: bytes,
                 trust: TrustAnchor) -> None:
        """`private_key` must be Ed25519 or EC (KeyAuthenticationError otherwise: it may come from a file)."""
        if not isinstance(private_key, (Ed25519PrivateKey, ec.EllipticCurvePrivateKey)):
            raise KeyAuthenticationError(f"party {name!r}: its identity key must be Ed25519 or EC, got "
                                         f"{type(private_key).__name__}")
        self.name = name
        self.credential = bytes(credential)
        self.trust = trust
        self._key = private_key
        try:  # the party's own credential must pass the checks its peers will make
            vouched = trust.verification_key(name, self.credential)
        except Untrusted as why:
            raise KeyAuthenticationError(f"party {name!r}: its own identity is not trusted: {why}") from None
        if _spki(vouched) != _spki(private_key.public_key()):
            raise KeyAuthenticationError(f"party {name!r}: its identity key does not belong to its "
                                         "credential (certificate and key files of different identities?)")

    @classmethod
    def from_certificate(cls, name: str, certificate, key, ca_certificate) -> PartyIdentity:
        """The identity of an institution agent.

        Its mutual-TLS certificate and key (PEM bytes or file paths), trusted through the consortium CA
        certificate.
        """
        from fedcore.transport.tls import TLSError, read_pem

        pem = read_pem(certificate, "agent certificate")
        try:
            private_key = serialization.load_pem_private_key(read_pem(key, "agent key"), password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise TLSError(f"institution {name!r}: the agent key is not an unencrypted PEM "
                           f"private key: {exc}") from exc
        return cls(name, private_key, pem, ConsortiumCA(ca_certificate))

    def sign_key(self, context: bytes, public_key: bytes, purpose: str = "secure-aggregation") -> SignedKey:
        """Sign this party's `public_key` of `purpose` (see PURPOSES) for the session `context`."""
        signature = _sign(self._key, key_statement(context, self.name, public_key, purpose))
        return SignedKey(self.name, bytes(public_key), signature, self.credential)

    def verify(self, context: bytes, signed: SignedKey, purpose: str = "secure-aggregation") -> bytes:
        """The peer's public key if its signature for `context` checks out; KeyAuthenticationError if not."""
        peer = signed.party

        def refuse(reason: str) -> KeyAuthenticationError:
            return KeyAuthenticationError(f"party {self.name!r} refuses the {purpose} key relayed for "
                                          f"party {peer!r}: {reason}")

        if not signed.signature:
            raise refuse("it carries no signature")
        try:
            key = self.trust.verification_key(peer, signed.credential)
        except Untrusted as why:
            raise refuse(str(why)) from None
        try:
            _verify(key, signed.signature, key_statement(context, peer, signed.public_key, purpose))
        except InvalidSignature:
            raise refuse(f"the signature does not verify against the identity of {peer!r} (the key was "
                         "replaced on the way, or was signed for another session)") from None
        return signed.public_key

    def verify_peers(self, context: bytes, signed: Iterable[SignedKey]) -> dict[str, bytes]:
        """Each peer's name -> its verified public key (this party left out), for SecureAggregator.agree."""
        return {s.party: self.verify(context, s) for s in signed if s.party != self.name}


def ephemeral_identities(names: Iterable[str]) -> dict[str, PartyIdentity]:
    """A fresh Ed25519 identity per simulated party, each trusting all of them by pinned public keys."""
    keys = {name: Ed25519PrivateKey.generate() for name in names}
    raw = {name: key.public_key().public_bytes_raw() for name, key in keys.items()}
    trust = PinnedKeys(raw)
    return {name: PartyIdentity(name, key, raw[name], trust) for name, key in keys.items()}


def context_digest(*parts: bytes) -> bytes:
    """SHA-256 over length-prefixed parts: a fixed-size session context from several fields."""
    return hashlib.sha256(b"".join(len(p).to_bytes(4, "big") + p for p in parts)).digest()
