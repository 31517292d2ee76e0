"""Paillier encryption on raw gmpy2 integers, for labels in the vertical setting (SecureBoost pattern).

phe generates the key (its prime search uses gmpy2); encryption and decryption then work on raw `mpz`
integers with the Chinese remainder theorem over the private primes, which only the label holder has:
passive parties get the public modulus alone and can add ciphertexts, never open them. With g = n + 1:

    Enc(m) = (1 + m n) r^n mod n^2        Enc(a) Enc(b) = Enc(a + b)        Enc(m)^k = Enc(k m)

Ciphertexts cross the wire as fixed-width big-endian byte rows (`to_bytes` / `from_bytes`).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import gmpy2
import numpy as np
from gmpy2 import mpz

from fedcore.errors import ParameterError, ProtocolError

KEY_BITS = (2048, 3072)
"""Modulus sizes accepted for real keys: 2048 bits (about 112-bit security) by default, 3072 (128-bit)."""
TEST_KEY_BITS = 1024
"""A small modulus that only `generate_keypair(..., insecure_for_tests=True)` accepts, to keep tests fast."""
PARALLEL_MIN_ITEMS = 64
"""Below this many items, worker threads cost more than they save."""


def parallel_map(work: Callable[[list], list], items: Sequence, workers: int | None = None) -> list:
    """`work` over interleaved chunks of `items` in threads, results back in order. gmpy2 releases the GIL
    in exponentiations when its (thread-local) context allows it, so modular powers use every core."""
    workers = (os.cpu_count() or 1) if workers is None else workers
    if workers <= 1 or len(items) < PARALLEL_MIN_ITEMS:
        return work(list(items))

    def chunk(i: int) -> list:
        gmpy2.get_context().allow_release_gil = True
        return work(list(items[i::workers]))

    with ThreadPoolExecutor(workers, thread_name_prefix="fedforest-paillier") as pool:
        parts = list(pool.map(chunk, range(workers)))
    out: list = [None] * len(items)
    for i, part in enumerate(parts):
        out[i::workers] = part
    return out


@dataclass(frozen=True)
class PaillierPublicKey:
    """The modulus n: enough to add ciphertexts and to scale them, not to decrypt."""

    n: mpz
    n_square: mpz = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", mpz(self.n))
        object.__setattr__(self, "n_square", self.n * self.n)

    @property
    def plaintext_bits(self) -> int:
        """Bits a packed plaintext may use and still stay below n."""
        return int(self.n.bit_length()) - 1

    @property
    def ciphertext_bytes(self) -> int:
        """Width of one ciphertext on the wire."""
        return (int(self.n_square.bit_length()) + 7) // 8

    def add(self, a: mpz, b: mpz) -> mpz:
        """Enc(x + y) from Enc(x) and Enc(y)."""
        return a * b % self.n_square

    def add_plain(self, ciphertext: mpz, value: int) -> mpz:
        """Enc(x + value) from Enc(x): one multiplication, no new randomness needed."""
        return ciphertext * (1 + value * self.n) % self.n_square

    def scale(self, ciphertext: mpz, factor: int) -> mpz:
        """Enc(factor * x) from Enc(x)."""
        return gmpy2.powmod(ciphertext, factor, self.n_square)

    def to_bytes(self, ciphertexts: Sequence[mpz]) -> np.ndarray:
        """Ciphertexts as rows of a (count, ciphertext_bytes) uint8 array."""
        width = self.ciphertext_bytes
        blob = b"".join(int(c).to_bytes(width, "big") for c in ciphertexts)
        return np.frombuffer(blob, dtype=np.uint8).reshape(len(ciphertexts), width)

    def from_bytes(self, rows: np.ndarray, what: str = "ciphertexts") -> list[mpz]:
        """Inverse of `to_bytes`; refuses rows of the wrong width or values outside Z*_{n^2}."""
        rows = np.asarray(rows)
        if rows.ndim != 2 or rows.dtype != np.uint8 or rows.shape[1] != self.ciphertext_bytes:
            raise ProtocolError(f"{what} must be a (count, {self.ciphertext_bytes}) uint8 array, "
                                f"got {rows.dtype}{list(rows.shape)}")
        values = [mpz(int.from_bytes(row.tobytes(), "big")) for row in rows]
        for value in values:
            if not 0 < value < self.n_square:
                raise ProtocolError(f"{what} hold a value outside the ciphertext space")
        return values

    def to_json(self) -> dict:
        """The public key as JSON-safe fields (the modulus as a hex string)."""
        return {"n": format(int(self.n), "x")}

    @classmethod
    def from_json(cls, fields: dict) -> PaillierPublicKey:
        """Read `to_json`'s output; refuses moduli of unaccepted sizes."""
        try:
            n = mpz(int(str(fields["n"]), 16))
        except (KeyError, TypeError, ValueError) as error:
            raise ProtocolError(f"malformed Paillier public key: {error}") from error
        if n.bit_length() not in (*KEY_BITS, TEST_KEY_BITS):
            raise ProtocolError(f"Paillier modulus of {n.bit_length()} bits refused: expected one of {KEY_BITS}")
        return cls(n)


