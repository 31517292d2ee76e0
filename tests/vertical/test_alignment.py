"""ID alignment: the master's intersection of keyed hashes and each party's canonical row order.

And what crosses: a party receives its own row positions only.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from fedcore.errors import InputError, ProtocolError
from fedcore.privacy.hashing import hash_ids
from fedcore.protocol.messages import Message
from fedcore.transport.inprocess import InProcessTransport
from fedcore.vertical.alignment import AlignmentError, align_frame, check_overlap, intersect_hashes

KEY = b"consortium-key-for-tests-0123456789"
SIZES = {"bank": 700, "shop": 600, "insurer": 500}


def three_parties(seed: int = 0) -> dict[str, pd.DataFrame]:
    """Three parties holding random, partially overlapping subsets of 1000 customers, in random order."""
    rng = np.random.default_rng(seed)
    frames = {}
    for name, size in SIZES.items():
        ids = rng.choice(1000, size, replace=False)  # random subset, random order
        frames[name] = pd.DataFrame({"customer_id": [f"C{i:06d}" for i in ids], f"{name}_value": ids * 10.0})
    return frames


def digests(frames: dict[str, pd.DataFrame], key: bytes = KEY) -> dict[str, np.ndarray]:
    return {name: hash_ids(frame["customer_id"], key) for name, frame in frames.items()}


def test_aligned_frames_line_up_row_by_row_on_the_true_ids() -> None:
    frames = three_parties()
    plan = intersect_hashes(digests(frames))
    truth = set.intersection(*(set(f["customer_id"]) for f in frames.values()))
    assert plan.n_common == len(truth) > 0
    assert plan.counts == SIZES
    aligned = {name: align_frame(frame, plan.positions[name]) for name, frame in frames.items()}
    reference = aligned["bank"]["customer_id"]
    assert set(reference) == truth and reference.is_unique
    for name, frame in aligned.items():
        assert frame.index.tolist() == list(range(plan.n_common))
        assert frame["customer_id"].tolist() == reference.tolist()
        numbers = frame["customer_id"].str[1:].astype(int).to_numpy()
        assert (frame[f"{name}_value"].to_numpy() == numbers * 10.0).all()  # values travelled with their rows
    canonical = hash_ids(reference, KEY)
    assert (canonical[:-1] < canonical[1:]).all()  # sorted by digest


def test_canonical_order_does_not_depend_on_row_order_or_id_spelling() -> None:
    frames = three_parties()
    plan = intersect_hashes(digests(frames))
    expected = align_frame(frames["bank"], plan.positions["bank"])["customer_id"].tolist()
    respelled = dict(frames)
    shop = frames["shop"].sample(frac=1, random_state=7)
    respelled["shop"] = shop.assign(customer_id=" " + shop["customer_id"].str.lower() + " ")
    respelled["bank"] = frames["bank"].iloc[::-1]
    plan2 = intersect_hashes(digests(respelled))
    assert align_frame(respelled["bank"], plan2.positions["bank"])["customer_id"].tolist() == expected
    shop_ids = align_frame(respelled["shop"], plan2.positions["shop"])["customer_id"].str.strip().str.upper()
    assert shop_ids.tolist() == expected


def test_a_party_receives_only_its_own_positions_over_the_transport() -> None:
    frames = three_parties(seed=3)
    aligned: dict[str, pd.DataFrame] = {}

    def agent(name: str):
        def handle(message: Message) -> Message:
            if message.kind == "id_hashes":
                hashes = hash_ids(frames[name]["customer_id"], KEY)
                return Message("id_hashes", {"rows": len(hashes)},
                               {"hashes": hashes.view(np.uint8).reshape(-1, 32)})
            aligned[name] = align_frame(frames[name], message.arrays["positions"])
            return Message("ack")
        return handle

    transport = InProcessTransport({name: agent(name) for name in frames}, record_payloads=True)
    replies = transport.exchange({name: Message("id_hashes") for name in frames})
    plan = intersect_hashes({n: r.arrays["hashes"].reshape(-1, 32) for n, r in replies.items()})
    check_overlap(plan, min_overlap=10)
    transport.exchange({name: Message("align", {}, {"positions": plan.positions[name]}) for name in frames})

    assert len({tuple(a["customer_id"]) for a in aligned.values()}) == 1
    sent = {name: hash_ids(frame["customer_id"], KEY) for name, frame in frames.items()}
    for name in frames:
        received = [e for e in transport.transcript if e.receiver == name]
        assert [e.kind for e in received] == ["id_hashes", "align"]
        assert Message.from_bytes(received[1].payload).arrays.keys() == {"positions"}
        blob = b"".join(e.payload for e in received)
        others = [d.tobytes()[:12] for other, h in sent.items() if other != name for d in h]
        # no other party's digest, not even a prefix
        assert not [prefix for prefix in others if prefix in blob]
        own = [d.tobytes()[:12] for d in sent[name]]
        assert not [prefix for prefix in own if prefix in blob]  # nor its own: positions only


def test_digests_ending_in_nul_bytes_and_uint8_rows_are_handled() -> None:
    a = np.array([b"\x01" * 31 + b"\x00", b"\x02" * 32, b"\x03" * 30 + b"\x00\x00"], dtype="S32")
    b = np.array([b"\x03" * 30 + b"\x00\x00", b"\x01" * 31 + b"\x00", b"\x01" * 31 + b"\x07"], dtype="S32")
    plan = intersect_hashes({"a": a, "b": np.frombuffer(b.tobytes(), np.uint8).reshape(3, 32)})
    assert plan.n_common == 2
    assert [a[i].ljust(32, b"\0") for i in plan.positions["a"]] == [b[i].ljust(32, b"\0")
                                                                    for i in plan.positions["b"]]


def test_overlap_table() -> None:
    frames = three_parties()
    plan = intersect_hashes(digests(frames))
    table = plan.overlap_table()
    assert [row["institution"] for row in table] == list(SIZES)
    assert table[0] == {"institution": "bank", "rows": 700, "matched": plan.n_common,
                        "matched share": f"{100 * plan.n_common / 700:.1f}%"}


def test_empty_and_small_overlaps_are_refused_with_counts() -> None:
    a = pd.Series(["x", "y", "z"])
    b = pd.Series(["y", "z"])
    empty = intersect_hashes({"bank": hash_ids(a, KEY), "shop": hash_ids(b, KEY + b"other")})
    assert empty.n_common == 0 and all(len(p) == 0 for p in empty.positions.values())
    message = ("ID overlap is empty (bank 3 rows, shop 2 rows); check that every institution uses the same "
               "consortium key and the same kind of ID in its id_column")
    with pytest.raises(AlignmentError, match=re.escape(message)):
        check_overlap(empty, min_overlap=1)
    small = intersect_hashes({"bank": hash_ids(a, KEY), "shop": hash_ids(b, KEY)})
    with pytest.raises(AlignmentError, match=re.escape("only 2 rows overlap (fewer than min_overlap=5); "
                                                       "bank 3 rows, shop 2 rows")) as caught:
        check_overlap(small, min_overlap=5)
    assert isinstance(caught.value, InputError)
    check_overlap(small, min_overlap=2)


def test_a_small_overlap_gives_the_pairwise_overlaps_and_those_sharing_none_are_named() -> None:
    def ids(*numbers: int) -> np.ndarray:
        return hash_ids(pd.Series([f"C{i}" for i in numbers]), KEY)

    hashes = {"bank": ids(1, 2, 3, 4), "telco": ids(1, 2, 3, 9), "insurer": ids(3, 4, 9)}
    plan = intersect_hashes(hashes, explain_below=2)
    assert plan.n_common == 1 and plan.pairwise == {("bank", "telco"): 3, ("bank", "insurer"): 2,
                                                    ("telco", "insurer"): 2}
    with pytest.raises(AlignmentError) as refused:
        check_overlap(plan, min_overlap=2)
    assert str(refused.value) == ("only 1 rows overlap (fewer than min_overlap=2); bank 4 rows, telco 4 "
                                  "rows, insurer 3 rows; pairwise overlaps: bank-telco 3, bank-insurer 2, "
                                  "telco-insurer 2")
    assert intersect_hashes(hashes, explain_below=1).pairwise is None  # enough rows: nothing more counted
    # two of four with keys of their own are both named
    other = KEY + b"other"
    hashes = {"bank": ids(1, 2), "telco": ids(1, 2), "insurer": hash_ids(pd.Series(["C1"]), other),
              "retail": hash_ids(pd.Series(["C2"]), other + b"2")}
    with pytest.raises(AlignmentError) as refused:
        check_overlap(intersect_hashes(hashes), min_overlap=1)
    assert str(refused.value).endswith("; institutions 'insurer', 'retail' share no ID hash with any other "
                                       "institution (bank-telco share 2): their consortium key or id_column "
                                       "differs")
    # every one shares with another, but no row is held by all: the pairwise counts say where it is lost
    hashes = {"bank": ids(1, 2), "telco": ids(2, 3), "insurer": ids(3)}
    with pytest.raises(AlignmentError) as refused:
        check_overlap(intersect_hashes(hashes), min_overlap=1)
    assert str(refused.value) == ("ID overlap is empty (bank 2 rows, telco 2 rows, insurer 1 rows); pairwise "
                                  "overlaps: bank-telco 1, bank-insurer 0, telco-insurer 1")


def test_bad_hashes_and_positions_are_refused() -> None:
    h = hash_ids(pd.Series(["a", "b"]), KEY)
    with pytest.raises(AlignmentError, match="institution 'bank' sent 1 duplicate ID hashes"):
        intersect_hashes({"bank": np.concatenate([h, h[:1]]), "shop": h})
    with pytest.raises(ProtocolError, match="institution 'shop' sent ID hashes of dtype int64"):
        intersect_hashes({"bank": h, "shop": np.arange(3)})
    with pytest.raises(AlignmentError, match="no institutions"):
        intersect_hashes({})
    frame = pd.DataFrame({"v": [1, 2, 3]})
    with pytest.raises(ProtocolError, match="outside this party's 3 rows"):
        align_frame(frame, np.array([0, 3]))
    with pytest.raises(ProtocolError, match="repeat a row"):
        align_frame(frame, np.array([1, 1]))
    assert align_frame(frame, np.array([2, 0]))["v"].tolist() == [3, 1]
