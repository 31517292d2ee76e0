"""Paillier primitives, slot packing and sealed channels: round trips, homomorphic sums and refusals."""

from __future__ import annotations

import gmpy2
import numpy as np
import pytest

from fedcore.errors import ParameterError, ProtocolError
from fedcore.privacy.gmp_workers import encrypt_over_workers
from fedcore.privacy.packing import SlotLayout, encrypted_bin_sums, pack_bin_sums, weight_powers
from fedcore.privacy.paillier import PaillierPublicKey, generate_keypair
from fedcore.privacy.sealed import SealingKey, arrays_to_bytes, bytes_to_arrays


@pytest.fixture(scope="module")
def key():
    return generate_keypair(1024, insecure_for_tests=True)


def test_encrypt_decrypt_round_trip_and_fresh_randomness(key):
    values = [0, 1, 2**100 + 7, int(key.public.n) - 1]
    ciphertexts = key.encrypt(values)
    assert key.decrypt(ciphertexts) == values
    again = key.encrypt(values)
    assert all(a != b for a, b in zip(ciphertexts, again, strict=True))  # probabilistic encryption


def test_homomorphic_add_add_plain_and_scale(key):
    pub = key.public
    a, b = key.encrypt([1234, 5678])
    assert key.decrypt([pub.add(a, b)]) == [1234 + 5678]
    assert key.decrypt([pub.add_plain(a, 66)]) == [1300]
    assert key.decrypt([pub.scale(b, 3)]) == [3 * 5678]


