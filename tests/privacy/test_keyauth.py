"""Signed secure-aggregation keys: what a party accepts as another party's key, and what it refuses.

Deployment identities are the institutions' mutual-TLS certificates from the consortium CA; simulation
identities are ephemeral Ed25519 keys pinned at every party. Both go through the same sign/verify code.
"""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fedcore.errors import KeyAuthenticationError
from fedcore.privacy.keyauth import PartyIdentity, SignedKey, ephemeral_identities, key_statement
from fedcore.privacy.secagg import SecureAggregator
from fedcore.transport.tls import identity_uri, init_ca, issue_certificate, load_ca

SESSION_A, SESSION_B = b"context of session A", b"context of session B"
KEY = bytes(range(32))


def _refused(verifier: str, peer: str, reason: str) -> str:
    return f"party '{verifier}' refuses the secure-aggregation key relayed for party '{peer}': {reason}"


SUBSTITUTED = ("the signature does not verify against the identity of '{peer}' (the key was replaced on the "
               "way, or was signed for another session)")


@pytest.fixture(scope="module")
def consortium(tmp_path_factory):
    """A consortium CA with three institutions and the master, and a second, foreign CA."""
    folder = tmp_path_factory.mktemp("certs")
    init_ca(folder)
    for name in ("alice", "bob", "carol"):
        issue_certificate(folder, name, folder)
    issue_certificate(folder, "master", folder, role="master")
    foreign = tmp_path_factory.mktemp("foreign")
    init_ca(foreign, name="another CA")
    issue_certificate(foreign, "bob", foreign)
    return folder, foreign


def _identity(folder, name: str, ca_folder=None) -> PartyIdentity:
    return PartyIdentity.from_certificate(name, folder / f"{name}.pem", folder / f"{name}.key",
                                          (ca_folder or folder) / "ca.pem")


def _pem(folder, name: str) -> bytes:
    return (folder / f"{name}.pem").read_bytes()


def _raw_key(folder, name: str):
    return serialization.load_pem_private_key((folder / f"{name}.key").read_bytes(), password=None)


# -- ephemeral (simulation) identities ------------------------------------------------------------------
def test_ephemeral_identities_sign_and_verify_each_other() -> None:
    ids = ephemeral_identities(["alice", "bob", "carol"])
    keys = {name: SecureAggregator(name, b"s").public_key() for name in ids}
    signed = [ids[name].sign_key(SESSION_A, keys[name]) for name in ids]
    assert ids["alice"].verify_peers(SESSION_A, signed) == {"bob": keys["bob"], "carol": keys["carol"]}
    assert len(signed[0].signature) == 64 and signed[0].credential == ids["alice"].credential


def test_a_substituted_key_or_a_replay_from_another_session_is_refused() -> None:
    ids = ephemeral_identities(["alice", "bob"])
    good = ids["bob"].sign_key(SESSION_A, KEY)
    swapped = SignedKey("bob", bytes(32 * [7]), good.signature, good.credential)
    with pytest.raises(KeyAuthenticationError) as caught:
        ids["alice"].verify(SESSION_A, swapped)
    assert str(caught.value) == _refused("alice", "bob", SUBSTITUTED.format(peer="bob"))
    with pytest.raises(KeyAuthenticationError, match="signed for another session"):
        ids["alice"].verify(SESSION_B, good)  # bob's genuine key and signature, but for session A
    assert ids["alice"].verify(SESSION_A, good) == KEY


def test_pinned_keys_refuse_missing_signatures_and_made_up_identities() -> None:
    ids = ephemeral_identities(["alice", "bob"])
    signed = ids["bob"].sign_key(SESSION_A, KEY)
    mallory = ephemeral_identities(["bob"])["bob"]  # a key pair the relay made up, under bob's name
    cases = {
        "it carries no signature": SignedKey("bob", KEY, b"", signed.credential),
        "its credential is not the identity key pinned for that party": mallory.sign_key(SESSION_A, KEY),
        "no identity key is pinned for that party": SignedKey("dave", KEY, signed.signature,
                                                              signed.credential),
    }
    for reason, forged in cases.items():
        with pytest.raises(KeyAuthenticationError) as caught:
            ids["alice"].verify(SESSION_A, forged)
        assert str(caught.value) == _refused("alice", forged.party, reason)


