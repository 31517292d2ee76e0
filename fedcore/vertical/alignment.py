"""ID alignment for vertical federation: the master intersects keyed ID hashes, each party reorders its rows.

Party side: send `hash_ids(ids, key)` (as ``uint8`` rows of 32 bytes in a Message), receive positions,
call `align_frame`. Master side: `intersect_hashes`, then `check_overlap`, then send each party only
``plan.positions[party]``.

The common rows are put in one canonical order, sorted by digest, so every party lines up row by row
without anyone choosing the order. What each side learns: the master (no key) sees digests and every
party's row count and the intersection size; a party receives only the positions of its own rows
that are in the intersection (hence which of its own IDs are shared, and how many), never another
party's digests or anything about IDs outside the intersection. Because digests are keyed, the
canonical order is a keyed pseudo-random permutation, not an order of the raw IDs.

When the intersection is empty or below `min_overlap`, the master also counts how many digests each pair of
institutions shares (`pairwise_overlaps`: counts it could compute from what it holds anyway, no new message,
no ID) to name an institution that shares none with any other: its consortium key or ID column differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedcore.errors import InputError, ProtocolError
from fedcore.privacy.hashing import DIGEST_SIZE

_DIGEST_DTYPE = np.dtype(f"S{DIGEST_SIZE}")


class AlignmentError(InputError):
    """The institutions' IDs cannot be aligned: too little overlap, or a party's IDs are not unique."""


@dataclass(frozen=True)
class AlignmentPlan:
    """The intersection size, each party's row count, and each party's row positions in canonical order."""

    n_common: int
    counts: dict[str, int]
    positions: dict[str, np.ndarray]
    pairwise: dict[tuple[str, str], int] | None = None
    """With three or more institutions and an intersection below the threshold `intersect_hashes` was given:
    the digests each pair shares (counts only), to name an institution that shares none; else None."""

    def overlap_table(self) -> list[dict[str, object]]:
        """One row per institution (rows, matched, matched share) for a Prefect table artifact."""
        return [
            {"institution": name, "rows": rows, "matched": self.n_common,
             "matched share": f"{100 * self.n_common / rows:.1f}%" if rows else "-"}
            for name, rows in self.counts.items()
        ]


def _as_digests(name: str, hashes: np.ndarray) -> np.ndarray:
    """A party's digests as a 1-D ``S32`` array (accepts ``S32`` or ``uint8`` rows of 32 bytes)."""
    hashes = np.asarray(hashes)
    if hashes.dtype == np.uint8 and hashes.ndim == 2 and hashes.shape[1] == DIGEST_SIZE:
        return np.ascontiguousarray(hashes).view(_DIGEST_DTYPE).ravel()
    if hashes.ndim == 1 and hashes.dtype.kind == "S" and hashes.dtype.itemsize <= DIGEST_SIZE:
        return hashes.astype(_DIGEST_DTYPE, copy=False)
    raise ProtocolError(f"institution {name!r} sent ID hashes of dtype {hashes.dtype} and shape "
                        f"{hashes.shape}; expected {DIGEST_SIZE}-byte digests (S{DIGEST_SIZE}, or uint8 rows "
                        f"of {DIGEST_SIZE})")


