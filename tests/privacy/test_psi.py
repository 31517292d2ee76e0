"""ECDH-PSI over X25519: exact intersections, one canonical order, what crosses the wire, and refusals."""

from __future__ import annotations

import hashlib
import hmac
import re

import numpy as np
import pandas as pd
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from fedcore.errors import ParameterError, ProtocolError
from fedcore.privacy import psi
from fedcore.privacy._x25519_batch import remap_low_order, scalarmult_chunk
from fedcore.privacy.hashing import hash_ids
from fedcore.privacy.psi import (
    HASH_TAG,
    PSIMessage,
    PSIParty,
    hash_to_u,
    intersect_blinded,
    psi_executor,
    run_psi,
)

KEY = b"consortium-key-for-psi-tests-0123456789"
UNIVERSE = [f"customer-{i:06d}@bank.example" for i in range(400)]
P = 2**255 - 19
LOW_ORDER = [0, 1, P - 1, P, P + 1,
             int.from_bytes(bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
                            "little")]


def secret(i: int) -> bytes:
    return hashlib.sha256(b"test-secret-%d" % i).digest()


def make_sets(n_parties: int, overlap: str, seed: int = 0) -> list[list[str]]:
    """Per party, a shuffled list of IDs: random partial overlap, disjoint ('empty') or identical ('full')."""
    rng = np.random.default_rng(seed)
    if overlap == "full":
        return [list(rng.permutation(UNIVERSE[:150])) for _ in range(n_parties)]
    if overlap == "empty":
        return [UNIVERSE[i::n_parties][:80] for i in range(n_parties)]
    return [list(rng.permutation([u for u in UNIVERSE if rng.random() < 0.7])) for _ in range(n_parties)]


def parties_for(sets: list[list[str]], **kwargs: object) -> list[PSIParty]:
    return [PSIParty(f"inst{j}", ids, secret=secret(j), **kwargs) for j, ids in enumerate(sets)]


def aligned(sets: list[list[str]], rows: dict[str, np.ndarray]) -> list[list[str]]:
    return [[sets[j][r] for r in rows[f"inst{j}"]] for j in range(len(sets))]


@pytest.mark.parametrize(("n_parties", "overlap"), [(2, "partial"), (3, "partial"), (4, "partial"),
                                                     (2, "empty"), (3, "empty"), (2, "full"), (4, "full")])
def test_intersection_exact_and_one_canonical_order(n_parties: int, overlap: str) -> None:
    sets = make_sets(n_parties, overlap)
    expected = set.intersection(*map(set, sets))
    rows, stats = run_psi(parties_for(sets), workers=1)
    lists = aligned(sets, rows)
    assert set(lists[0]) == expected and stats["n_common"] == len(expected)
    assert all(lst == lists[0] for lst in lists)  # the i-th aligned row is the same ID at every party
    for j in range(n_parties):
        assert rows[f"inst{j}"].dtype == np.int64 and len(np.unique(rows[f"inst{j}"])) == len(expected)
    if overlap == "partial":
        assert 0 < len(expected) < min(map(len, sets))


def test_canonical_order_independent_of_party_order_and_shuffles() -> None:
    sets = make_sets(3, "partial", seed=1)
    rows, _ = run_psi(parties_for(sets), workers=1)
    reversed_rows, _ = run_psi(parties_for(sets)[::-1], workers=1)
    assert all((rows[n] == reversed_rows[n]).all() for n in rows)


def test_the_sent_list_is_sorted_by_value_whatever_the_row_order() -> None:
    """The master learns nothing of the rows' order: the same IDs in another order give the same list."""
    ids = make_sets(2, "partial", seed=2)[0]
    party, shuffled = (PSIParty("inst0", order, secret=secret(0)) for order in (ids, ids[::-1]))
    sent = party.outgoing().view("S32").ravel()
    assert len(sent) == len(ids) and (sent[1:] > sent[:-1]).all()
    assert shuffled.outgoing().tobytes() == party.outgoing().tobytes()
    assert [ids[r] for r in party.send_order()] == [ids[::-1][r] for r in shuffled.send_order()]


def test_normalisation_shared_with_keyed_hashing() -> None:
    a = PSIParty("a", pd.Series([" CUST-1 ", 123, "x"]))
    b = PSIParty("b", ["cust-1", 123.0, "y", "Ｘ"])
    rows, _ = run_psi([a, b], workers=1)
    assert sorted(zip(rows["a"].tolist(), rows["b"].tolist(), strict=True)) == [(0, 0), (1, 1), (2, 3)]


