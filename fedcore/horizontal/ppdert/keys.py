"""A party's side of the secure-aggregation keys, shared by PPD-ERT and horizontal boosting.

At hello the party makes its session aggregator and signs its public key with its identity, bound to the
hello it received (`key_context`); on the first masked request it verifies every relayed peer key against
its party's signature before any mask is derived.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedcore.errors import KeyAuthenticationError, MalformedMessage, ProtocolError
from fedcore.horizontal.ppdert.agreed import key_context

if TYPE_CHECKING:
    from fedcore.privacy.keyauth import PartyIdentity
    from fedcore.privacy.secagg import SecureAggregator
    from fedcore.protocol.messages import Header


def announced_parties(name: str, hello: Header, expected: int | None) -> int:
    """The master's party count from `hello`, refused unless it is the count of the party's own federation.

    A master announcing one party would have every party send its sums unmasked, and one announcing more
    would shrink each party's share of distributed noise. `expected`: the institutions in this party's own
    config (None: in-process use, the master's count).
    """
    n_parties = hello.int("n_parties", 1)
    if expected is not None and n_parties != expected:
        raise ProtocolError(f"party {name!r}: the master announced {n_parties} parties, this institution's "
                            f"federation lists {expected}; refusing to aggregate with another count")
    return n_parties


def signed_key(name: str, identity: PartyIdentity | None,
               hello: Header) -> tuple[SecureAggregator, bytes, dict[str, np.ndarray], dict[str, str]]:
    """This session's aggregator, the key context, and the hello reply's arrays and header fields.

    Refused (KeyAuthenticationError) without this party's own signing identity.
    """
    from fedcore.privacy.secagg import SecureAggregator

    if identity is None or identity.name != name:
        found = "none" if identity is None else f"the identity of {identity.name!r}"
        raise KeyAuthenticationError(f"party {name!r} needs its own signing identity to authenticate its "
                                     f"secure-aggregation key (got {found}): an institution agent uses its "
                                     "mutual-TLS certificate and key")
    aggregator = SecureAggregator(name, hello.hex("session_id"))
    context = key_context(hello)
    signed = identity.sign_key(context, aggregator.public_key())
    return (aggregator, context, {"public_key": np.frombuffer(signed.public_key, dtype=np.uint8).copy()},
            signed.to_header())


def verified_peer_keys(name: str, n_parties: int, identity: PartyIdentity | None,
                       aggregator: SecureAggregator | None, context: bytes, h: Header,
                       rows: np.ndarray) -> dict[str, bytes]:
    """The relayed peers' public keys, each checked against its party's signature for this session."""
    from fedcore.privacy.keyauth import SignedKey

    for field in ("peer_names", "peer_signatures", "peer_credentials"):
        if not isinstance(h.get(field) or [], list):
            raise MalformedMessage(f"header field {field!r} must be a list")
    names = list(h.get("peer_names") or [])
    if not all(isinstance(peer, str) for peer in names):
        raise MalformedMessage("header field 'peer_names' must be a list of party names")
    if len(names) != len(rows) or len(set(names)) != len(names) or len(names) != n_parties \
            or name not in names:
        raise ProtocolError(f"party {name!r}: the master relayed keys for {names}; expected one for "
                            f"each of the {n_parties} parties, this one included")
    n = len(names)
    signatures = h.get("peer_signatures") or [None] * n
    credentials = h.get("peer_credentials") or [None] * n
    if len(signatures) != n or len(credentials) != n:
        raise ProtocolError(f"party {name!r}: the master relayed {len(signatures)} signatures and "
                            f"{len(credentials)} credentials for {n} keys")
    signed = [SignedKey.from_header(peer, row.astype(np.uint8).tobytes(), sig, cred)
              for peer, row, sig, cred in zip(names, rows, signatures, credentials, strict=True)]
    assert aggregator is not None and identity is not None, "hello made the aggregator, with the identity"
    own = next(s for s in signed if s.party == name)
    if own.public_key != aggregator.public_key():
        raise KeyAuthenticationError(f"party {name!r}: the master relayed another key as this party's own")
    return identity.verify_peers(context, signed)
