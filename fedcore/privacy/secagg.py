"""Secure aggregation of integer vectors by pairwise masks (Bonawitz et al. 2017, without dropout recovery).

Protocol. Each party makes a ``SecureAggregator`` per session and sends its X25519 public key to the
master, which relays every party's key to every party. Each pair of parties derives a shared 32-byte key
(X25519, then HKDF-SHA256 with the session id as salt and both names in the info). For a vector and a
round id, the party adds, modulo 2**64, the pseudo-random stream of each pair key whose peer sorts after
its name and subtracts the stream of each peer sorting before it. Every stream is added once and
subtracted once, so the master's sum of all masked vectors is the plain sum (``unmask_sum``).

Threat model: honest-but-curious master and parties, i.e. everyone follows the protocol and tries to
learn from what it sees.

* The master alone learns only the sum over all parties: each masked vector, and every partial sum of
  masked vectors that leaves out at least one party, is uniformly distributed modulo 2**64.
* The master together with any set of colluding parties learns the sum of the non-colluding parties'
  vectors (the colluders subtract their own from the total) and nothing about any one of them, as long
  as at least two parties stay outside the coalition. If only one party is left outside, the coalition
  learns its vector: that is inherent to publishing a sum (with 2 parties, the sum minus a colluder's own
  vector is the other's), not a weakness of the masks.
* Contrast the PPD-ERT paper's chain scheme, where the mediator plus one colluding party learn every
  party's values; here no coalition short of all-but-one party learns an individual vector.
* The master relays the public keys. An actively malicious master could substitute its own keys and
  unmask individual vectors (man in the middle). This module does not authenticate keys by itself:
  callers must pass `agree()` only keys whose signatures they checked. PPD-ERT does, with
  `fedcore.privacy.keyauth`: every party signs its key (bound to the session and its name) with its
  identity (the mutual-TLS certificate's key in deployments) and verifies every peer's signature first.
* No dropout recovery: a party that disappears after keys are exchanged leaves its pair masks in the
  sum, so the round must be aborted and restarted with a new session.
* A round id may mask only one vector per aggregator: two vectors under one mask leak their difference,
  so reuse raises ``ProtocolError``. Sums are exact modulo 2**64, i.e. as int64 while the true sum fits.

PRG: ChaCha20 (``cryptography``) keyed by the pair key, encrypting zeros, read as little-endian uint64.
The 16-byte ChaCha20 input of ``cryptography`` is a 4-byte little-endian block counter followed by the
12-byte nonce; the counter starts at 0 and the nonce is the round id as 8 little-endian bytes plus 4 zero
bytes, so distinct rounds use disjoint key streams.
"""

from __future__ import annotations

import numbers

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedcore.errors import ParameterError, ProtocolError

MODULUS_BITS = 64
KEY_BYTES = 32
INFO_PREFIX = b"fedforest secagg v1|"
MAX_ELEMENTS = (1 << 32) * 8  # 2**32 ChaCha20 blocks of 8 uint64 each: the 32-bit block counter's reach


def _check_name(name: object, error: type[Exception], who: str) -> str:
    if not isinstance(name, str) or not name or "|" in name:
        raise error(f"{who} name must be a non-empty string without '|', got {name!r}")
    return name


def _pair_info(a: str, b: str) -> bytes:
    return INFO_PREFIX + b"|".join(name.encode() for name in sorted((a, b)))


def _keystream(key: bytes, round_id: int, n: int) -> np.ndarray:
    """n little-endian uint64 words of ChaCha20(key) for this round, starting at block 0."""
    nonce = bytes(4) + round_id.to_bytes(8, "little") + bytes(4)
    encryptor = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
    return np.frombuffer(encryptor.update(bytes(8 * n)), dtype="<u8").astype(np.uint64, copy=False)


