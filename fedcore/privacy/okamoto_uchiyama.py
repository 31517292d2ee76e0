"""Okamoto-Uchiyama encryption on raw gmpy2 integers: the label-encryption option with arithmetic modulo n.

n = p^2 q with p, q primes of a third of the modulus each. In the variant of Coron, Naccache and Paillier
("Accelerating Okamoto-Uchiyama's public-key cryptosystem", Electronics Letters 1999), also HEU's and
FATE's, p - 1 has a prime factor t of 2 x the security level (256 bits for a 3072-bit key), and with
p - 1 = t u the public key holds G = g^u and H = g'^(n u) mod n:

    Enc(m) = G^m H^r mod n      Dec(c) = L(c^t mod p^2) / L(G^t mod p^2) mod p,   L(x) = (x - 1) / p

for a fresh r of `RANDOMNESS_BITS` bits. H^r vanishes under the t-th power modulo p^2, so decryption is
one exponentiation by t (256 bits) modulo p^2, where Paillier needs two by (p - 1) modulo p^2 and q^2.
Ciphertexts are integers modulo n (3,072 bits) instead of n^2 (4,096 bits for Paillier-2048), so the
passive party's sums and packing squarings are about 1.6 times cheaper each.

Plaintexts must stay below p, which only the label holder knows; anything larger wraps around modulo p,
and a decryption of such a value would give away p. So packed plaintexts are limited to
`plaintext_bits` = bits(p) - 1 - `OVERFLOW_MARGIN_BITS`, and the label holder refuses any decrypted
value with a bit above the width it expects (`SlotLayout.unpack`): a passive party that does not know p
cannot make a value at or above p decrypt below that width except with probability 2^-64.
docs/paillier.md states the assumptions.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import gmpy2
from gmpy2 import mpz

from fedcore.errors import ParameterError, ProtocolError
from fedcore.privacy.homomorphic import (
    PRIME_TEST_ROUNDS,
    AdditivePrivateKey,
    CiphertextSpace,
    FixedBase,
    check_key_bits_to_generate,
    random_prime,
    read_key_fields,
)

DEFAULT_KEY_BITS = 3072
"""3072 bits by default: n = p^2 q with 1024-bit primes."""
SUBGROUP_BITS = {1024: 160, 2048: 224, 3072: 256}
"""Bits of t, the prime factor of p - 1 that decryption raises to: twice the security level."""
RANDOMNESS_BITS = SUBGROUP_BITS
"""Bits of each encryption's fresh exponent r (H^r), the same size as t."""
OVERFLOW_MARGIN_BITS = 64
"""Bits kept free below p: a wrapped-around value passes the label holder's range check with probability
at most 2^-64."""
KEY_FORMAT = {"scheme": "okamoto-uchiyama", "version": 1}
"""What `OUPublicKey.to_json` says it is; a key of another scheme or format version is refused."""


