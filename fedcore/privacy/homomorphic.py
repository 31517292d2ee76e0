"""What the two additively homomorphic schemes (Paillier, Okamoto-Uchiyama) share, on raw gmpy2 integers.

Both encrypt a non-negative integer below a public bound; multiplying two ciphertexts modulo the public
`modulus` adds their plaintexts, raising one to k multiplies its plaintext by k. Passive parties use only
that (`CiphertextSpace`); the label holder, who has the private key (`AdditivePrivateKey`), encrypts
with fixed-base tables (`FixedBase`) and decrypts. Ciphertexts cross the wire as fixed-width big-endian
byte rows; a ciphertext outside (0, modulus) is refused.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import gmpy2
import numpy as np
from gmpy2 import mpz

from fedcore.errors import ParameterError, ProtocolError

KEY_BITS = (2048, 3072)
"""Modulus sizes either scheme accepts for real keys (about 112- and 128-bit security)."""
TEST_KEY_BITS = 1024
"""A small modulus that only `generate_keypair(..., insecure_for_tests=True)` accepts, to keep tests fast."""
PRIME_TEST_ROUNDS = 64
"""gmpy2.is_prime rounds: GMP's Baillie-PSW test plus Miller-Rabin rounds on random bases."""
WINDOW_BITS = 8
"""Bits of the exponent per table row in `FixedBase` (256 entries a row)."""
PARALLEL_MIN_ITEMS = 64
"""Below this many items, worker threads cost more than they save."""


def parallel_map(work: Callable[[list], list], items: Sequence, workers: int | None = None) -> list:
    """`work` over interleaved chunks of `items` in threads, results back in order.

    gmpy2 releases the GIL in exponentiations when its (thread-local) context allows it, so modular powers use
    every core.
    """
    workers = (os.cpu_count() or 1) if workers is None else workers
    if workers <= 1 or len(items) < PARALLEL_MIN_ITEMS:
        return work(list(items))

    def chunk(i: int) -> list:
        gmpy2.get_context().allow_release_gil = True
        return work(list(items[i::workers]))

    with ThreadPoolExecutor(workers, thread_name_prefix="fedforest-he") as pool:
        parts = list(pool.map(chunk, range(workers)))
    out: list = [None] * len(items)
    for i, part in enumerate(parts):
        out[i::workers] = part
    return out


def random_prime(bits: int) -> mpz:
    """A uniformly drawn prime of exactly `bits` bits, top two bits set and = 3 mod 4.

    The top bits make a product of such primes have the summed bits, or one less; 3 mod 4 makes -1 a
    non-residue modulo it, as DJN's h = -x^2 asks.
    """
    top = mpz(3) << (bits - 2)
    while True:
        candidate = mpz(secrets.randbits(bits)) | top | 3
        if gmpy2.is_prime(candidate, PRIME_TEST_ROUNDS):
            return candidate


class FixedBase:
    """Powers of one base modulo m from tables.

    Row i holds base^(d 2^(8i)) for every byte value d, so base^e is one multiplication per non-zero byte of
    e. Built once per key (16 MB for a 2048-bit Paillier key's modulus p^2).
    """

    def __init__(self, base: mpz, modulus: mpz, exponent_bits: int) -> None:
        """Build the tables of `base` modulo `modulus` for exponents of up to `exponent_bits` bits."""
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

    def power_of(self, exponent: int) -> mpz:
        """base^e mod m for a non-negative integer e of at most the table's bits."""
        return self.power(int(exponent).to_bytes(len(self.rows), "little"))


class CiphertextSpace:
    """A public key's view of ciphertexts: add them, scale them, read and write them as byte rows."""

    scheme: str
    modulus: mpz
    """Ciphertexts are integers in (0, modulus); homomorphic operations are taken modulo it."""

    @property
    def plaintext_bits(self) -> int:
        """Bits a packed plaintext may use (every value below 2^plaintext_bits decrypts exactly)."""
        raise NotImplementedError

    @property
    def ciphertext_bytes(self) -> int:
        """Width of one ciphertext on the wire."""
        return (int(self.modulus.bit_length()) + 7) // 8

    def add(self, a: mpz, b: mpz) -> mpz:
        """Enc(x + y) from Enc(x) and Enc(y)."""
        return a * b % self.modulus

    def scale(self, ciphertext: mpz, factor: int) -> mpz:
        """Enc(factor * x) from Enc(x)."""
        return gmpy2.powmod(ciphertext, factor, self.modulus)

    def to_bytes(self, ciphertexts: Sequence[mpz]) -> np.ndarray:
        """Ciphertexts as rows of a (count, ciphertext_bytes) uint8 array."""
        width = self.ciphertext_bytes
        blob = b"".join(int(c).to_bytes(width, "big") for c in ciphertexts)
        return np.frombuffer(blob, dtype=np.uint8).reshape(len(ciphertexts), width)

    def from_bytes(self, rows: np.ndarray, what: str = "ciphertexts") -> list[mpz]:
        """Inverse of `to_bytes`; refuses rows of the wrong width or values outside (0, modulus)."""
        rows = np.asarray(rows)
        if rows.ndim != 2 or rows.dtype != np.uint8 or rows.shape[1] != self.ciphertext_bytes:
            raise ProtocolError(f"{what} must be a (count, {self.ciphertext_bytes}) uint8 array, "
                                f"got {rows.dtype}{list(rows.shape)}")
        values = [mpz(int.from_bytes(row.tobytes(), "big")) for row in rows]
        for value in values:
            if not 0 < value < self.modulus:
                raise ProtocolError(f"{what} hold a value outside the ciphertext space")
        return values

    def to_json(self) -> dict:
        """The public key as JSON-safe fields, with its scheme and format version."""
        raise NotImplementedError


