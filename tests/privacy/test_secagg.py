"""Pairwise-mask secure aggregation: exact sums, uniform-looking masked vectors, and refusals."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedcore.errors import ParameterError, ProtocolError
from fedcore.privacy import secagg
from fedcore.privacy.secagg import MODULUS_BITS, SecureAggregator, unmask_sum

SESSION = b"session-0001"


def _federation(n: int, session: bytes = SESSION) -> list[SecureAggregator]:
    parties = [SecureAggregator(f"party-{i}", session) for i in range(n)]
    keys = {p.name: p.public_key() for p in parties}
    for p in parties:
        p.agree({name: key for name, key in keys.items() if name != p.name})
    return parties


def _fixed_keys(monkeypatch: pytest.MonkeyPatch, seeds: list[int]) -> None:
    """Make SecureAggregator generate the given private keys, in order."""
    keys = iter([X25519PrivateKey.from_private_bytes(bytes([s]) * 32) for s in seeds])

    class FixedKeys:
        @staticmethod
        def generate() -> X25519PrivateKey:
            return next(keys)

    monkeypatch.setattr(secagg, "X25519PrivateKey", FixedKeys)


@pytest.mark.parametrize("n_parties", [2, 3, 5])
def test_masked_vectors_sum_to_the_plain_sum(n_parties: int) -> None:
    rng = np.random.default_rng(n_parties)
    parties = _federation(n_parties)
    big = 2**63 - 1000
    vectors = [rng.integers(-(2**40), 2**40, size=1000, dtype=np.int64) for _ in parties]
    vectors[0][:3] = [big, -big, -5]  # near the int64 edges; the other parties keep the total in range
    for v in vectors[1:]:
        v[:3] = [-1, 1, -7]
    if n_parties > 2:  # any integer dtype may be masked
        vectors[-1] = vectors[-1].astype(np.int32)
        vectors[-2] = rng.integers(0, 200, size=1000, dtype=np.uint8)
    masked = [p.mask(v, round_id=7) for p, v in zip(parties, vectors, strict=True)]
    assert all(m.dtype == np.uint64 and m.shape == (1000,) for m in masked)
    total = unmask_sum(masked)
    assert total.dtype == np.int64
    assert total.tolist() == [sum(int(v[i]) for v in vectors) for i in range(1000)]
    assert total[0] > 2**62 and total[1] < -(2**62)


def test_masking_keeps_the_vector_shape() -> None:
    parties = _federation(3)
    vectors = [np.arange(12, dtype=np.int16).reshape(3, 4) * (i + 1) for i in range(3)]
    masked = [p.mask(v, 0) for p, v in zip(parties, vectors, strict=True)]
    assert masked[0].shape == (3, 4)
    np.testing.assert_array_equal(unmask_sum(masked), np.arange(12).reshape(3, 4) * 6)


def test_each_masked_vector_and_each_partial_sum_look_uniform() -> None:
    parties = _federation(3)
    n = 100_000
    vectors = [np.random.default_rng(i).integers(0, 10, size=n) for i in range(3)]
    masked = [p.mask(v, 1) for p, v in zip(parties, vectors, strict=True)]
    partial = (masked[0] + masked[1]).astype(np.uint64)  # what the master has without party-2
    for m, v in [(masked[0], vectors[0]), (masked[2], vectors[2]), (partial, vectors[0] + vectors[1])]:
        assert (m != v.astype(np.uint64)).mean() > 0.999
        top = np.bincount((m >> np.uint64(56)).astype(np.int64), minlength=256)
        chi2 = float(((top - n / 256) ** 2 / (n / 256)).sum())
        assert chi2 < 400  # 255 degrees of freedom: mean 255, sd 22.6
        assert (m >> np.uint64(MODULUS_BITS - 1)).mean() == pytest.approx(0.5, abs=0.01)


def test_a_round_id_masks_only_once() -> None:
    parties = _federation(2)
    parties[0].mask(np.zeros(4, dtype=np.int64), 3)
    with pytest.raises(ProtocolError) as excinfo:
        parties[0].mask(np.ones(4, dtype=np.int64), 3)
    assert str(excinfo.value) == ("party 'party-0': round_id 3 was already used in this session; a reused "
                                  "mask leaks the difference of two vectors, use a fresh round id")
    parties[1].mask(np.zeros(4, dtype=np.int64), 3)  # the other party's round 3 is its own
    parties[0].mask(np.zeros(4, dtype=np.int64), 4)


def test_masks_differ_across_rounds_without_overlapping_streams() -> None:
    party = _federation(2)[0]
    zeros = np.zeros(64, dtype=np.int64)
    first, second = party.mask(zeros, 1), party.mask(zeros, 2)
    assert (first != second).all()
    # consecutive rounds must not reuse a shifted key stream (an AES block is 2 words)
    for shift in (2, 8, 16):
        assert (first[shift:] != second[:-shift]).all() and (second[shift:] != first[:-shift]).all()


def test_masks_differ_across_sessions_with_the_same_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    zeros = np.zeros(16, dtype=np.int64)
    _fixed_keys(monkeypatch, [1, 2, 1, 2, 1, 2])
    a = _federation(2, b"session-a")[0].mask(zeros, 0)
    again = _federation(2, b"session-a")[0].mask(zeros, 0)
    b = _federation(2, b"session-b")[0].mask(zeros, 0)
    np.testing.assert_array_equal(a, again)
    assert (a != b).all()


def _aes_ctr(key: bytes, round_id: int, ring: int, n_bytes: int) -> bytes:
    """The documented stream: AES-256-CTR from round id (8 bytes LE), ring byte, 7 zero bytes, of zeros."""
    counter = round_id.to_bytes(8, "little") + bytes([ring]) + bytes(7)
    return Cipher(algorithms.AES(key), modes.CTR(counter)).encryptor().update(bytes(n_bytes))


def _alice_and_bob(monkeypatch: pytest.MonkeyPatch) -> tuple[SecureAggregator, SecureAggregator, bytes]:
    """Two agreed parties of fixed keys, and their pair key derived as the module doc says."""
    _fixed_keys(monkeypatch, [3, 4])
    alice, bob = SecureAggregator("alice", SESSION), SecureAggregator("bob", SESSION)
    alice.agree({"bob": bob.public_key()})
    bob.agree({"alice": alice.public_key()})
    shared = X25519PrivateKey.from_private_bytes(bytes([3]) * 32).exchange(
        X25519PublicKey.from_public_bytes(bob.public_key()))
    pair_key = HKDF(algorithm=hashes.SHA256(), length=32, salt=SESSION,
                    info=b"fedforest secagg v1|alice|bob").derive(shared)
    return alice, bob, pair_key


def test_the_mask_follows_the_documented_derivation(monkeypatch: pytest.MonkeyPatch) -> None:
    alice, bob, pair_key = _alice_and_bob(monkeypatch)
    stream = np.frombuffer(_aes_ctr(pair_key, 5, 0, 24), dtype="<u8")
    vector = np.array([1, -2, 3], dtype=np.int64)
    np.testing.assert_array_equal(alice.mask(vector, 5), vector.astype(np.uint64) + stream)  # "bob" > "alice"
    np.testing.assert_array_equal(bob.mask(vector, 5), vector.astype(np.uint64) - stream)


@pytest.mark.parametrize("bits", [16, 64])
def test_a_long_mask_adds_the_key_stream_across_its_chunks(monkeypatch: pytest.MonkeyPatch,
                                                            bits: int) -> None:
    """Masks are added a chunk of the stream at a time: every word, across chunks, is the stream's."""
    alice, bob, pair_key = _alice_and_bob(monkeypatch)
    n = (3 * secagg._CHUNK_BYTES) // (bits // 8) + 5  # three whole chunks and a partial one
    ring = np.dtype(f"uint{bits}")
    stream = np.frombuffer(_aes_ctr(pair_key, 7, 0 if bits == 64 else bits, n * bits // 8),
                           dtype=f"<u{bits // 8}")
    vector = np.arange(n, dtype=np.int64) - 1000
    np.testing.assert_array_equal(alice.mask(vector, 7, bits), vector.astype(ring) + stream)
    np.testing.assert_array_equal(bob.mask(vector, 7, bits), vector.astype(ring) - stream)


@pytest.mark.parametrize("bits", [16, 64])
def test_a_long_key_stream_is_the_cipher_of_zeros_across_its_chunks(bits: int) -> None:
    key = bytes(range(32))
    n = (3 * secagg._CHUNK_BYTES) // (bits // 8) + 5  # three whole chunks and a partial one
    assert secagg.keystream(key, 9, n, bits).tobytes() == _aes_ctr(key, 9, 0 if bits == 64 else bits,
                                                                   n * bits // 8)


def test_overwrite_masks_the_callers_scratch_in_place_and_the_default_leaves_it() -> None:
    alice, bob = _federation(2)
    vector = np.arange(6, dtype=np.uint64)
    masked = alice.mask(vector, 1)
    assert vector.tolist() == list(range(6)) and masked is not vector
    scratch = np.arange(6, dtype=np.uint64)
    in_place = alice.mask(scratch, 2, overwrite=True)
    assert np.shares_memory(in_place, scratch)
    assert unmask_sum([in_place, bob.mask(np.zeros(6, dtype=np.int64), 2)]).tolist() == list(range(6))

def _agree_error(peers: object) -> str:
    with pytest.raises(ProtocolError) as excinfo:
        SecureAggregator("alice", SESSION).agree(peers)  # type: ignore[arg-type]
    return str(excinfo.value)


def test_bad_peer_keys_are_refused() -> None:
    good = SecureAggregator("bob", SESSION).public_key()
    other = SecureAggregator("carol", SESSION).public_key()
    assert _agree_error({}) == "party 'alice': secure aggregation needs at least 1 peer, got {}"
    assert _agree_error({"alice": good}) == ("party 'alice': peers must list only the other parties, "
                                             "got its own name")
    assert _agree_error({"bob": good[:31]}) == ("party 'alice': public key of peer 'bob' must be 32 raw "
                                                "bytes (X25519), got 31 bytes")
    assert _agree_error({"bob": "not bytes"}) == ("party 'alice': public key of peer 'bob' must be 32 raw "
                                                  "bytes (X25519), got 'not bytes'")
    assert _agree_error({"bob": good, "carol": good}) == (
        "party 'alice': peer 'carol' has the same public key as 'bob'; every party must send its own key "
        "(possible relay error or key substitution)")
    assert (_agree_error({"bob": other, "": good})
            == "peer name must be a non-empty string without '|', got ''")
    assert _agree_error({"bob": bytes(32)}).startswith(
        "party 'alice': public key of peer 'bob' is invalid (low-order point, no shared secret)")
    alice = SecureAggregator("alice", SESSION)
    with pytest.raises(ProtocolError, match="peer 'bob' has the same public key as 'alice'"):
        alice.agree({"bob": alice.public_key()})


def test_protocol_order_and_parameters_are_enforced() -> None:
    alice = SecureAggregator("alice", SESSION)
    with pytest.raises(ProtocolError,
                       match=r"call agree\(\) with every other party's public key before mask\(\)"):
        alice.mask(np.zeros(2, dtype=np.int64), 0)
    alice.agree({"bob": SecureAggregator("bob", SESSION).public_key()})
    with pytest.raises(ProtocolError, match=r"agree\(\) was already called in this session"):
        alice.agree({"carol": SecureAggregator("carol", SESSION).public_key()})
    with pytest.raises(ParameterError, match="masks integer vectors, got dtype float64"):
        alice.mask(np.zeros(2), 0)
    with pytest.raises(ParameterError, match="masks integer vectors, got dtype bool"):
        alice.mask(np.zeros(2, dtype=bool), 0)
    with pytest.raises(ParameterError, match=r"round_id must be an integer in \[0, 2\*\*64\), got -1"):
        alice.mask(np.zeros(2, dtype=np.int64), -1)
    with pytest.raises(ParameterError, match="party name must be a non-empty string without '|', got 'a|b'"):
        SecureAggregator("a|b", SESSION)
    with pytest.raises(ParameterError, match="session_id must be non-empty bytes"):
        SecureAggregator("alice", "s1")  # type: ignore[arg-type]


def test_unmask_sum_refuses_mismatched_inputs() -> None:
    with pytest.raises(ProtocolError, match="got none"):
        unmask_sum([])
    with pytest.raises(ProtocolError, match=r"masked vector 1 has shape \(3,\), vector 0 has \(2,\)"):
        unmask_sum([np.zeros(2, dtype=np.uint64), np.zeros(3, dtype=np.uint64)])
    with pytest.raises(ProtocolError, match="masked vector 0 has dtype float64"):
        unmask_sum([np.zeros(2)])
    wrapped = unmask_sum([np.array([2**64 - 1], dtype=np.uint64), np.array([2**64 - 2], dtype=np.uint64)])
    assert wrapped.tolist() == [-3]


def test_the_ring_is_the_narrowest_that_holds_the_sum() -> None:
    from fedcore.privacy.secagg import ring_bits_for

    sums = (0, 32767, 32768, 2**31 - 1, 2**31, 2**63 - 1)
    assert [ring_bits_for(n) for n in sums] == [16, 16, 32, 32, 64, 64]
    with pytest.raises(ParameterError, match="do not fit a 64-bit ring"):
        ring_bits_for(2**63)


@pytest.mark.parametrize("bits", [16, 32])
def test_narrow_rings_sum_exactly_and_look_uniform(bits: int) -> None:
    parties = _federation(3)
    rng = np.random.default_rng(bits)
    bound = 1 << (bits - 3)
    vectors = [rng.integers(-bound, bound, size=50_000) for _ in parties]
    masked = [p.mask(v, round_id=3, bits=bits) for p, v in zip(parties, vectors, strict=True)]
    assert all(m.dtype == np.dtype(f"uint{bits}") for m in masked)
    total = unmask_sum(masked)
    assert total.dtype == np.dtype(f"int{bits}")
    np.testing.assert_array_equal(total, sum(vectors))
    for m in (masked[0], masked[0] + masked[1]):  # one vector, and a partial sum, are uniform in the ring
        assert (m >> m.dtype.type(bits - 1)).mean() == pytest.approx(0.5, abs=0.01)


def test_rings_must_agree_and_be_known() -> None:
    parties = _federation(2)
    a = parties[0].mask(np.arange(5), round_id=1, bits=16)
    b = parties[1].mask(np.arange(5), round_id=1, bits=32)
    with pytest.raises(ProtocolError,
                       match="masked vector 1 has dtype uint32, vector 0 has uint16; every party "
                             "must mask in the same ring"):
        unmask_sum([a, b])
    for bad in (8, 24, True, "16"):
        with pytest.raises(ParameterError, match=r"the ring must have one of \[16, 32, 64\] bits"):
            parties[0].mask(np.arange(5), round_id=2, bits=bad)


def test_rings_of_different_widths_use_unrelated_key_streams() -> None:
    """A master telling parties different rings in one round cannot line masks of two widths up.

    A 64-bit mask must not line up with four 16-bit ones (the same key stream read at another width would
    cancel them).
    """
    key = bytes(range(32))
    wide = secagg.keystream(key, 5, 4, 64)
    for bits in (16, 32):
        narrow = secagg.keystream(key, 5, 4 * 64 // bits, bits)
        assert narrow.tobytes() != wide.tobytes()
    # the 64-bit ring's stream: the counter block of round id, ring byte 0, 7 zero bytes
    assert wide.tobytes() == _aes_ctr(key, 5, 0, 32)
    # the attack: a masks in 16 bits, b and c in 64; b + c split into 16-bit words, plus a, is not a's vector
    parties = _federation(3)
    a = parties[0].mask(np.arange(8, dtype=np.int64), round_id=9, bits=16)
    bc = (parties[1].mask(np.zeros(2, np.int64), round_id=9) + parties[2].mask(np.zeros(2, np.int64),
                                                                               round_id=9))
    recovered = (bc.view(np.uint16) + a).view(np.int16)
    assert not np.array_equal(recovered, np.arange(8))