@dataclass(frozen=True)
class PaillierPrivateKey:
    """The primes behind n, with the CRT constants that make encryption and decryption fast."""

    public: PaillierPublicKey
    p: mpz
    q: mpz

    def __post_init__(self) -> None:
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
            "n_mod_phi_p2": n % (p * (p - 1)), "n_mod_phi_q2": n % (q * (q - 1)),
            "hp": gmpy2.invert(_l_function(gmpy2.powmod(n + 1, p - 1, p2), p), p),
            "hq": gmpy2.invert(_l_function(gmpy2.powmod(n + 1, q - 1, q2), q), q),
        })

    def encrypt(self, plaintexts: Sequence[int], workers: int | None = None) -> list[mpz]:
        """Fresh ciphertexts of non-negative integers below n (randomness r^n computed mod p^2 and q^2).

        Large batches are spread over `workers` threads (default: one per core).
        """
        return parallel_map(self._encrypt_serial, plaintexts, workers)

    def _encrypt_serial(self, plaintexts: Sequence[int]) -> list[mpz]:
        c, n = self._crt, self.public.n
        out = []
        for m in plaintexts:
            m = mpz(m)
            if not 0 <= m < n:
                raise ParameterError("a Paillier plaintext must lie in [0, n)")
            r = mpz(secrets.randbelow(int(n) - 1) + 1)
            rp = gmpy2.powmod(r, c["n_mod_phi_p2"], c["p2"])
            rq = gmpy2.powmod(r, c["n_mod_phi_q2"], c["q2"])
            rn = rp + c["p2"] * ((rq - rp) * c["p2_inv_mod_q2"] % c["q2"])
            out.append((1 + m * n) * rn % self.public.n_square)
        return out

    def decrypt(self, ciphertexts: Sequence[mpz], workers: int | None = None) -> list[int]:
        """Plaintexts of ciphertexts under this key (CRT decryption), over `workers` threads."""
        return parallel_map(self._decrypt_serial, ciphertexts, workers)

    def _decrypt_serial(self, ciphertexts: Sequence[mpz]) -> list[int]:
        c, p, q = self._crt, self.p, self.q
        out = []
        for ciphertext in ciphertexts:
            mp = _l_function(gmpy2.powmod(ciphertext, p - 1, c["p2"]), p) * c["hp"] % p
            mq = _l_function(gmpy2.powmod(ciphertext, q - 1, c["q2"]), q) * c["hq"] % q
            out.append(int(mq + q * ((mp - mq) * c["q_inv_mod_p"] % p)))
        return out


def _l_function(x: mpz, prime: mpz) -> mpz:
    return (x - 1) // prime


def generate_keypair(bits: int = 2048, *, insecure_for_tests: bool = False) -> PaillierPrivateKey:
    """A fresh key pair with a `bits`-bit modulus (2048 or 3072; 1024 only when `insecure_for_tests`)."""
    allowed = (*KEY_BITS, TEST_KEY_BITS) if insecure_for_tests else KEY_BITS
    if isinstance(bits, bool) or bits not in allowed:
        raise ParameterError(f"paillier_key_bits must be one of {KEY_BITS}, got {bits!r}")
    from phe import paillier

    public, private = paillier.generate_paillier_keypair(n_length=bits)
    return PaillierPrivateKey(PaillierPublicKey(mpz(public.n)), mpz(private.p), mpz(private.q))
