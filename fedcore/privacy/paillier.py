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

Ciphertexts cross the wire as fixed-width big-endian byte rows (`to_bytes` / `from_bytes`); the public
key as `{"scheme": "paillier", "version": 1, "n": hex}` (`to_json`).
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
KEY_FORMAT = {"scheme": "paillier", "version": 1}
"""What `PaillierPublicKey.to_json` says it is; a key of another scheme or format version is refused."""
PRIME_TEST_ROUNDS = 64
"""gmpy2.is_prime rounds: GMP's Baillie-PSW test plus Miller-Rabin rounds on random bases."""
WINDOW_BITS = 8
"""Bits of the exponent per table row in `FixedBase` (256 entries a row)."""
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
        """The public key as JSON-safe fields: its format (`KEY_FORMAT`) and the modulus as a hex string."""
        return {**KEY_FORMAT, "n": format(int(self.n), "x")}

    @classmethod
    def from_json(cls, fields: dict) -> PaillierPublicKey:
        """Read `to_json`'s output; refuses another scheme or format version and moduli of unaccepted sizes."""
        try:
            stated = {key: fields[key] for key in KEY_FORMAT}
            n = mpz(int(str(fields["n"]), 16))
        except (KeyError, TypeError, ValueError) as error:
            raise ProtocolError(f"malformed Paillier public key: {error!r} missing or invalid") from error
        if stated != KEY_FORMAT:
            raise ProtocolError(f"public key format {stated} refused: this version reads {KEY_FORMAT}")
        if n.bit_length() not in (*KEY_BITS, TEST_KEY_BITS):
            raise ProtocolError(f"Paillier modulus of {n.bit_length()} bits refused: expected one of {KEY_BITS}")
        return cls(n)


class FixedBase:
    """Powers of one base modulo m from tables: row i holds base^(d 2^(8i)) for every byte value d, so
    base^e is one multiplication per non-zero byte of e. Built once per key (16 MB for 2048-bit keys)."""

    def __init__(self, base: mpz, modulus: mpz, exponent_bits: int) -> None:
        self.modulus = modulus
        self.rows: list[list[mpz]] = []
        step = base
        for _ in range(-(-exponent_bits // WINDOW_BITS)):
            row = [mpz(1)]
            for _ in range((1 << WINDOW_BITS) - 1):
                row.append(row[-1] * step % modulus)
            self.rows.append(row)
            step = row[-1] * step % modulus  # base^(2^(8(i+1)))

    def power(self, exponent: bytes) -> mpz:
        """base^e mod m for the little-endian exponent bytes (at most one byte per table row)."""
        modulus, acc = self.modulus, mpz(1)
        for row, digit in zip(self.rows, exponent, strict=False):
            if digit:
                acc = acc * row[digit] % modulus
        return acc


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
            "hp": gmpy2.invert(_l_function(gmpy2.powmod(n + 1, p - 1, p2), p), p),
            "hq": gmpy2.invert(_l_function(gmpy2.powmod(n + 1, q - 1, q2), q), q),
        })
        object.__setattr__(self, "_tables", None)

    @property
    def randomness_bits(self) -> int:
        """Bits of each encryption's fresh exponent: half the modulus (DJN; HEU's ZPaillier)."""
        return -(-int(self.public.n.bit_length()) // 2)

    def _fixed_bases(self) -> tuple[FixedBase, FixedBase]:
        """h_s = (-x^2)^n mod n^2 for a secret random x, as tables modulo p^2 and q^2 (built on first use)."""
        if self._tables is None:
            c, n = self._crt, self.public.n
            x = mpz(secrets.randbelow(int(n) - 2) + 2)
            h = (-x * x) % n
            tables = (FixedBase(gmpy2.powmod(h, n, c["p2"]), c["p2"], self.randomness_bits),
                      FixedBase(gmpy2.powmod(h, n, c["q2"]), c["q2"], self.randomness_bits))
            object.__setattr__(self, "_tables", tables)
        return self._tables

    def encrypt(self, plaintexts: Sequence[int], workers: int | None = None) -> list[mpz]:
        """Fresh ciphertexts of non-negative integers below n (randomness h_s^a from the fixed-base tables
        modulo p^2 and q^2). Table lookups hold the GIL, so with `workers` > 1 (default: one per core for
        large batches) the batch is split over that many worker processes (`fedcore.privacy.gmp_workers`),
        each with tables of its own."""
        from fedcore.privacy.gmp_workers import GmpWorkers, default_worker_count

        plaintexts = [mpz(m) for m in plaintexts]
        if any(not 0 <= m < self.public.n for m in plaintexts):
            raise ParameterError("a Paillier plaintext must lie in [0, n)")
        count = default_worker_count(len(plaintexts)) if workers is None else workers
        if count <= 1:
            return self._encrypt_here(plaintexts)
        pool = GmpWorkers(count)
        try:
            pool.all("load_key", int(self.public.n), int(self.p), int(self.q))
            bounds = np.linspace(0, len(plaintexts), count + 1).astype(int)
            parts = pool.each("encrypt", [(plaintexts[a:b],) for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
        finally:
            pool.close()
        return [c for part in parts for c in part]

    def _encrypt_here(self, plaintexts: Sequence[mpz]) -> list[mpz]:
        """`encrypt` of checked plaintexts, on this thread."""
        c, n, n2 = self._crt, self.public.n, self.public.n_square
        at_p, at_q = self._fixed_bases()
        width = -(-self.randomness_bits // 8)
        out = []
        for m in plaintexts:
            exponent = secrets.token_bytes(width)
            rp, rq = at_p.power(exponent), at_q.power(exponent)
            randomness = rp + c["p2"] * ((rq - rp) * c["p2_inv_mod_q2"] % c["q2"])
            out.append((1 + m * n) * randomness % n2)
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


def random_prime(bits: int) -> mpz:
    """A uniformly drawn prime of exactly `bits` bits, top two bits set (so a product of two has twice the
    bits) and = 3 mod 4 (so -1 is a non-residue modulo it, as DJN's h = -x^2 asks)."""
    top = mpz(3) << (bits - 2)
    while True:
        candidate = mpz(secrets.randbits(bits)) | top | 3
        if gmpy2.is_prime(candidate, PRIME_TEST_ROUNDS):
            return candidate


def generate_keypair(bits: int = 2048, *, insecure_for_tests: bool = False) -> PaillierPrivateKey:
    """A fresh key pair with a `bits`-bit modulus (2048 or 3072; 1024 only when `insecure_for_tests`): two
    distinct random primes of `bits / 2` bits (`random_prime`), n = p q with gcd(n, (p-1)(q-1)) = 1."""
    allowed = (*KEY_BITS, TEST_KEY_BITS) if insecure_for_tests else KEY_BITS
    if isinstance(bits, bool) or bits not in allowed:
        raise ParameterError(f"paillier_key_bits must be one of {KEY_BITS}, got {bits!r}")
    while True:
        p, q = random_prime(bits // 2), random_prime(bits // 2)
        n = p * q
        if p != q and n.bit_length() == bits and gmpy2.gcd(n, (p - 1) * (q - 1)) == 1:
            return PaillierPrivateKey(PaillierPublicKey(n), p, q)