def prime_bits(key_bits: int) -> int:
    """Bits of p (and q's are the rest): a third of the modulus, rounded up."""
    return -(-key_bits // 3)


@dataclass(frozen=True)
class OUPublicKey(CiphertextSpace):
    """n = p^2 q with the bases G and H: enough to add ciphertexts and to scale them, not to decrypt."""

    n: mpz
    g: mpz
    h: mpz
    scheme = "okamoto-uchiyama"

    def __post_init__(self) -> None:
        """Hold n, g and h as gmpy2 integers."""
        for name in ("n", "g", "h"):
            object.__setattr__(self, name, mpz(getattr(self, name)))

    @property
    def modulus(self) -> mpz:
        """n: ciphertexts and their products live modulo n."""
        return self.n

    @property
    def plaintext_bits(self) -> int:
        """bits(p) - 1 - OVERFLOW_MARGIN_BITS: every such value lies below p with the margin to spare."""
        return prime_bits(int(self.n.bit_length())) - 1 - OVERFLOW_MARGIN_BITS

    def to_json(self) -> dict:
        """The public key as JSON-safe fields: its format (`KEY_FORMAT`) and n, G, H as hex strings."""
        return {**KEY_FORMAT, **{name: format(int(getattr(self, name)), "x") for name in ("n", "g", "h")}}

    @classmethod
    def from_json(cls, fields: dict) -> OUPublicKey:
        """Read `to_json`'s output.

        Refuses another scheme or format version, moduli of unaccepted sizes and bases outside (1, n).
        """
        n, g, h = read_key_fields(fields, KEY_FORMAT, ["n", "g", "h"], "Okamoto-Uchiyama")
        if not (1 < g < n and 1 < h < n):
            raise ProtocolError("Okamoto-Uchiyama public key refused: G and H must lie in (1, n)")
        return cls(n, g, h)


@dataclass(frozen=True)
class OUPrivateKey(AdditivePrivateKey):
    """p, q and t behind the public key, with the constant decryption divides by."""

    public: OUPublicKey
    p: mpz
    q: mpz
    t: mpz
    # derived in __post_init__: p^2, the inverse decryption multiplies by, the tables (built on first use)
    _p2: mpz = field(init=False, repr=False, compare=False)
    _gp_inv: mpz = field(init=False, repr=False, compare=False)
    _tables: tuple[FixedBase, FixedBase] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Check the key against its public half and precompute what decryption needs."""
        p, q, t = mpz(self.p), mpz(self.q), mpz(self.t)
        if p * p * q != self.public.n or (p - 1) % t:
            raise ParameterError("p^2 q must equal the public modulus and t must divide p - 1")
        object.__setattr__(self, "p", p)
        object.__setattr__(self, "q", q)
        object.__setattr__(self, "t", t)
        p2 = p * p
        gp = gmpy2.powmod(self.public.g % p2, t, p2)  # of order p: its L is the unit decryption divides by
        if gp == 1:
            raise ParameterError("G^t mod p^2 must not be 1")
        object.__setattr__(self, "_p2", p2)
        object.__setattr__(self, "_gp_inv", gmpy2.invert(_l_function(gp, p), p))
        object.__setattr__(self, "_tables", None)

    @property
    def plaintext_bound(self) -> int:
        """2^plaintext_bits: far enough below p that no packed sum wraps around."""
        return 1 << self.public.plaintext_bits

    @property
    def bound_text(self) -> str:
        """The plaintext range, as error messages state it."""
        return f"[0, 2^{self.public.plaintext_bits})"

    @property
    def randomness_bits(self) -> int:
        """Bits of each encryption's fresh exponent r."""
        return RANDOMNESS_BITS[int(self.public.n.bit_length())]

    def worker_fields(self) -> dict:
        """The public key and p, q, t, for a worker process of this one."""
        return {"public": self.public.to_json(), "p": int(self.p), "q": int(self.q), "t": int(self.t)}

    @classmethod
    def from_worker_fields(cls, fields: dict) -> OUPrivateKey:
        """Inverse of `worker_fields`."""
        return cls(OUPublicKey.from_json(fields["public"]), fields["p"], fields["q"], fields["t"])

    def _fixed_bases(self) -> tuple[FixedBase, FixedBase]:
        """Tables of G's powers (for m) and H's (for r) modulo n, built on first use."""
        tables = self._tables
        if tables is None:
            public = self.public
            tables = (FixedBase(public.g, public.n, public.plaintext_bits),
                      FixedBase(public.h, public.n, self.randomness_bits))
            object.__setattr__(self, "_tables", tables)
        return tables

    def _encrypt_here(self, plaintexts: Sequence[mpz]) -> list[mpz]:
        """G^m H^r mod n from the fixed-base tables (labels are sparse: G^m is a few multiplications)."""
        g_table, h_table = self._fixed_bases()
        n, width = self.public.n, -(-self.randomness_bits // 8)
        return [g_table.power_of(m) * h_table.power(secrets.token_bytes(width)) % n for m in plaintexts]

    def _decrypt_serial(self, ciphertexts: Sequence[mpz]) -> list[int]:
        p, p2, t, gp_inv = self.p, self._p2, self.t, self._gp_inv
        return [int(_l_function(gmpy2.powmod(c % p2, t, p2), p) * gp_inv % p) for c in ciphertexts]


def _l_function(x: mpz, prime: mpz) -> mpz:
    return (x - 1) // prime


def _prime_with_subgroup(bits: int, subgroup_bits: int) -> tuple[mpz, mpz]:
    """(p, t): t a random prime of `subgroup_bits` bits and p = t u + 1 a prime of exactly `bits` bits.

    p has its top two bits set; u is a random even number.
    """
    t = random_prime(subgroup_bits)
    low, high = -(-(mpz(3) << (bits - 2)) // t), ((mpz(1) << bits) - 2) // t
    while True:
        u = (low + mpz(secrets.randbelow(int(high - low)))) & ~mpz(1)
        p = t * u + 1
        if u >= low and gmpy2.is_prime(p, PRIME_TEST_ROUNDS):
            return p, t


def generate_keypair(bits: int = DEFAULT_KEY_BITS, *, insecure_for_tests: bool = False) -> OUPrivateKey:
    """A fresh key pair with a `bits`-bit modulus (2048 or 3072; 1024 only when `insecure_for_tests`).

    p with a `SUBGROUP_BITS` prime factor t of p - 1 (`_prime_with_subgroup`), q a random prime, n = p^2 q of
    exactly `bits` bits; G = g^u with G^t of order p modulo p^2, H = g'^(n u).
    """
    check_key_bits_to_generate(bits, insecure_for_tests, "Okamoto-Uchiyama")
    p_bits = prime_bits(bits)
    p, t = _prime_with_subgroup(p_bits, SUBGROUP_BITS[bits])
    u = (p - 1) // t
    while True:
        q = random_prime(bits - 2 * p_bits)
        n = p * p * q
        if q != p and n.bit_length() == bits:
            break
    p2 = p * p
    while True:
        g = mpz(secrets.randbelow(int(n) - 2) + 2)
        if gmpy2.gcd(g, p) == 1 and gmpy2.powmod(g % p2, p - 1, p2) != 1:
            break
    while True:
        g_prime = mpz(secrets.randbelow(int(n) - 2) + 2)
        if gmpy2.gcd(g_prime, n) == 1:
            break
    public = OUPublicKey(n, gmpy2.powmod(g, u, n), gmpy2.powmod(g_prime, n * u, n))
    return OUPrivateKey(public, p, q, t)
