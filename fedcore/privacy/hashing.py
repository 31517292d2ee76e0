"""Keyed ID hashing: IDs cross between institutions and the master only as HMAC-SHA256 digests.

ID hashing, version 1 (reproducible outside fedforest, e.g. in a data warehouse):

1. normalise each ID to text: integers (and integer-valued floats/decimals such as ``123.0``) are
   written in plain decimal without ``.0``; other floats in Python's shortest round-trip form; bytes are
   decoded as UTF-8; anything else through ``str()``; then Unicode NFKC, strip surrounding whitespace,
   ``str.casefold()``. So ``" ABC "`` and ``"abc"`` agree, and so do ``123``, ``"123"`` and ``123.0``.
2. digest = HMAC-SHA256(consortium key, UTF-8 bytes of the normalised text), 32 bytes.

Missing IDs (None, NaN, NA, or blank after normalisation) and IDs that collide after normalisation are
refused: every row must map to exactly one digest. The master, which never holds the key, sees only
digests; parties holding the key could test guessed IDs, so the key stays within the consortium.

Digests come back as a fixed-width ``S32`` NumPy array: compare, sort and intersect them as arrays. NumPy
drops trailing NUL bytes when one element is read out as a Python ``bytes``; for the exact 32 bytes
use ``digests.tobytes()`` or ``digests.view(np.uint8).reshape(-1, 32)`` (the form to put in a Message).
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections import defaultdict
from decimal import Decimal

import numpy as np
import pandas as pd

from fedcore.errors import InputError

DIGEST_SIZE = 32
MIN_KEY_BYTES = 16
_BLOCK = 64  # SHA-256 block size, for the HMAC pads
_EXAMPLES = 3


def _where(series: pd.Series) -> str:
    return f"ID column {series.name!r}" if series.name is not None else "the ID column"


def _scalar_text(value: object) -> str:
    """One non-string ID as text: integral numbers without '.0', bytes as UTF-8, the rest via str()."""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, Decimal):
        return str(int(value)) if value.is_finite() and value == value.to_integral_value() else str(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"ID {value!r} is not valid UTF-8 ({exc.reason}); IDs must be "
                             "text or numbers") from exc
    return str(value)


def _normalized_list(series: pd.Series) -> list[str]:
    """The normalised IDs as a list of str (the fast path behind normalize_ids and hash_ids)."""
    missing = series.isna().to_numpy()
    if not missing.any() and pd.api.types.is_integer_dtype(series) and not pd.api.types.is_bool_dtype(series):
        return list(map(str, series.tolist()))  # plain decimal already: nothing to normalise
    values = series.tolist()
    normalize = unicodedata.normalize
    try:
        if missing.any():
            texts = ["" if m else normalize("NFKC", v if type(v) is str else _scalar_text(v))
                     .strip().casefold() for v, m in zip(values, missing.tolist(), strict=True)]
        else:
            texts = [normalize("NFKC", v if type(v) is str else _scalar_text(v)).strip().casefold()
                     for v in values]
    except InputError as exc:
        raise InputError(f"{_where(series)}: {exc}") from exc
    n_missing = texts.count("")
    if n_missing:
        raise InputError(f"{_where(series)} has {n_missing} missing IDs (None, NaN or blank) among "
                         f"{len(texts)} rows; every row needs an ID: drop or fill those rows")
    return texts


def normalize_ids(series: pd.Series) -> pd.Series:
    """IDs as canonical text (see the module docstring) so every institution hashes the same ID alike."""
    return pd.Series(_normalized_list(series), index=series.index, name=series.name, dtype=object)


def _check_unique(texts: list[str], series: pd.Series) -> None:
    if len(set(texts)) == len(texts):
        return
    raw: dict[str, list[object]] = defaultdict(list)
    for text, value in zip(texts, series.tolist(), strict=True):
        raw[text].append(value)
    dups = {text: values for text, values in raw.items() if len(values) > 1}
    examples = "; ".join(f"{text!r} (from {', '.join(repr(v) for v in values[:_EXAMPLES])})"
                         for text, values in list(dups.items())[:_EXAMPLES])
    more = f" and {len(dups) - _EXAMPLES} more" if len(dups) > _EXAMPLES else ""
    raise InputError(f"{_where(series)} has {len(dups)} IDs that occur more than once after normalisation: "
                     f"{examples}{more}; each row needs a unique ID")


def _check_key(key: bytes) -> bytes:
    if not isinstance(key, (bytes, bytearray)):
        raise InputError(f"the consortium key must be bytes, got {type(key).__name__}")
    if len(key) < MIN_KEY_BYTES:
        raise InputError(f"the consortium key has {len(key)} bytes; use at least {MIN_KEY_BYTES} random "
                         "bytes (e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`)")
    return bytes(key)


def hash_ids(series: pd.Series, key: bytes) -> np.ndarray:
    """HMAC-SHA256 digests (``S32`` array, row order kept) of the normalised IDs, so raw IDs never leave."""
    key = _check_key(key)
    texts = _normalized_list(series)
    _check_unique(texts, series)
    # RFC 2104 with the keyed inner/outer SHA-256 states computed once and copied per ID: the same
    # digests as hmac.digest(key, msg, "sha256"), about twice as fast in CPython.
    if len(key) > _BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    inner_copy = hashlib.sha256(bytes(b ^ 0x36 for b in key)).copy
    outer_copy = hashlib.sha256(bytes(b ^ 0x5C for b in key)).copy
    out: list[bytes] = []
    append = out.append
    for text in texts:
        inner = inner_copy()
        inner.update(text.encode())
        outer = outer_copy()
        outer.update(inner.digest())
        append(outer.digest())
    return np.frombuffer(b"".join(out), dtype=f"S{DIGEST_SIZE}").copy()
