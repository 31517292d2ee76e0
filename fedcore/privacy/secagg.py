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
  so reuse raises ``ProtocolError``. Sums are exact modulo 2**b, i.e. as signed b-bit integers while the
  true sum fits. The ring b is 64 bits unless the session agrees on a narrower one (16 or 32,
  `ring_bits_for` the largest possible sum): the masks are uniform in that ring, so each masked vector
  and each partial sum stays uniformly distributed there, exactly as in the 64-bit ring.

PRG: AES-256 in counter mode (``cryptography``, AES-NI) keyed by the pair key, encrypting zeros, read as
little-endian words (Bonawitz et al. instantiate the PRG with AES-CTR too; it ran about 1.5x faster than
ChaCha20 here, docs/benchmarks.md). The 16-byte initial counter block is the round id as 8 little-endian
bytes, one byte naming the ring (0 for 64 bits, else b) and 7 zero bytes, which the big-endian block counter
counts up from: distinct rounds and distinct rings use unrelated key streams, and a round's `MAX_ELEMENTS`
words (2**34 blocks) never carry into the ring byte. A b-bit ring reads its stream as little-endian b-bit
words.
"""

from __future__ import annotations

import numbers

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedcore.errors import ParameterError, ProtocolError

MODULUS_BITS = 64
"""The default ring: masks and sums modulo 2**64."""
RING_BITS = (16, 32, 64)
"""Ring widths a session may agree on (`ring_bits_for`): a narrower ring masks the same counts with
fewer key-stream bytes and sends fewer bytes, and is as hiding for sums that fit it."""
KEY_BYTES = 32
INFO_PREFIX = b"fedforest secagg v1|"
MAX_ELEMENTS = (1 << 32) * 8  # words of one round: 2**34 AES blocks, far below the counter's 2**56


def _check_name(name: object, error: type[Exception], who: str) -> str:
    if not isinstance(name, str) or not name or "|" in name:
        raise error(f"{who} name must be a non-empty string without '|', got {name!r}")
    return name


def _pair_info(a: str, b: str) -> bytes:
    return INFO_PREFIX + b"|".join(name.encode() for name in sorted((a, b)))


def _encryptor(key: bytes, round_id: int, bits: int) -> CipherContext:
    """AES-256-CTR under `key` from this round's and ring's initial counter block (see the module doc)."""
    ring = 0 if bits == MODULUS_BITS else bits
    counter = round_id.to_bytes(8, "little") + bytes([ring]) + bytes(7)
    return Cipher(algorithms.AES(key), modes.CTR(counter)).encryptor()


def keystream(key: bytes, round_id: int, n: int, bits: int = MODULUS_BITS) -> np.ndarray:
    """`n` little-endian `bits`-bit words of AES-256-CTR(key) for this round and ring, from its first block.

    The ring is part of the initial counter block (0 for the 64-bit ring): masks of different widths are
    independent streams, so a master that told parties different rings in one round would sum unrelated
    masks, not learn a vector (one 64-bit word is otherwise four 16-bit words of the same key stream).
    """
    encryptor = _encryptor(key, round_id, bits)
    words = np.empty(n, dtype=f"<u{bits // 8}")
    out = words.data.cast("B")
    for start in range(0, len(out), _CHUNK_BYTES):  # encrypts zeros straight into the words
        piece = out[start:start + _CHUNK_BYTES]
        encryptor.update_into(_ZEROS[:len(piece)], piece)
    return words.astype(_RING[bits], copy=False)


def _add_keystream(masked: np.ndarray, key: bytes, round_id: int, bits: int, subtract: bool) -> None:
    """Add (or subtract) `keystream(key, round_id, masked.size, bits)` to `masked` in place, modulo 2**bits.

    A chunk at a time through one scratch buffer that stays in cache: no stream-sized array is allocated or
    read back from memory.
    """
    encryptor = _encryptor(key, round_id, bits)
    width = bits // 8
    words = _CHUNK_BYTES // width
    scratch = np.empty(min(words, masked.size), dtype=f"<u{width}")
    raw = scratch.data.cast("B")
    add = np.subtract if subtract else np.add
    for start in range(0, masked.size, words):
        part = masked[start:start + words]
        chunk = scratch[:len(part)]
        encryptor.update_into(_ZEROS[:len(part) * width], raw[:len(part) * width])
        add(part, chunk, out=part)


_CHUNK_BYTES = 1 << 17
_ZEROS = memoryview(bytes(_CHUNK_BYTES))
"""The plaintext a key stream encrypts, a chunk at a time: `update_into` a preallocated array is about 3x
faster than `update` of a fresh zero buffer, which allocated and copied twice the stream's bytes."""


def ring_bits_for(largest_sum: int) -> int:
    """The narrowest ring in `RING_BITS` whose signed range holds sums up to `largest_sum` in magnitude.

    E.g. class counts over all parties' rows: at most the total row count.
    """
    for bits in RING_BITS:
        if abs(int(largest_sum)) < 1 << (bits - 1):
            return bits
    raise ParameterError(f"sums up to {largest_sum} do not fit a 64-bit ring")


def _check_bits(bits: object) -> int:
    if isinstance(bits, bool) or bits not in RING_BITS:
        raise ParameterError(f"the ring must have one of {list(RING_BITS)} bits, got {bits!r}")
    return int(bits)


