"""Keyed ID hashing: the documented normalisation, HMAC-SHA256 digests, and refusals of bad IDs."""

from __future__ import annotations

import hmac
import re
from decimal import Decimal

import numpy as np
import pandas as pd
import pytest

from fedcore.errors import InputError
from fedcore.privacy.hashing import hash_ids, normalize_ids

KEY = b"consortium-key-for-tests-0123456789"


def test_normalisation_case_space_and_unicode() -> None:
    ids = pd.Series([" ABC ", "abc", "\tAbC\n", "ＡＢＣ", "Straße", "STRASSE"], name="customer_id",
                    index=[5, 6, 7, 8, 9, 10])
    out = normalize_ids(ids)
    assert out.tolist() == ["abc", "abc", "abc", "abc", "strasse", "strasse"]
    assert out.name == "customer_id" and out.index.tolist() == [5, 6, 7, 8, 9, 10]


def test_normalisation_numbers_without_trailing_zero() -> None:
    mixed = pd.Series([123, "123", 123.0, np.int64(123), np.float32(123.0), Decimal("123.00"),
                       b"123", " 123 "],
                      dtype=object)
    assert set(normalize_ids(mixed)) == {"123"}
    assert normalize_ids(pd.Series([1.5, -2.0, 7], dtype=object)).tolist() == ["1.5", "-2", "7"]
    assert normalize_ids(pd.Series([123, 4])).tolist() == ["123", "4"]
    assert normalize_ids(pd.Series([123.0, 4.0])).tolist() == ["123", "4"]
    assert normalize_ids(pd.Series([123, 4], dtype="Int64")).tolist() == ["123", "4"]


def test_equivalent_ids_hash_alike_across_forms() -> None:
    as_int = hash_ids(pd.Series([123, 77]), KEY)
    as_str = hash_ids(pd.Series([" 123", "77 "]), KEY)
    as_float = hash_ids(pd.Series([123.0, 77.0]), KEY)
    assert (as_int == as_str).all() and (as_int == as_float).all()
    assert (hash_ids(pd.Series([" ABC "]), KEY) == hash_ids(pd.Series(["abc"]), KEY)).all()


def test_digests_are_hmac_sha256_of_the_normalised_text() -> None:
    ids = pd.Series(["C000123", " c000124 ", "Zoë", 42])
    digests = hash_ids(ids, KEY)
    assert digests.dtype == np.dtype("S32") and digests.shape == (4,)
    expected = [hmac.digest(KEY, text.encode(), "sha256") for text in ("c000123", "c000124", "zoë", "42")]
    assert digests.tobytes() == b"".join(expected)
    long_key = bytes(range(100))  # longer than the SHA-256 block: hashed first, as RFC 2104 says
    assert hash_ids(ids, long_key).tobytes() == b"".join(
        hmac.digest(long_key, t.encode(), "sha256") for t in ("c000123", "c000124", "zoë", "42"))


def test_same_key_same_digest_other_key_other_digest() -> None:
    ids = pd.Series([f"C{i:06d}" for i in range(50)])
    first, again = hash_ids(ids, KEY), hash_ids(ids.sample(frac=1, random_state=1).sort_index(), KEY)
    other = hash_ids(ids, KEY + b"!")
    assert (first == again).all()
    assert not np.isin(other, first).any()
    assert len(np.unique(first)) == 50


def test_missing_ids_are_refused_with_their_count() -> None:
    ids = pd.Series(["a", None, np.nan, "   ", "b"], name="customer_id")
    message = ("ID column 'customer_id' has 3 missing IDs (None, NaN or blank) among 5 rows; "
               "every row needs an ID: drop or fill those rows")
    with pytest.raises(InputError, match=re.escape(message)):
        normalize_ids(ids)
    with pytest.raises(InputError, match=re.escape(message)):
        hash_ids(ids, KEY)
    with pytest.raises(InputError, match=re.escape("ID column 'id' has 1 missing IDs")):
        hash_ids(pd.Series([1, None, 3], dtype="Int64", name="id"), KEY)


def test_duplicates_after_normalisation_are_refused_with_examples() -> None:
    ids = pd.Series(["abc", " ABC ", "x", "123", 123.0], name="customer_id", dtype=object)
    message = ("ID column 'customer_id' has 2 IDs that occur more than once after normalisation: "
               "'abc' (from 'abc', ' ABC '); '123' (from '123', 123.0); each row needs a unique ID")
    with pytest.raises(InputError, match=re.escape(message)):
        hash_ids(ids, KEY)


def test_weak_or_wrong_keys_are_refused() -> None:
    with pytest.raises(InputError, match="the consortium key has 6 bytes; use at least 16"):
        hash_ids(pd.Series(["a"]), b"secret")
    with pytest.raises(InputError, match="must be bytes, got str"):
        hash_ids(pd.Series(["a"]), "a-string-key-that-is-long-enough")  # type: ignore[arg-type]