class SecureAggregator:
    """One party's side of pairwise-mask secure aggregation in one session."""

    def __init__(self, name: str, session_id: bytes) -> None:
        """Generate this party's X25519 key pair for `session_id` (bytes, the same for every party)."""
        self.name = _check_name(name, ParameterError, "party")
        if not isinstance(session_id, bytes) or not session_id:
            raise ParameterError(f"session_id must be non-empty bytes shared by all parties, got {session_id!r}")
        self.session_id = session_id
        self._private: X25519PrivateKey | None = X25519PrivateKey.generate()
        self._public = self._private.public_key().public_bytes_raw()
        self._pair_keys: dict[str, bytes] | None = None
        self._used_rounds: set[int] = set()

    def public_key(self) -> bytes:
        """This party's 32-byte raw X25519 public key, for the master to relay to the other parties."""
        return self._public

    def agree(self, peers: dict[str, bytes]) -> None:
        """Derive a pair key with every other party from `peers` (name -> public key); once per session."""
        if self._pair_keys is not None or self._private is None:
            raise ProtocolError(f"party {self.name!r}: agree() was already called in this session; "
                                "start a new SecureAggregator (new session) to change peers")
        if not isinstance(peers, dict) or not peers:
            raise ProtocolError(f"party {self.name!r}: secure aggregation needs at least 1 peer, got {peers!r}")
        seen: dict[bytes, str] = {self._public: self.name}
        pair_keys: dict[str, bytes] = {}
        for peer, key in peers.items():
            _check_name(peer, ProtocolError, "peer")
            if peer == self.name:
                raise ProtocolError(f"party {self.name!r}: peers must list only the other parties, got its own name")
            if not isinstance(key, (bytes, bytearray, memoryview)) or len(bytes(key)) != KEY_BYTES:
                found = f"{len(bytes(key))} bytes" if isinstance(key, (bytes, bytearray, memoryview)) else repr(key)
                raise ProtocolError(f"party {self.name!r}: public key of peer {peer!r} must be {KEY_BYTES} raw "
                                    f"bytes (X25519), got {found}")
            key = bytes(key)
            if key in seen:
                raise ProtocolError(f"party {self.name!r}: peer {peer!r} has the same public key as {seen[key]!r}; "
                                    "every party must send its own key (possible relay error or key substitution)")
            seen[key] = peer
            try:
                shared = self._private.exchange(X25519PublicKey.from_public_bytes(key))
            except ValueError as exc:
                raise ProtocolError(f"party {self.name!r}: public key of peer {peer!r} is invalid "
                                    f"(low-order point, no shared secret): {exc}") from exc
            hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=self.session_id, info=_pair_info(self.name, peer))
            pair_keys[peer] = hkdf.derive(shared)
        self._pair_keys = dict(sorted(pair_keys.items()))
        self._private = None  # pair keys are all we need; drop the private key

    def mask(self, vector: np.ndarray, round_id: int) -> np.ndarray:
        """Mask an integer vector (any int dtype, may be negative) for `round_id` as uint64 mod 2**64."""
        if self._pair_keys is None:
            raise ProtocolError(f"party {self.name!r}: call agree() with every other party's public key "
                                "before mask()")
        if not isinstance(round_id, numbers.Integral) or isinstance(round_id, (bool, np.bool_)) \
                or not 0 <= round_id < 1 << 64:
            raise ParameterError(f"round_id must be an integer in [0, 2**64), got {round_id!r}")
        round_id = int(round_id)
        vector = np.asarray(vector)
        if not np.issubdtype(vector.dtype, np.integer):
            raise ParameterError(f"secure aggregation masks integer vectors, got dtype {vector.dtype}; "
                                 "convert counts to an integer dtype first")
        if vector.size > MAX_ELEMENTS:
            raise ParameterError(f"vector has {vector.size} elements, more than one round can mask "
                                 f"({MAX_ELEMENTS}); split it over several round ids")
        if round_id in self._used_rounds:
            raise ProtocolError(f"party {self.name!r}: round_id {round_id} was already used in this session; "
                                "a reused mask leaks the difference of two vectors, use a fresh round id")
        self._used_rounds.add(round_id)
        masked = vector.reshape(-1).astype(np.uint64)  # two's complement wrap for negative values
        for peer, key in self._pair_keys.items():
            stream = _keystream(key, round_id, masked.size)
            if peer > self.name:
                masked += stream
            else:
                masked -= stream
        return masked.reshape(vector.shape)


def unmask_sum(masked: list[np.ndarray]) -> np.ndarray:
    """Sum every party's masked vector mod 2**64 and read it as int64, so signed sums come out right."""
    if not masked:
        raise ProtocolError("unmask_sum needs the masked vectors of every party, got none")
    arrays = [np.asarray(m) for m in masked]
    shape = arrays[0].shape
    for index, array in enumerate(arrays):
        if array.dtype not in (np.dtype(np.uint64), np.dtype(np.int64)):
            raise ProtocolError(f"masked vector {index} has dtype {array.dtype}; expected uint64 from mask()")
        if array.shape != shape:
            raise ProtocolError(f"masked vector {index} has shape {array.shape}, vector 0 has {shape}; "
                                "every party must mask a vector of the same shape")
    total = np.zeros(shape, dtype=np.uint64)
    for array in arrays:
        total += array.astype(np.uint64, copy=False)
    return total.view(np.int64)