_RING: dict[int, np.dtype] = {16: np.dtype(np.uint16), 32: np.dtype(np.uint32), 64: np.dtype(np.uint64)}
_SIGNED: dict[int, np.dtype] = {16: np.dtype(np.int16), 32: np.dtype(np.int32), 64: np.dtype(np.int64)}


class SecureAggregator:
    """One party's side of pairwise-mask secure aggregation in one session."""

    def __init__(self, name: str, session_id: bytes) -> None:
        """Generate this party's X25519 key pair for `session_id` (bytes, the same for every party)."""
        self.name = _check_name(name, ParameterError, "party")
        if not isinstance(session_id, bytes) or not session_id:
            raise ParameterError("session_id must be non-empty bytes shared by all parties, got "
                                 f"{session_id!r}")
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
            raise ProtocolError(f"party {self.name!r}: secure aggregation needs at least 1 peer, got "
                                f"{peers!r}")
        seen: dict[bytes, str] = {self._public: self.name}
        pair_keys: dict[str, bytes] = {}
        for peer, key in peers.items():
            _check_name(peer, ProtocolError, "peer")
            if peer == self.name:
                raise ProtocolError(f"party {self.name!r}: peers must list only the other parties, got its "
                                    "own name")
            if not isinstance(key, (bytes, bytearray, memoryview)) or len(bytes(key)) != KEY_BYTES:
                found = (f"{len(bytes(key))} bytes" if isinstance(key, (bytes, bytearray, memoryview))
                         else repr(key))
                raise ProtocolError(f"party {self.name!r}: public key of peer {peer!r} must be {KEY_BYTES} "
                                    f"raw bytes (X25519), got {found}")
            key = bytes(key)
            if key in seen:
                raise ProtocolError(f"party {self.name!r}: peer {peer!r} has the same public key as "
                                    f"{seen[key]!r}; every party must send its own key (possible relay error "
                                    "or key substitution)")
            seen[key] = peer
            try:
                shared = self._private.exchange(X25519PublicKey.from_public_bytes(key))
            except ValueError as exc:
                raise ProtocolError(f"party {self.name!r}: public key of peer {peer!r} is invalid "
                                    f"(low-order point, no shared secret): {exc}") from exc
            hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=self.session_id,
                        info=_pair_info(self.name, peer))
            pair_keys[peer] = hkdf.derive(shared)
        self._pair_keys = dict(sorted(pair_keys.items()))
        self._private = None  # pair keys are all we need; drop the private key

    def mask(self, vector: np.ndarray, round_id: int, bits: int = MODULUS_BITS,
             overwrite: bool = False) -> np.ndarray:
        """Mask an integer vector for `round_id` modulo 2**bits, as unsigned `bits`-bit words.

        Any int dtype, negative values included. Every party of a round must use the same ring, wide enough
        for the sum. With `overwrite`, a vector already in the ring's dtype is masked in place (the caller's
        scratch: no copy of it is made).
        """
        bits = _check_bits(bits)
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
        limit = MAX_ELEMENTS * (MODULUS_BITS // bits)
        if vector.size > limit:
            raise ParameterError(f"vector has {vector.size} elements, more than one round can mask "
                                 f"({limit}); split it over several round ids")
        if round_id in self._used_rounds:
            raise ProtocolError(f"party {self.name!r}: round_id {round_id} was already used in this session; "
                                "a reused mask leaks the difference of two vectors, use a fresh round id")
        self._used_rounds.add(round_id)
        masked = vector.reshape(-1).astype(_RING[bits], copy=not overwrite)  # negative values wrap
        for peer, key in self._pair_keys.items():  # + the streams of peers after it, - of those before
            _add_keystream(masked, key, round_id, bits, subtract=peer < self.name)
        return masked.reshape(vector.shape)


def unmask_sum(masked: list[np.ndarray]) -> np.ndarray:
    """Sum every party's masked vector modulo their ring and read it as signed integers of its width.

    The ring is the one they were masked in (their unsigned word width), so signed sums come out right.
    """
    if not masked:
        raise ProtocolError("unmask_sum needs the masked vectors of every party, got none")
    arrays = [np.asarray(m) for m in masked]
    shape, dtype = arrays[0].shape, arrays[0].dtype
    if dtype == np.dtype(np.int64):  # uint64 words read back as int64
        dtype = np.dtype(np.uint64)
    if dtype not in _RING.values():
        raise ProtocolError(f"masked vector 0 has dtype {arrays[0].dtype}; expected unsigned 16-, 32- or "
                            "64-bit words from mask()")
    for index, array in enumerate(arrays):
        if array.dtype != dtype and not (dtype == np.uint64 and array.dtype == np.int64):
            raise ProtocolError(f"masked vector {index} has dtype {array.dtype}, vector 0 has {dtype}; every "
                                "party must mask in the same ring")
        if array.shape != shape:
            raise ProtocolError(f"masked vector {index} has shape {array.shape}, vector 0 has {shape}; "
                                "every party must mask a vector of the same shape")
    total = np.zeros(shape, dtype=dtype)
    for array in arrays:
        total += array.astype(dtype, copy=False)
    return total.view(_SIGNED[dtype.itemsize * 8])