def test_ciphertexts_open_with_textbook_paillier(key):
    """Ours against the definition, both ways.

    The definition: lambda = lcm(p-1, q-1), mu = L(g^lambda mod n^2)^-1 mod n, g = n + 1. A textbook
    ciphertext with a random r decrypts with ours, and ours decrypts with it.
    """
    import secrets
    from math import lcm

    n, n2 = int(key.public.n), int(key.public.n_square)
    lam = lcm(int(key.p) - 1, int(key.q) - 1)
    mu = pow((pow(n + 1, lam, n2) - 1) // n, -1, n)
    r = secrets.randbelow(n - 1) + 1
    textbook = pow(n + 1, 987654321, n2) * pow(r, n, n2) % n2
    assert key.decrypt([gmpy2.mpz(textbook)]) == [987654321]
    ours = int(key.encrypt([42])[0])
    assert (pow(ours, lam, n2) - 1) // n * mu % n == 42


def test_generated_keys_are_well_formed():
    private = generate_keypair(1024, insecure_for_tests=True)
    p, q, n = int(private.p), int(private.q), int(private.public.n)
    assert p != q and p * q == n and n.bit_length() == 1024
    assert p.bit_length() == q.bit_length() == 512 and p % 4 == q % 4 == 3
    assert gmpy2.is_prime(p, 64) and gmpy2.is_prime(q, 64) and gmpy2.gcd(n, (p - 1) * (q - 1)) == 1
    assert generate_keypair(1024, insecure_for_tests=True).public.n != private.public.n


def test_fixed_base_powers_equal_modular_exponentiation(key):
    from fedcore.privacy.homomorphic import FixedBase

    modulus = key.p * key.p
    base = gmpy2.mpz(123456789) ** 7 % modulus
    table = FixedBase(base, modulus, 80)
    for exponent in (b"\0" * 10, b"\1" + b"\0" * 9, bytes(range(246, 256)), b"\xff" * 10):
        assert table.power(exponent) == gmpy2.powmod(base, int.from_bytes(exponent, "little"), modulus)


def test_encryptions_of_zero_are_fresh_nth_residues_of_jacobi_symbol_one(key):
    """Enc(0) = h_s^a with h_s = (-x^2)^n.

    An n-th residue (its phi(n)-th power is 1 mod n^2), a fresh one each time, with Jacobi symbol +1 mod n
    whatever the message (-1 is a non-residue mod p = q = 3 mod 4): the randomness DJN's variant draws from,
    as docs/paillier.md states.
    """
    n, n2 = key.public.n, key.public.n_square
    phi = (key.p - 1) * (key.q - 1)
    zeros = key.encrypt([0] * 4)
    assert len(set(zeros)) == 4 and all(gmpy2.powmod(z, phi, n2) == 1 for z in zeros)
    assert {gmpy2.jacobi(c % n, n) for c in key.encrypt([0, 1, 5, 2**200])} == {1}
    assert key.randomness_bits == 512


def test_key_sizes_are_checked():
    with pytest.raises(ParameterError,
                       match=r"key_bits must be one of \(2048, 3072\) for Paillier, got 1024"):
        generate_keypair(1024)
    with pytest.raises(ParameterError, match="got 512"):
        generate_keypair(512, insecure_for_tests=True)


def test_plaintext_out_of_range_is_refused(key):
    with pytest.raises(ParameterError, match=r"plaintext must lie in \[0, n\)"):
        key.encrypt([-1])


def test_wire_format_round_trip_and_refusals(key):
    pub = key.public
    ciphertexts = key.encrypt([3, 4, 5])
    rows = pub.to_bytes(ciphertexts)
    assert rows.shape == (3, pub.ciphertext_bytes) and rows.dtype == np.uint8
    assert pub.from_bytes(rows) == ciphertexts
    with pytest.raises(ProtocolError, match=r"must be a \(count, 256\) uint8 array"):
        pub.from_bytes(rows[:, 1:])
    zero = np.zeros_like(rows[:1])
    with pytest.raises(ProtocolError, match="outside the ciphertext space"):
        pub.from_bytes(zero)
    assert pub.to_json()["scheme"] == "paillier" and pub.to_json()["version"] == 1
    assert PaillierPublicKey.from_json(pub.to_json()).n == pub.n
    with pytest.raises(ProtocolError, match="modulus of 9 bits refused"):
        PaillierPublicKey.from_json({**pub.to_json(), "n": "1ff"})
    with pytest.raises(ProtocolError,
                       match=r"public key format \{'scheme': 'paillier', 'version': 2\} refused"):
        PaillierPublicKey.from_json({**pub.to_json(), "version": 2})
    with pytest.raises(ProtocolError, match="malformed Paillier public key: KeyError\\('scheme'\\)"):
        PaillierPublicKey.from_json({"n": format(int(pub.n), "x")})


def test_bin_sums_and_packing_decode_to_exact_class_counts(key):
    rng = np.random.default_rng(3)
    n, n_classes = 60, 3
    labels = rng.integers(0, n_classes, n)
    above = np.zeros((n, n_classes - 1), dtype=object)  # the one-hot of classes 1..C-1
    above[np.flatnonzero(labels > 0), labels[labels > 0] - 1] = 1
    weights = rng.integers(1, 5, n)  # weight 4 takes the powmod path, 1-3 the precomputed powers
    node_weight = int(weights.sum())
    layout = SlotLayout.for_values(above, node_weight, key.public)
    powers = weight_powers(key.public, key.encrypt(layout.encode(above)))
    bins = rng.integers(0, 40, n).astype(np.uint8)
    codes, sums, totals = encrypted_bin_sums(key.public, powers, np.arange(n), weights, bins)
    assert list(codes) == sorted(set(bins.tolist()))
    small = SlotLayout(layout.n_slots, layout.slot_bits, layout.top_max, 5 * layout.bin_bits(node_weight))
    packed = pack_bin_sums(key.public, sums, [node_weight] * len(codes), small)
    assert len(packed) == -(-len(codes) // 5)  # five bins per ciphertext
    decoded = small.unpack(key.decrypt(packed), [node_weight] * len(codes), totals)
    for j, code in enumerate(codes):
        in_bin = bins == code
        expected = [int(weights[in_bin & (labels == c)].sum()) for c in range(1, n_classes)]
        assert [int(v) for v in decoded[j]] == [*expected, int(weights[in_bin].sum())]


def test_bins_of_small_nodes_are_narrow(key):
    layout = SlotLayout.for_values(np.ones((10, 1), dtype=object), 10_000, key.public)  # binary labels
    assert (layout.bin_bits(10_000), layout.bin_bits(300), layout.bin_bits(1)) == (14, 9, 1)
    assert layout.groups([14] * 80) == [(0, 73), (73, 80)]  # 1023 usable bits hold 73 bins of 14


def test_unpack_refuses_wrong_counts_and_overflow(key):
    layout = SlotLayout(1, 4, 1, 64)
    with pytest.raises(ProtocolError, match="2 packed ciphertexts cannot carry 3 bins"):
        layout.unpack([0, 0], [3, 3, 3], [1, 1, 1])
    with pytest.raises(ProtocolError, match="2 bin weights for 3 bins"):
        layout.unpack([0], [3, 3, 3], [1, 1])
    with pytest.raises(ProtocolError, match="overflows its slots"):
        layout.unpack([1 << 70], [3], [3])
    with pytest.raises(ProtocolError, match="do not fit"):
        SlotLayout.for_values(np.ones((2, 40), dtype=object), 2**30, key.public)


def test_sealed_channel_round_trip_and_tamper_detection():
    context = b"s" * 16
    alice, bob = SealingKey("alice", context), SealingKey("bob", context)
    to_bob = alice.channel("bob", bob.public_bytes())
    from_alice = bob.channel("alice", alice.public_bytes())
    blob = to_bob.seal(b"split 7", sequence=3, slot=2)
    assert from_alice.open(blob, sequence=3, slot=2) == b"split 7"
    for sequence, slot in ((4, 2), (3, 1)):
        with pytest.raises(ProtocolError, match="from 'alice' failed authentication"):
            from_alice.open(blob, sequence=sequence, slot=slot)
    tampered = bytearray(blob)
    tampered[0] ^= 1
    with pytest.raises(ProtocolError, match="failed authentication"):
        from_alice.open(bytes(tampered), sequence=3, slot=2)
    with pytest.raises(ProtocolError, match="failed authentication"):  # a reflected message does not open
        to_bob.open(blob, sequence=3, slot=2)
    eve = SealingKey("eve", context)
    with pytest.raises(ProtocolError, match="failed authentication"):
        eve.channel("alice", alice.public_bytes()).open(blob, sequence=3, slot=2)


def test_sealed_arrays_refuse_pickles():
    arrays = {"a": np.arange(3), "b": np.array([True, False])}
    back = bytes_to_arrays(arrays_to_bytes(arrays))
    assert set(back) == {"a", "b"} and np.array_equal(back["a"], arrays["a"])
    import io

    buffer = io.BytesIO()
    np.savez(buffer, x=np.array([{"pickled": 1}], dtype=object))
    with pytest.raises(ProtocolError, match="malformed sealed arrays"):
        bytes_to_arrays(buffer.getvalue())


def test_parallel_encryption_and_decryption_agree_with_serial(key):
    from fedcore.privacy.homomorphic import PARALLEL_MIN_ITEMS

    values = list(range(2 * PARALLEL_MIN_ITEMS + 1))
    ciphertexts = encrypt_over_workers(key, values, workers=2)
    assert len(set(ciphertexts)) == len(values)
    assert key.decrypt(ciphertexts, workers=3) == key.decrypt(ciphertexts, workers=1) == values


def _layout(**changes) -> dict:
    """A passive party's sealed layout of one level.

    Two nodes (weights 5 and 4), one feature each, bins (weight) 0 (2), 3 (3) and 1 (4).
    """
    arrays = {"hist_ptr": np.array([0, 2, 3]), "bins": np.array([0, 3, 1], np.uint8),
              "feat_ptr": np.array([0, 1, 2]), "feat_local": np.array([0, 1]), "feat_rank": np.array([0, 0]),
              "categorical": np.zeros(2, bool), "derive_from": np.array([-1, -1]),
              "sibling": np.array([-1, -1]), "node_weight": np.array([5, 4]),
              "bin_weight": np.array([2, 3, 4])}
    return {**arrays, **changes}


def test_the_label_holder_checks_the_sealed_bin_weights():
    """The bin weights travel in the sealed layout (not in the ciphertexts).

    The label holder refuses weights that are missing, misaligned, not positive or that do not add up to their
    node's weight.
    """
    from fedcore.vertical.encrypted import _HistogramPlan

    assert list(_HistogramPlan.from_arrays(_layout(), 2).bin_weight) == [2, 3, 4]
    narrow = _layout(bin_weight=np.array([2, 3, 4], np.uint8))
    assert list(_HistogramPlan.from_arrays(narrow, 2).bin_weight) == [2, 3, 4]
    empty_pair = _layout(hist_ptr=np.array([0, 2, 2]), bins=np.array([0, 3], np.uint8),
                         bin_weight=np.array([2, 3]))
    assert list(_HistogramPlan.from_arrays(empty_pair, 2).bin_weight) == [2, 3]  # a node too small to split
    for changes, message in (({"bin_weight": np.array([2, 3])}, "pointers do not match"),
                             ({"bin_weight": np.array([2, 2, 4])}, "do not add up to their node's weight"),
                             ({"bin_weight": np.array([5, 0, 4])}, "do not add up to their node's weight"),
                             ({"bin_weight": np.array([2.0, 3.0, 4.0])},
                              "bin weights must be integers, got float64")):
        with pytest.raises(ProtocolError, match=f"malformed histogram layout: .*{message}"):
            _HistogramPlan.from_arrays(_layout(**changes), 2)
    arrays = _layout()
    del arrays["bin_weight"]
    with pytest.raises(ProtocolError, match="malformed histogram layout: 'bin_weight'"):
        _HistogramPlan.from_arrays(arrays, 2)
