"""Okamoto-Uchiyama primitives.

Round trips, homomorphic sums, agreement with the textbook scheme, key shape and format, and the range check
that keeps a wrapped-around plaintext from being used.
"""

from __future__ import annotations

import secrets

import gmpy2
import pytest

from fedcore.errors import ParameterError, ProtocolError
from fedcore.privacy.gmp_workers import encrypt_over_workers
from fedcore.privacy.okamoto_uchiyama import (
    OVERFLOW_MARGIN_BITS,
    SUBGROUP_BITS,
    OUPublicKey,
    generate_keypair,
)
from fedcore.privacy.packing import SlotLayout, pack_bin_sums
from fedcore.privacy.schemes import public_key_from_json


@pytest.fixture(scope="module")
def key():
    return generate_keypair(1024, insecure_for_tests=True)


def test_encrypt_decrypt_round_trip_and_fresh_randomness(key) -> None:
    values = [0, 1, 2**100 + 7, (1 << key.public.plaintext_bits) - 1]
    ciphertexts = key.encrypt(values)
    assert key.decrypt(ciphertexts) == values
    assert all(a != b for a, b in zip(ciphertexts, key.encrypt(values), strict=True))
    assert all(0 < c < key.public.n for c in ciphertexts)


def test_homomorphic_add_and_scale(key) -> None:
    pub = key.public
    a, b = key.encrypt([1234, 5678])
    assert key.decrypt([pub.add(a, b), pub.scale(b, 3)]) == [1234 + 5678, 3 * 5678]


def test_ciphertexts_agree_with_the_textbook_scheme(key) -> None:
    """Decryption by t equals the textbook's by p - 1, and textbook ciphertexts decrypt with ours.

    The textbook's: Dec(c) = L(c^(p-1) mod p^2) / L(G^(p-1) mod p^2) mod p; its ciphertexts use r uniform
    below n.
    """
    n, g, h, p = int(key.public.n), int(key.public.g), int(key.public.h), int(key.p)
    p2 = p * p

    def textbook_decrypt(c: int) -> int:
        return (pow(c, p - 1, p2) - 1) // p * pow((pow(g, p - 1, p2) - 1) // p, -1, p) % p

    ours = key.encrypt([42, 2**200 + 1])
    assert [textbook_decrypt(int(c)) for c in ours] == [42, 2**200 + 1]
    textbook = pow(g, 987654321, n) * pow(h, secrets.randbelow(n), n) % n
    assert key.decrypt([gmpy2.mpz(textbook)]) == [987654321]


def test_generated_keys_are_well_formed() -> None:
    private = generate_keypair(1024, insecure_for_tests=True)
    p, q, t, n = int(private.p), int(private.q), int(private.t), int(private.public.n)
    assert p * p * q == n and n.bit_length() == 1024 and p != q
    assert p.bit_length() == 342 and q.bit_length() == 340 and t.bit_length() == SUBGROUP_BITS[1024]
    assert all(gmpy2.is_prime(x, 64) for x in (p, q, t)) and (p - 1) % t == 0
    assert private.public.plaintext_bits == 342 - 1 - OVERFLOW_MARGIN_BITS
    assert generate_keypair(1024, insecure_for_tests=True).public.n != private.public.n
    with pytest.raises(ParameterError, match=r"key_bits must be one of \(2048, 3072\) for Okamoto-Uchiyama, "
                                             r"got 1024"):
        generate_keypair(1024)


def test_plaintexts_outside_the_bound_are_refused(key) -> None:
    bits = key.public.plaintext_bits
    with pytest.raises(ParameterError, match=rf"a plaintext must lie in \[0, 2\^{bits}\) under this "
                                             r"okamoto-uchiyama key"):
        key.encrypt([1 << bits])
    with pytest.raises(ParameterError, match="a plaintext must lie in"):
        encrypt_over_workers(key, [-1], workers=2)


def test_the_public_key_format_is_checked(key) -> None:
    fields = key.public.to_json()
    assert (fields["scheme"], fields["version"]) == ("okamoto-uchiyama", 1) and set(fields) >= {"n", "g", "h"}
    assert OUPublicKey.from_json(fields) == key.public
    with pytest.raises(ProtocolError,
                       match=r"public key format \{'scheme': 'okamoto-uchiyama', 'version': 2\} "
                             r"refused"):
        OUPublicKey.from_json({**fields, "version": 2})
    with pytest.raises(ProtocolError, match=r"G and H must lie in \(1, n\)"):
        OUPublicKey.from_json({**fields, "h": "1"})
    with pytest.raises(ProtocolError, match=r"Okamoto-Uchiyama modulus of 9 bits refused"):
        OUPublicKey.from_json({**fields, "n": "1ff"})
    with pytest.raises(ProtocolError,
                       match=r"the session's privacy mode 'paillier' needs a paillier public key, "
                             r"got 'okamoto-uchiyama'"):
        public_key_from_json(fields, "paillier")


def test_a_plaintext_wrapped_around_p_is_refused_by_the_range_check(key) -> None:
    """A value at or above p never decrypts inside the layout's width.

    A passive party that does not know p cannot make one: it wraps to a value modulo p that sets bits above
    the width, and the label holder refuses it.
    """
    layout = SlotLayout(n_slots=1, slot_bits=8, top_max=1, plaintext_bits=key.public.plaintext_bits)
    honest = key.encrypt([3, 5])
    packed = pack_bin_sums(key.public, honest, [200, 200], layout)
    assert layout.unpack(key.decrypt(packed), [200, 200], [4, 6]).tolist() == [[3, 4], [5, 6]]
    huge = 1 << (key.public.n.bit_length() - 2)  # far above p (and above the bound, so scale it in)
    wrapped = key.public.scale(key.encrypt([1])[0], huge + 5)
    assert key.decrypt([wrapped])[0] == (huge + 5) % int(key.p)
    with pytest.raises(ProtocolError, match="a packed histogram overflows its slots"):
        layout.unpack(key.decrypt(pack_bin_sums(key.public, [wrapped, honest[1]], [200, 200], layout)),
                      [200, 200], [4, 6])