def test_the_statement_binds_context_name_and_key_unambiguously() -> None:
    assert key_statement(b"ab", "c", KEY) != key_statement(b"a", "bc", KEY)
    assert key_statement(SESSION_A, "bob", KEY) != key_statement(SESSION_B, "bob", KEY)
    assert key_statement(SESSION_A, "bob", KEY).endswith(KEY)


# -- certificate (deployment) identities -------------------------------------------------------------
def test_certificate_identities_sign_with_the_tls_key_and_verify_against_the_ca(consortium) -> None:
    folder, _ = consortium
    alice, bob = _identity(folder, "alice"), _identity(folder, "bob")
    signed = bob.sign_key(SESSION_A, KEY)
    assert signed.credential == _pem(folder, "bob")
    assert alice.verify(SESSION_A, signed) == KEY
    with pytest.raises(KeyAuthenticationError) as caught:
        alice.verify(SESSION_A, SignedKey("bob", bytes(32), signed.signature, signed.credential))
    assert str(caught.value) == _refused("alice", "bob", SUBSTITUTED.format(peer="bob"))
    with pytest.raises(KeyAuthenticationError, match="signed for another session"):
        alice.verify(SESSION_B, signed)


def test_a_relay_cannot_sign_for_a_party_with_any_other_certificate(consortium) -> None:
    folder, foreign = consortium
    alice = _identity(folder, "alice")
    cases = {  # who signs bob's key, with which certificate -> why alice refuses it
        "master": (_raw_key(folder, "master"), _pem(folder, "master"),
                   "its certificate names master 'master', not institution 'bob'"),
        "carol": (_raw_key(folder, "carol"), _pem(folder, "carol"),
                  "its certificate names institution 'carol', not institution 'bob'"),
        "foreign CA": (_raw_key(foreign, "bob"), _pem(foreign, "bob"),
                       "its certificate was not issued by the consortium CA"),
        "not a certificate": (_raw_key(folder, "bob"), b"-----BEGIN NOTHING-----",
                              "its credential is not a PEM certificate"),
    }
    for case, (key, credential, reason) in cases.items():
        signature = key.sign(key_statement(SESSION_A, "bob", KEY), ec.ECDSA(hashes.SHA256()))
        with pytest.raises(KeyAuthenticationError) as caught:
            alice.verify(SESSION_A, SignedKey("bob", KEY, signature, credential))
        assert str(caught.value) == _refused("alice", "bob", reason), case


def test_an_expired_certificate_is_refused(consortium, tmp_path) -> None:
    folder, _ = consortium
    ca_cert, ca_key = load_ca(folder)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bob")]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=30)).not_valid_after(now - dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier(identity_uri("bob", "institution"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    signature = key.sign(key_statement(SESSION_A, "bob", KEY), ec.ECDSA(hashes.SHA256()))
    with pytest.raises(KeyAuthenticationError,
                       match=r"refuses the secure-aggregation key relayed for party 'bob': "
                             r"its certificate is not valid now \(valid .* UTC\)"):
        _identity(folder, "alice").verify(SESSION_A, SignedKey("bob", KEY, signature, pem))


def test_an_agent_refuses_to_start_with_an_identity_that_is_not_its_own(consortium) -> None:
    folder, foreign = consortium
    with pytest.raises(KeyAuthenticationError,
                       match="party 'alice': its own identity is not trusted: its certificate "
                             "names institution 'bob', not institution 'alice'"):
        PartyIdentity.from_certificate("alice", folder / "bob.pem", folder / "bob.key", folder / "ca.pem")
    with pytest.raises(KeyAuthenticationError,
                       match="party 'bob': its identity key does not belong to its credential"):
        PartyIdentity.from_certificate("bob", folder / "bob.pem", folder / "carol.key", folder / "ca.pem")
    with pytest.raises(KeyAuthenticationError, match="not issued by the consortium CA"):
        _identity(foreign, "bob", ca_folder=folder)
