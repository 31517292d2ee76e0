"""PPD-ERT against a master that tampers with the secure-aggregation keys it relays.

Every party checks every peer's signed key before deriving masks, so a substituted, unsigned or replayed key
stops the run with KeyAuthenticationError naming the party; honest runs give the same forest as before.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fedcore.errors import KeyAuthenticationError
from fedcore.horizontal import PPDERTClassifier
from fedcore.horizontal.ppdert.agreed import key_context
from fedcore.horizontal.ppdert.master import PPDERTMaster
from fedcore.horizontal.ppdert.party import PPDERTParty
from fedcore.privacy.keyauth import PartyIdentity, ephemeral_identities, key_statement
from fedcore.privacy.secagg import SecureAggregator
from fedcore.protocol.messages import Message
from fedcore.transport.inprocess import InProcessTransport
from fedcore.transport.tls import init_ca, issue_certificate
from tests.horizontal.common import horizontal_table, split_rows

NAMES = ("north", "south", "east")
OPTIONS = {"n_estimators": 3, "max_depth": 4, "random_state": 3, "allow_data_ranges": True}
SUBSTITUTED = ("party 'north' refuses the secure-aggregation key relayed for party 'south': the signature "
               "does not verify against the identity of 'south' (the key was replaced on the way, or was "
               "signed for another session)")


@pytest.fixture(scope="module")
def federation(tmp_path_factory) -> SimpleNamespace:
    """The parties' rows, the plain (unmasked) reference run, and identities from a consortium CA."""
    frames = dict(zip(NAMES, split_rows(horizontal_table(seed=7), 3, seed=1), strict=True))
    plain = PPDERTClassifier(**OPTIONS, secure_aggregation=False).fit(frames, "target")
    certs = tmp_path_factory.mktemp("certs")
    init_ca(certs)
    for name in NAMES:
        issue_certificate(certs, name, certs)
    issue_certificate(certs, "master", certs, role="master")
    identities = {name: PartyIdentity.from_certificate(name, certs / f"{name}.pem", certs / f"{name}.key",
                                                       certs / "ca.pem") for name in NAMES}
    return SimpleNamespace(frames=frames, plain=plain, identities=identities, certs=certs)


class RelayTransport(InProcessTransport):
    """The master's side of the wire with a hook on the relayed keys: an actively malicious master.

    `tamper(transport, message)` rewrites the message that relays the keys.
    """

    def __init__(self, handlers, tamper=None) -> None:
        super().__init__(handlers, record_payloads=True)
        self.tamper = tamper

    def exchange(self, requests: dict[str, Message]) -> dict[str, Message]:
        if self.tamper is not None:
            requests = {name: self.tamper(self, m) if "peer_keys" in m.arrays else m
                        for name, m in requests.items()}
        return super().exchange(requests)

    def sent(self, kind: str, sender: str | None = None) -> list[Message]:
        return [Message.from_bytes(e.payload) for e in self.transcript
                if e.kind == kind and (sender is None or e.sender == sender)]


def _fit(federation, identities, tamper=None, session_id: bytes = b"session-0001"):
    plain = federation.plain
    k = plain.params.n_candidate_features(plain.schema_.n_features)
    parties = [PPDERTParty(name, frame, plain.schema_, seed=OPTIONS["random_state"], low=plain._low,
                           high=plain._high, k=k, identity=identities.get(name))
               for name, frame in federation.frames.items()]
    transport = RelayTransport({p.name: p.handle for p in parties}, tamper)
    master = PPDERTMaster(transport, plain.params, plain.schema_, low=plain._low, high=plain._high,
                          session_id=session_id)
    return master.fit(), transport


def _identities(federation, kind: str) -> dict[str, PartyIdentity]:
    return federation.identities if kind == "certificates" else ephemeral_identities(NAMES)


def _relayed(message: Message, name: str, key: bytes, signature: str | None = None,
             credential: str | None = None):
    """The relay message with `name`'s key (and optionally its signature and credential, as hex) replaced."""
    h, arrays = dict(message.header), dict(message.arrays)
    i = h["peer_names"].index(name)
    arrays["peer_keys"] = arrays["peer_keys"].copy()
    arrays["peer_keys"][i] = list(key)
    for field, value in (("peer_signatures", signature), ("peer_credentials", credential)):
        if value is not None:
            h[field] = [*h[field][:i], value, *h[field][i + 1:]]
    return Message(message.kind, h, arrays)


def _attacker_key() -> bytes:
    return SecureAggregator("master", b"session-0001").public_key()  # a key whose secret the master holds