class AdditivePrivateKey:
    """The label holder's key: encrypts (on this thread) and decrypts (over threads)."""

    public: CiphertextSpace

    @property
    def plaintext_bound(self) -> int:
        """Every plaintext must lie in [0, plaintext_bound)."""
        raise NotImplementedError

    def worker_fields(self) -> dict:
        """What a worker process needs to rebuild this key (`schemes.private_key_from_fields`).

        It goes over a pipe to a child process of this one, never to a peer.
        """
        raise NotImplementedError

    def encrypt(self, plaintexts: Sequence[int]) -> list[mpz]:
        """Fresh ciphertexts of integers in [0, plaintext_bound), on this thread.

        Table lookups hold the GIL: `fedcore.privacy.gmp_workers.encrypt_over_workers` spreads a large batch
        over worker processes, each with tables of its own.
        """
        return self._encrypt_here(self.checked_plaintexts(plaintexts))

    def checked_plaintexts(self, plaintexts: Sequence[int]) -> list[mpz]:
        """The plaintexts as gmpy2 integers; ParameterError unless each lies in [0, plaintext_bound)."""
        checked = [mpz(m) for m in plaintexts]
        bound = self.plaintext_bound
        if any(not 0 <= m < bound for m in checked):
            raise ParameterError(f"a plaintext must lie in {self.bound_text} under this "
                                 f"{self.public.scheme} key")
        return checked

    @property
    def bound_text(self) -> str:
        """The plaintext range, as error messages state it."""
        return f"[0, {self.plaintext_bound})"

    def _encrypt_here(self, plaintexts: Sequence[mpz]) -> list[mpz]:
        """`encrypt` of checked plaintexts, on this thread."""
        raise NotImplementedError

    def decrypt(self, ciphertexts: Sequence[mpz], workers: int | None = None) -> list[int]:
        """Plaintexts of ciphertexts under this key, over `workers` threads."""
        return parallel_map(self._decrypt_serial, ciphertexts, workers)

    def _decrypt_serial(self, ciphertexts: Sequence[mpz]) -> list[int]:
        raise NotImplementedError


def check_key_bits_to_generate(bits: int, insecure_for_tests: bool, scheme: str) -> None:
    """Refuse a modulus size `generate_keypair` may not make: `KEY_BITS`, or `TEST_KEY_BITS` in tests."""
    allowed = (*KEY_BITS, TEST_KEY_BITS) if insecure_for_tests else KEY_BITS
    if isinstance(bits, bool) or bits not in allowed:
        raise ParameterError(f"key_bits must be one of {KEY_BITS} for {scheme}, got {bits!r}")


def check_received_modulus(n: mpz, scheme: str) -> None:
    """Refuse a received public key whose modulus is not of an accepted size (`TEST_KEY_BITS` included)."""
    if n.bit_length() not in (*KEY_BITS, TEST_KEY_BITS):
        raise ProtocolError(f"{scheme} modulus of {n.bit_length()} bits refused: expected one of {KEY_BITS}")


def read_key_fields(fields: dict, key_format: dict, names: Sequence[str], what: str) -> list[mpz]:
    """The hex integers `names` of a public key's JSON fields, after checking its scheme and version.

    The first name is the modulus: a size other than `KEY_BITS` (or `TEST_KEY_BITS`) is refused.
    """
    try:
        stated = {key: fields[key] for key in key_format}
        values = [mpz(int(str(fields[name]), 16)) for name in names]
    except (KeyError, TypeError, ValueError) as error:
        raise ProtocolError(f"malformed {what} public key: {error!r} missing or invalid") from error
    if stated != key_format:
        raise ProtocolError(f"public key format {stated} refused: this version reads {key_format}")
    check_received_modulus(values[0], what)
    return values
