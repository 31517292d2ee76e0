"""Party-to-party sealed messages relayed by the master, which can neither read nor alter them.

Each party makes an X25519 key per session and the master relays the public keys. A pair of parties
derives one ChaCha20-Poly1305 key per direction (HKDF-SHA256 over the shared secret, the session context
as salt, sender and receiver names as info). Nonces are (sequence number, slot) pairs that both sides
count, so nothing random travels and a record replayed at another sequence number or slot fails to open.

Used in vertical Paillier mode: a passive party seals its histogram layout for the label holder, and the
label holder seals each node's chosen split for the party that owns it.
"""

from __future__ import annotations

import io

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedcore.errors import ProtocolError

TAG_BYTES = 16
INFO_PREFIX = b"fedforest sealed v1|"


class SealingKey:
    """One party's X25519 key for a session; makes a `SealedChannel` to each peer."""

    def __init__(self, name: str, context: bytes) -> None:
        """A fresh X25519 key of `name`, for channels bound to `context`."""
        self.name = name
        self.context = context
        self._private = X25519PrivateKey.generate()

    def public_bytes(self) -> bytes:
        """The 32-byte public key the master relays."""
        return self._private.public_key().public_bytes_raw()

    def channel(self, peer: str, peer_public: bytes) -> SealedChannel:
        """The sealed channel between this party and `peer`."""
        try:
            shared = self._private.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
        except ValueError as error:
            raise ProtocolError(f"party {self.name!r}: the sealing key relayed for {peer!r} is invalid: "
                                f"{error}") from error
        return SealedChannel(self.name, peer, shared, self.context)


class SealedChannel:
    """Authenticated encryption between two named parties, one key per direction."""

    def __init__(self, own: str, peer: str, shared: bytes, context: bytes) -> None:
        """One AEAD key per direction between `own` and `peer`, from their shared secret and `context`."""
        self.own, self.peer = own, peer
        self._send = ChaCha20Poly1305(_direction_key(shared, context, own, peer))
        self._receive = ChaCha20Poly1305(_direction_key(shared, context, peer, own))

    def seal(self, data: bytes, sequence: int, slot: int = 0) -> bytes:
        """`data` encrypted and authenticated for the peer, bound to (sequence, slot)."""
        return self._send.encrypt(_nonce(sequence, slot), data, None)

    def open(self, blob: bytes, sequence: int, slot: int = 0) -> bytes:
        """The peer's sealed `blob` for (sequence, slot), or ProtocolError if it was altered or misplaced."""
        try:
            return self._receive.decrypt(_nonce(sequence, slot), bytes(blob), None)
        except InvalidTag as error:
            raise ProtocolError(f"party {self.own!r}: a sealed message from {self.peer!r} failed "
                                "authentication (altered, replayed or misrouted)") from error


def _direction_key(shared: bytes, context: bytes, sender: str, receiver: str) -> bytes:
    info = INFO_PREFIX + sender.encode() + b"->" + receiver.encode()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=context, info=info).derive(shared)


def _nonce(sequence: int, slot: int) -> bytes:
    if not (0 <= sequence < 2**64 and 0 <= slot < 2**32):
        raise ProtocolError(f"sealed-message position out of range: sequence {sequence}, slot {slot}")
    return sequence.to_bytes(8, "little") + slot.to_bytes(4, "little")


def arrays_to_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """Numeric arrays as one .npz byte string (no pickled objects)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy stubs: a name could fill allow_pickle
    return buffer.getvalue()


def bytes_to_arrays(blob: bytes) -> dict[str, np.ndarray]:
    """Inverse of `arrays_to_bytes`; refuses pickled content."""
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except (ValueError, OSError, EOFError) as error:
        raise ProtocolError(f"malformed sealed arrays: {error}") from error