@pytest.mark.parametrize("kind", ["certificates", "ephemeral"])
def test_honest_relay_gives_the_same_forest_as_without_masks(federation, kind) -> None:
    model, transport = _fit(federation, _identities(federation, kind))
    assert model.same_as(federation.plain.model_)
    assert all({"key_signature", "key_credential"} <= set(m.header) for m in transport.sent("hello_reply"))
    assert "ppdert_masked_counts" in {e.kind for e in transport.transcript}


@pytest.mark.parametrize("kind", ["certificates", "ephemeral"])
def test_a_master_that_swaps_one_partys_key_is_caught(federation, kind) -> None:
    attacker = _attacker_key()
    with pytest.raises(KeyAuthenticationError) as caught:
        _fit(federation, _identities(federation, kind), tamper=lambda t, m: _relayed(m, "south", attacker))
    assert str(caught.value) == SUBSTITUTED


def test_a_master_that_signs_the_swapped_key_itself_is_caught(federation) -> None:
    """The master's own certificate, from the same CA, cannot vouch for an institution's key."""
    attacker = _attacker_key()
    master_key = serialization.load_pem_private_key((federation.certs / "master.key").read_bytes(),
                                                    password=None)
    master_pem = (federation.certs / "master.pem").read_bytes()

    def sign_as_master(transport: RelayTransport, message: Message) -> Message:
        context = key_context(transport.sent("hello")[0].header)  # the master wrote the hello: it knows this
        signature = master_key.sign(key_statement(context, "south", attacker), ec.ECDSA(hashes.SHA256()))
        return _relayed(message, "south", attacker, signature.hex(), master_pem.hex())

    with pytest.raises(KeyAuthenticationError) as caught:
        _fit(federation, federation.identities, tamper=sign_as_master)
    assert str(caught.value) == ("party 'north' refuses the secure-aggregation key relayed for party "
                                 "'south': its certificate names master 'master', not institution 'south'")


def test_a_key_signed_for_another_session_is_refused(federation) -> None:
    """Replay: south's genuine key, signature and certificate from session 1, relayed in session 2."""
    _, first = _fit(federation, federation.identities, session_id=b"session-0001")
    old = first.sent("hello_reply", sender="south")[0]
    old_key = old.arrays["public_key"].tobytes()

    def replay(transport: RelayTransport, message: Message) -> Message:
        return _relayed(message, "south", old_key, old.header["key_signature"], old.header["key_credential"])

    with pytest.raises(KeyAuthenticationError) as caught:
        _fit(federation, federation.identities, tamper=replay, session_id=b"session-0002")
    assert str(caught.value) == SUBSTITUTED


def test_unsigned_keys_and_parties_without_an_identity_are_refused(federation) -> None:
    def strip(transport: RelayTransport, message: Message) -> Message:
        return Message(message.kind, {k: v for k, v in message.header.items() if k != "peer_signatures"},
                       message.arrays)

    with pytest.raises(KeyAuthenticationError) as caught:
        _fit(federation, federation.identities, tamper=strip)
    assert str(caught.value) == ("party 'north' refuses the secure-aggregation key relayed for party "
                                 "'south': it carries no signature")
    without_east = {n: i for n, i in federation.identities.items() if n != "east"}
    with pytest.raises(KeyAuthenticationError,
                       match="party 'east' needs its own signing identity to authenticate its "
                             r"secure-aggregation key \(got none\)"):
        _fit(federation, without_east)


class RoundTransport(RelayTransport):
    """A master that names a masked cells round outside the 64-bit round ids: each party refuses it."""

    def exchange(self, requests: dict[str, Message]) -> dict[str, Message]:
        requests = {name: Message(m.kind, {**m.header, "round_id": 1 << 64}, m.arrays)
                    if m.kind == "ppdert_cells" else m for name, m in requests.items()}
        return super().exchange(requests)


def test_a_masked_cells_round_beyond_64_bits_is_refused_before_its_multipliers_are_drawn(federation) -> None:
    """A malformed header, refused before the multipliers are drawn (an OverflowError there was our bug)."""
    from fedcore.errors import ProtocolError

    plain = federation.plain
    k = plain.params.n_candidate_features(plain.schema_.n_features)
    parties = [PPDERTParty(name, frame, plain.schema_, seed=OPTIONS["random_state"], low=plain._low,
                           high=plain._high, k=k, identity=federation.identities[name])
               for name, frame in federation.frames.items()]
    transport = RoundTransport({p.name: p.handle for p in parties})
    master = PPDERTMaster(transport, plain.params, plain.schema_, low=plain._low, high=plain._high,
                          session_id=b"session-0002")
    refusal = (r"^party 'north' refuses a malformed 'ppdert_cells' message: header field 'round_id' must "
               r"be an integer in \[0, 1\.84467e\+19\]$")
    with pytest.raises(ProtocolError, match=refusal):
        master.fit()