def test_hash_to_u_is_the_documented_tagged_hash() -> None:
    assert hash_to_u(["abc"]).tobytes() == hashlib.sha256(HASH_TAG + b"abc").digest()
    assert hash_to_u(["abc"], KEY).tobytes() == hmac.digest(KEY, HASH_TAG + b"abc", "sha256")


def test_messages_follow_the_protocol_with_exact_sizes() -> None:
    sets = make_sets(3, "partial", seed=2)
    record: list[PSIMessage] = []
    _, stats = run_psi(parties_for(sets), workers=1, record=record)
    m, n, common = 3, [len(s) for s in sets], stats["n_common"]
    kinds = [msg.kind for msg in record]
    assert kinds == ["blinded"] * m + (["reblind"] * m + ["reblinded"] * m) * (m - 1) + ["positions"] * m
    assert stats["rounds"] == m
    for msg in record:
        assert "master" in (msg.sender, msg.receiver)
        if msg.kind != "positions":
            assert msg.payload.dtype == np.uint8 and msg.payload.shape == (n[int(msg.owner[-1])], 32)
        if msg.kind in ("reblind", "reblinded"):
            assert msg.owner not in (msg.sender, msg.receiver)  # a list never returns to its owner
    for j in range(m):
        assert stats["bytes_sent"][f"inst{j}"] == 32 * sum(n)
        assert stats["bytes_received"][f"inst{j}"] == 32 * (sum(n) - n[j]) + 8 * common


def test_no_raw_id_nor_its_hash_crosses_the_wire() -> None:
    sets = make_sets(3, "partial", seed=3)
    record: list[PSIMessage] = []
    for key in (None, KEY):
        run_psi(parties_for(sets, key=key), workers=1, record=record)
    ids = sorted(set().union(*sets))
    raw = [i.encode() for i in ids]
    forbidden = {hashlib.sha256(r).digest() for r in raw}
    forbidden |= {hmac.digest(KEY, r, "sha256") for r in raw}
    forbidden |= {bytes(row) for row in hash_ids(pd.Series(ids), KEY).view(np.uint8).reshape(-1, 32)}
    forbidden |= {bytes(u) for key in (None, KEY) for u in hash_to_u(ids, key)}  # the u values themselves
    for msg in record:
        blob = msg.payload.tobytes()
        assert not any(r in blob for r in raw)
        if msg.kind != "positions":
            assert not forbidden & {bytes(row) for row in msg.payload}


def test_secrets_and_keys_change_blinded_values_reproducibly() -> None:
    ids = UNIVERSE[:50]
    same1, same2 = PSIParty("a", ids, secret=secret(0)), PSIParty("a", ids, secret=secret(0))
    other, keyed = PSIParty("b", ids, secret=secret(1)), PSIParty("c", ids, secret=secret(0), key=KEY)
    assert (same1.blinded_own() == same2.blinded_own()).all()
    for blinded in (other.blinded_own(), keyed.blinded_own(), PSIParty("d", ids).blinded_own()):
        assert not ({bytes(r) for r in blinded} & {bytes(r) for r in same1.blinded_own()})
    assert (same1.reblind(other.blinded_own()) == other.reblind(same1.blinded_own())).all()  # commutative


def test_mismatched_consortium_keys_give_an_empty_intersection() -> None:
    a, b = PSIParty("a", UNIVERSE[:20], key=KEY), PSIParty("b", UNIVERSE[:20])
    rows, stats = run_psi([a, b], workers=1)
    assert stats["n_common"] == 0 and rows["a"].shape == (0,)


def test_fixed_secrets_reproduce_messages_and_result() -> None:
    sets = make_sets(2, "partial", seed=4)
    runs = []
    for _ in range(2):
        record: list[PSIMessage] = []
        rows, _ = run_psi(parties_for(sets), workers=1, record=record)
        runs.append((rows, record))
    (rows1, rec1), (rows2, rec2) = runs
    assert all((rows1[n] == rows2[n]).all() for n in rows1)
    assert [m.payload.tobytes() for m in rec1] == [m.payload.tobytes() for m in rec2]


def test_parallel_workers_match_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(psi, "_MIN_PARALLEL_OPS", 0)
    sets = [[f"id-{i}" for i in range(0, 2500)], [f"id-{i}" for i in range(1200, 3700)]]
    inline, _ = run_psi(parties_for(sets), workers=1)
    parallel, stats = run_psi(parties_for(sets), workers=2)
    assert stats["n_common"] == 1300 and all((inline[n] == parallel[n]).all() for n in inline)