def _intersect_sorted(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Common values of two sorted, duplicate-free arrays, sorted."""
    if len(a) > len(b):
        a, b = b, a
    if len(b) == 0:
        return a[:0]
    idx = np.minimum(np.searchsorted(b, a), len(b) - 1)
    return a[b[idx] == a]


def intersect_hashes(hashes_by_party: Mapping[str, np.ndarray], explain_below: int = 1) -> AlignmentPlan:
    """Master side: intersect the parties' ID digests and give each party its rows in canonical order.

    An intersection of fewer than `explain_below` rows (pass `min_overlap`) among three or more parties also
    gets the pairwise overlaps (`AlignmentPlan.pairwise`), which `check_overlap` uses to say who differs.
    """
    if not hashes_by_party:
        raise AlignmentError("no institutions' ID hashes to intersect")
    order, ordered = {}, {}
    for name, hashes in hashes_by_party.items():
        digests = _as_digests(name, hashes)
        order[name] = np.argsort(digests, kind="stable")
        ordered[name] = digests[order[name]]
        n_dup = int(np.count_nonzero(ordered[name][1:] == ordered[name][:-1]))
        if n_dup:
            raise AlignmentError(f"institution {name!r} sent {n_dup} duplicate ID hashes; each row needs a "
                                 "unique ID (hash IDs with fedcore.privacy.hashing.hash_ids)")
    names = sorted(ordered, key=lambda n: len(ordered[n]))  # smallest first keeps the running set small
    common = ordered[names[0]]
    for name in names[1:]:
        common = _intersect_sorted(common, ordered[name])
    positions = {name: order[name][np.searchsorted(ordered[name], common)].astype(np.int64)
                 for name in hashes_by_party}
    pairwise = (_pairwise_sorted(ordered) if len(common) < explain_below and len(ordered) > 2 else None)
    return AlignmentPlan(n_common=len(common), counts={n: len(o) for n, o in ordered.items()},
                         positions=positions, pairwise=pairwise)


def pairwise_overlaps(hashes_by_party: Mapping[str, np.ndarray]) -> dict[tuple[str, str], int]:
    """How many digests (or fully blinded PSI values) each pair of parties shares, in the parties' order.

    Counts only: what a master holding every party's digests can compute anyway.
    """
    return _pairwise_sorted({name: np.unique(_as_digests(name, hashes))
                             for name, hashes in hashes_by_party.items()})


def _pairwise_sorted(ordered: Mapping[str, np.ndarray]) -> dict[tuple[str, str], int]:
    """`pairwise_overlaps` of sorted, duplicate-free digest arrays."""
    names = list(ordered)
    return {(a, b): len(_intersect_sorted(ordered[a], ordered[b]))
            for i, a in enumerate(names) for b in names[i + 1:]}


def check_overlap(plan: AlignmentPlan, min_overlap: int) -> None:
    """Refuse to train or predict on an empty or too small intersection, naming each institution's count.

    With the plan's pairwise overlaps, it names the institutions that share no ID with any other (their
    consortium key or ID column differs), or else gives the pairwise counts.
    """
    counts = ", ".join(f"{name} {rows} rows" for name, rows in plan.counts.items())
    pairwise = _pairwise_reading(plan.pairwise)
    if plan.n_common == 0:
        raise AlignmentError(f"ID overlap is empty ({counts}); " + (pairwise or (
            "check that every institution uses the same consortium key and the same kind of ID in its "
            "id_column")))
    if plan.n_common < min_overlap:
        raise AlignmentError(f"only {plan.n_common} rows overlap (fewer than min_overlap={min_overlap}); "
                             f"{counts}" + (f"; {pairwise}" if pairwise else ""))


def _pairwise_reading(pairwise: dict[tuple[str, str], int] | None) -> str | None:
    """What the pairwise overlaps say; None without them, or when no two institutions share an ID.

    When some pair shares IDs, an institution in no such pair stands out: every other institution shares
    IDs with someone under the same key, so its key or ID column is the one that differs. When every
    institution shares with some other, the pairwise counts themselves say where the overlap is lost.
    """
    if not pairwise or not any(pairwise.values()):
        return None
    names = list(dict.fromkeys(name for pair in pairwise for name in pair))
    shared = {pair: n for pair, n in pairwise.items() if n}
    alone = [name for name in names if not any(name in pair for pair in shared)]
    if not alone:
        return "pairwise overlaps: " + ", ".join(f"{a}-{b} {n}" for (a, b), n in pairwise.items())
    who = (f"institution {alone[0]!r} shares" if len(alone) == 1
           else f"institutions {', '.join(map(repr, alone))} share")
    listed = ", ".join(f"{a}-{b} share {n}" for (a, b), n in shared.items())
    return (f"{who} no ID hash with any other institution ({listed}): "
            f"{'its' if len(alone) == 1 else 'their'} consortium key or id_column differs")


def align_frame(frame: pd.DataFrame, positions: np.ndarray) -> pd.DataFrame:
    """Party side: this party's rows in the canonical order the master sent (a fresh 0..n-1 index)."""
    return frame.iloc[check_positions(positions, len(frame))].reset_index(drop=True)


def check_positions(positions: np.ndarray, n_rows: int) -> np.ndarray:
    """The master's alignment positions as int64 row numbers of a party's `n_rows`, or ProtocolError.

    A 1-D integer array, every position a row of the party's table, none repeated.
    """
    check = PositionsCheck(n_rows)
    positions = check.add(positions)
    check.finish()
    return positions


class PositionsCheck:
    """`check_positions` part by part: positions arriving in parts (issue #29), none repeated across them."""

    def __init__(self, n_rows: int) -> None:
        """No position seen yet, of a party's `n_rows`."""
        self.n_rows = n_rows
        self._seen = np.zeros(n_rows, bool)  # 1 B a row, no sorted copy of 8 (issue #29: the agent's memory)
        self.count = 0

    def add(self, positions: np.ndarray) -> np.ndarray:
        """The next part of the positions as int64 row numbers, or ProtocolError."""
        positions = np.asarray(positions)
        if positions.ndim != 1 or (positions.size and positions.dtype.kind not in "iu"):
            raise ProtocolError("alignment positions must be a 1-D integer array, got "
                                f"{positions.dtype}{list(positions.shape)}")
        positions = positions.astype(np.int64, copy=False)
        if positions.size and (positions.min() < 0 or positions.max() >= self.n_rows):
            raise ProtocolError(f"alignment positions run from {positions.min()} to {positions.max()}, "
                                f"outside this party's {self.n_rows} rows")
        if self.count and self._seen[positions].any():  # a row of an earlier part
            raise ProtocolError(_REPEATED)
        self._seen[positions] = True
        self.count += len(positions)
        return positions

    def finish(self) -> None:
        """After the last part: refuse positions repeated within a part (the bitmap counts each row once)."""
        if np.count_nonzero(self._seen) != self.count:
            raise ProtocolError(_REPEATED)


_REPEATED = "alignment positions repeat a row; each row may appear once"
