"""Paillier encryption on raw gmpy2 integers, for labels in the vertical setting (SecureBoost pattern).

Keys are generated here with gmpy2 (`generate_keypair`: two random primes p = q = 3 mod 4 of half the
modulus size). Encryption and decryption work on raw `mpz` integers with the Chinese remainder theorem
over the private primes, which only the label holder has: passive parties get the public modulus alone
and can add ciphertexts, never open them. With g = n + 1:

    Enc(m) = (1 + m n) h_s^a mod n^2      Enc(a) Enc(b) = Enc(a + b)        Enc(m)^k = Enc(k m)

The randomness is Damgard-Jurik-Nielsen's: h_s = (-x^2)^n mod n^2 for a secret random x, raised to a
fresh exponent a of `RANDOMNESS_BITS[key bits]` bits (half the modulus, as in HEU's ZPaillier) instead
of r^n for r uniform in Z*_n. The base is fixed, so h_s^a is computed from precomputed tables of its
powers modulo p^2 and q^2 (`FixedBase`): about 2 x a / 8 multiplications and no squarings, an order of
magnitude faster than a full exponentiation. docs/paillier.md states the assumption this relies on.

Ciphertexts cross the wire as fixed-width big-endian byte rows (`fedcore.privacy.homomorphic`); the
public key as `{"scheme": "paillier", "version": 1, "n": hex}` (`to_json`).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import gmpy2
from gmpy2 import mpz

from fedcore.errors import ParameterError
from fedcore.privacy.homomorphic import (
    AdditivePrivateKey,
    CiphertextSpace,
    FixedBase,
    check_key_bits_to_generate,
    random_prime,
    read_key_fields,
)

DEFAULT_KEY_BITS = 2048
"""2048 bits by default: about 112-bit security (3072 gives 128)."""
KEY_FORMAT = {"scheme": "paillier", "version": 1}
"""What `PaillierPublicKey.to_json` says it is; a key of another scheme or format version is refused."""


@dataclass(frozen=True)
class PaillierPublicKey(CiphertextSpace):
    """The modulus n: enough to add ciphertexts and to scale them (modulo n^2), not to decrypt."""

    n: mpz
    modulus: mpz = field(init=False)
    scheme = "paillier"

    def __post_init__(self) -> None:
        """Hold n as a gmpy2 integer and precompute the ciphertext modulus n^2."""
        object.__setattr__(self, "n", mpz(self.n))
        object.__setattr__(self, "modulus", self.n * self.n)

    @property
    def n_square(self) -> mpz:
        """n^2: the ciphertext modulus."""
        return self.modulus

    @property
    def plaintext_bits(self) -> int:
        """Bits a packed plaintext may use and still stay below n."""
        return int(self.n.bit_length()) - 1

    def add_plain(self, ciphertext: mpz, value: int) -> mpz:
        """Enc(x + value) from Enc(x): one multiplication, no new randomness needed."""
        return ciphertext * (1 + value * self.n) % self.modulus

    def to_json(self) -> dict:
        """The public key as JSON-safe fields: its format (`KEY_FORMAT`) and the modulus as a hex string."""
        return {**KEY_FORMAT, "n": format(int(self.n), "x")}

    @classmethod
    def from_json(cls, fields: dict) -> PaillierPublicKey:
        """Read `to_json`'s output.

        Refuses another scheme or format version, and moduli of unaccepted sizes.
        """
        (n,) = read_key_fields(fields, KEY_FORMAT, ["n"], "Paillier")
        return cls(n)


@dataclass(frozen=True)
class PaillierPrivateKey(AdditivePrivateKey):
    """The primes behind n, with the CRT constants that make encryption and decryption fast."""

    public: PaillierPublicKey
    p: mpz
    q: mpz
    # derived in __post_init__: the CRT constants, and the fixed-base tables (built on first use)
    _crt: dict[str, mpz] = field(init=False, repr=False, compare=False)
    _tables: tuple[FixedBase, FixedBase] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Check p q = n and precompute the CRT constants decryption uses."""
        p, q, n = mpz(self.p), mpz(self.q), self.public.n
        if p * q != n:
            raise ParameterError("p * q does not equal the public modulus")
        object.__setattr__(self, "p", p)
        object.__setattr__(self, "q", q)
        p2, q2 = p * p, q * q
        object.__setattr__(self, "_crt", {
            "p2": p2, "q2": q2,
            "p2_inv_mod_q2": gmpy2.invert(p2, q2),
            "q_inv_mod_p": gmpy2.invert(q, p),
            "hp": gmpy2.invert(_l_function(gmpy2.powmod(n + 1, p - 1, p2), p), p),
            "hq": gmpy2.invert(_l_function(gmpy2.powmod(n + 1, q - 1, q2), q), q),
        })
        object.__setattr__(self, "_tables", None)

    @property
    def plaintext_bound(self) -> int:
        """Paillier plaintexts lie in [0, n)."""
        return int(self.public.n)

    @property
    def bound_text(self) -> str:
        """The plaintext range, as error messages state it."""
        return "[0, n)"

    @property
    def randomness_bits(self) -> int:
        """Bits of each encryption's fresh exponent: half the modulus (DJN; HEU's ZPaillier)."""
        return -(-int(self.public.n.bit_length()) // 2)

    def worker_fields(self) -> dict:
        """The public key and the primes, for a worker process of this one."""
        return {"public": self.public.to_json(), "p": int(self.p), "q": int(self.q)}

    def _fixed_bases(self) -> tuple[FixedBase, FixedBase]:
        """h_s = (-x^2)^n mod n^2 for a secret random x, as tables modulo p^2 and q^2 (built on first use)."""
        tables = self._tables
        if tables is None:
            c, n = self._crt, self.public.n
            x = mpz(secrets.randbelow(int(n) - 2) + 2)
            h = (-x * x) % n
            tables = (FixedBase(gmpy2.powmod(h, n, c["p2"]), c["p2"], self.randomness_bits),
                      FixedBase(gmpy2.powmod(h, n, c["q2"]), c["q2"], self.randomness_bits))
            object.__setattr__(self, "_tables", tables)
        return tables

    def _encrypt_here(self, plaintexts: Sequence[mpz]) -> list[mpz]:
        """(1 + m n) h_s^a mod n^2, with h_s^a from the fixed-base tables modulo p^2 and q^2 joined by CRT."""
        c, n, n2 = self._crt, self.public.n, self.public.modulus
        at_p, at_q = self._fixed_bases()
        width = -(-self.randomness_bits // 8)
        out = []
        for m in plaintexts:
            exponent = secrets.token_bytes(width)
            rp, rq = at_p.power(exponent), at_q.power(exponent)
            randomness = rp + c["p2"] * ((rq - rp) * c["p2_inv_mod_q2"] % c["q2"])
            out.append((1 + m * n) * randomness % n2)
        return out

    def _decrypt_serial(self, ciphertexts: Sequence[mpz]) -> list[int]:
        c, p, q = self._crt, self.p, self.q
        out = []
        for ciphertext in ciphertexts:
            mp = _l_function(gmpy2.powmod(ciphertext, p - 1, c["p2"]), p) * c["hp"] % p
            mq = _l_function(gmpy2.powmod(ciphertext, q - 1, c["q2"]), q) * c["hq"] % q
            out.append(int(mq + q * ((mp - mq) * c["q_inv_mod_p"] % p)))
        return out

    @classmethod
    def from_worker_fields(cls, fields: dict) -> PaillierPrivateKey:
        """Inverse of `worker_fields`."""
        return cls(PaillierPublicKey.from_json(fields["public"]), fields["p"], fields["q"])


def _l_function(x: mpz, prime: mpz) -> mpz:
    return (x - 1) // prime


def generate_keypair(bits: int = DEFAULT_KEY_BITS, *, insecure_for_tests: bool = False) -> PaillierPrivateKey:
    """A fresh key pair with a `bits`-bit modulus (2048 or 3072; 1024 only when `insecure_for_tests`).

    Two distinct random primes of `bits / 2` bits (`random_prime`), n = p q with gcd(n, (p-1)(q-1)) = 1.
    """
    check_key_bits_to_generate(bits, insecure_for_tests, "Paillier")
    while True:
        p, q = random_prime(bits // 2), random_prime(bits // 2)
        n = p * q
        if p != q and n.bit_length() == bits and gmpy2.gcd(n, (p - 1) * (q - 1)) == 1:
            return PaillierPrivateKey(PaillierPublicKey(n), p, q)