def test_worker_errors_surface_as_protocol_errors() -> None:
    party = PSIParty("a", ["x"], secret=secret(0))
    bad = np.zeros((3000, 32), dtype=np.uint8)
    with psi_executor(2) as executor:
        inline = PSIParty("b", ["x"], secret=secret(0)).blinded_own()
        assert (party.blinded_own(executor=executor) == inline).all()
        with pytest.raises(ProtocolError, match="low-order curve point"):
            party.reblind(bad, executor=executor)


@pytest.mark.parametrize("u", LOW_ORDER)
def test_low_order_hash_is_remapped_deterministically(u: int) -> None:
    point = u.to_bytes(32, "little")
    out = scalarmult_chunk(secret(0), point + b"\x09" + bytes(31), True)
    expected = X25519PrivateKey.from_private_bytes(secret(0)).exchange(
        X25519PublicKey.from_public_bytes(remap_low_order(point)))
    assert out[:32] == expected and len(out) == 64
    with pytest.raises(ProtocolError, match="low-order"):
        scalarmult_chunk(secret(0), point, False)


def test_id_hashing_to_a_low_order_point_still_intersects(monkeypatch: pytest.MonkeyPatch) -> None:
    real = psi.hash_to_u

    def unlucky(texts: list[str], key: bytes | None = None) -> np.ndarray:
        u = real(texts, key)
        u[[t == "unlucky" for t in texts]] = 0
        return u

    monkeypatch.setattr(psi, "hash_to_u", unlucky)
    a, b = PSIParty("a", ["p", "unlucky", "q"]), PSIParty("b", ["unlucky", "r", "q"])
    rows, _ = run_psi([a, b], workers=1)
    assert sorted(zip(rows["a"].tolist(), rows["b"].tolist(), strict=True)) == [(1, 0), (2, 2)]


def test_duplicates_and_empty_inputs_are_refused_without_naming_ids() -> None:
    msg = ("PSI party 'bank' has 2 duplicate IDs among 5 rows (after normalisation); "
           "each row needs a unique ID")
    with pytest.raises(ParameterError, match=re.escape(msg)) as info:
        PSIParty("bank", ["alice", " ALICE", "bob", "Bob", "carol"])
    assert "alice" not in str(info.value).lower() and "bob" not in str(info.value).lower()
    empty = "PSI party 'shop' has no IDs; every party needs at least one ID"
    for ids in ([], pd.Series([], dtype=object)):
        with pytest.raises(ParameterError, match=re.escape(empty)):
            PSIParty("shop", ids)


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ParameterError, match=re.escape("PSI party 'a': the secret must be 32 bytes, got 16")):
        PSIParty("a", ["x"], secret=b"0" * 16)
    a = PSIParty("a", ["x"])
    with pytest.raises(ParameterError, match="at least 2 PSIParty objects, got 1"):
        run_psi([a])
    with pytest.raises(ParameterError, match="names must be unique"):
        run_psi([a, PSIParty("a", ["y"])])
    assert "x" not in repr(a) and repr(a) == "PSIParty('a', 1 rows)"


@pytest.mark.parametrize("values", [np.zeros((3, 31), np.uint8), np.zeros((3, 32), np.float64),
                                    np.zeros(32, np.uint8), np.zeros((2, 3, 32), np.uint8)])
def test_wrong_shaped_arrays_are_protocol_errors(values: np.ndarray) -> None:
    party = PSIParty("a", ["x", "y"])
    with pytest.raises(ProtocolError, match=r"expected blinded values as a \(m, 32\) uint8 array"):
        party.reblind(values)
    with pytest.raises(ProtocolError, match=r"expected blinded values as a \(m, 32\) uint8 array"):
        intersect_blinded({"a": party.blinded_own(), "b": values})


def test_master_and_party_refuse_corrupt_results() -> None:
    party = PSIParty("a", ["x", "y"])
    with pytest.raises(ProtocolError, match="no parties"):
        intersect_blinded({})
    with pytest.raises(ProtocolError, match="repeat 1 times"):
        intersect_blinded({"a": np.zeros((2, 32), np.uint8)})
    with pytest.raises(ProtocolError, match="outside its 2 rows"):
        party.rows_from_positions(np.array([0, 2]))
    with pytest.raises(ProtocolError, match="repeat a row"):
        party.rows_from_positions(np.array([1, 1]))
    with pytest.raises(ProtocolError, match="1-D integer array"):
        party.rows_from_positions(np.array([0.5]))
