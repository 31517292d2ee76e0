"""The label-encryption schemes of the vertical setting, by privacy mode.

Key sizes, key generation and reading public keys. Config, params, parties and worker processes all look a
scheme up here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fedcore.errors import ParameterError, ProtocolError
from fedcore.privacy import okamoto_uchiyama, paillier
from fedcore.privacy.homomorphic import KEY_BITS, AdditivePrivateKey, CiphertextSpace


@dataclass(frozen=True)
class Scheme:
    """One additively homomorphic scheme as a privacy mode offers it."""

    mode: str
    """The privacy mode that selects it (`privacy: {mode: ...}`)."""
    title: str
    key_bits: tuple[int, ...]
    default_key_bits: int
    generate: Callable[..., AdditivePrivateKey]
    public_from_json: Callable[[dict], CiphertextSpace]
    private_from_worker_fields: Callable[[dict], AdditivePrivateKey]
    key_format: dict
    ciphertext_moduli: int
    """Ciphertexts live modulo n^ciphertext_moduli: Paillier's modulo n^2, Okamoto-Uchiyama's modulo n."""

    def ciphertext_bytes(self, key_bits: int) -> int:
        """Width of one ciphertext under a `key_bits`-bit key (`CiphertextSpace.ciphertext_bytes`)."""
        return (self.ciphertext_moduli * key_bits + 7) // 8


SCHEMES: dict[str, Scheme] = {
    "paillier": Scheme("paillier", "Paillier", KEY_BITS, paillier.DEFAULT_KEY_BITS,
                       paillier.generate_keypair, paillier.PaillierPublicKey.from_json,
                       paillier.PaillierPrivateKey.from_worker_fields, paillier.KEY_FORMAT, 2),
    "ou": Scheme("ou", "Okamoto-Uchiyama", KEY_BITS, okamoto_uchiyama.DEFAULT_KEY_BITS,
                 okamoto_uchiyama.generate_keypair, okamoto_uchiyama.OUPublicKey.from_json,
                 okamoto_uchiyama.OUPrivateKey.from_worker_fields, okamoto_uchiyama.KEY_FORMAT, 1),
}
"""Encrypted-label privacy modes, by name."""
ENCRYPTED_MODES = tuple(SCHEMES)


def scheme(mode: str) -> Scheme:
    """The scheme of an encrypted-label privacy mode."""
    try:
        return SCHEMES[mode]
    except KeyError:
        raise ParameterError(f"{mode!r} is not an encrypted-label privacy mode; known: "
                             f"{list(SCHEMES)}") from None


def check_key_bits(mode: str, bits: object) -> int:
    """`bits` as the key size for `mode`, or ParameterError naming the sizes it accepts."""
    found = scheme(mode)
    if isinstance(bits, bool) or bits not in found.key_bits:
        raise ParameterError(f"key_bits must be one of {found.key_bits} for privacy {mode!r} ({found.title} "
                             f"modulus sizes), got {bits!r}")
    return int(bits)


def public_key_from_json(fields: object, mode: str) -> CiphertextSpace:
    """A relayed public key, refused unless it is of `mode`'s scheme and format."""
    expected = scheme(mode).key_format
    if not isinstance(fields, dict) or fields.get("scheme") != expected["scheme"]:
        stated = fields.get("scheme") if isinstance(fields, dict) else fields
        raise ProtocolError(f"the session's privacy mode {mode!r} needs a {expected['scheme']} public key, "
                            f"got {stated!r}")
    return scheme(mode).public_from_json(fields)


def _named_in(fields: dict) -> Scheme:
    for entry in SCHEMES.values():
        if entry.key_format["scheme"] == fields.get("scheme"):
            return entry
    raise ProtocolError(f"unknown key scheme {fields.get('scheme')!r}")


def private_key_from_worker_fields(fields: dict) -> AdditivePrivateKey:
    """A private key rebuilt in a worker process from `AdditivePrivateKey.worker_fields`."""
    return _named_in(fields["public"]).private_from_worker_fields(fields)


def public_key_from_any_json(fields: dict) -> CiphertextSpace:
    """A public key of whichever scheme its fields name (a worker process reading its parent's key)."""
    return _named_in(fields).public_from_json(fields)


def scheme_for(public: CiphertextSpace) -> Scheme:
    """The scheme a public key belongs to."""
    return _named_in({"scheme": public.scheme})
