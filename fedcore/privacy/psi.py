r"""ECDH private set intersection (PSI) over X25519: align IDs across institutions without revealing them.

Construction (commutative "Diffie-Hellman" PSI, Meadows 1986 / Huberman-Franklin-Hogg 1999)
--------------------------------------------------------------------------------------------
* Hash to the curve. Each ID is normalised exactly as in `fedcore.privacy.hashing` (NFKC, strip,
  casefold, integral numbers without ``.0``) and mapped to a 32-byte u-coordinate
  ``H(x) = SHA-256(TAG || id)``, or ``HMAC-SHA256(key, TAG || id)`` with the optional consortium key;
  ``TAG`` = ``b"fedforest/psi/v1/hash-to-u\0"`` separates this use from every other hash of an ID.
* Blind. Party i holds a random 32-byte secret k_i and sends ``X25519(k_i, H(x))``. X25519 is scalar
  multiplication on the Montgomery u-line with the clamped scalar c_i (low three bits cleared, bit 254 set),
  so ``X25519(k_j, X25519(k_i, u)) = u(c_j c_i P) = X25519(k_i, X25519(k_j, u))``: values blinded by
  every party's scalar match exactly when the IDs match (distinct IDs collide with probability ~2**-248 a
  pair).
* Any 32-byte string is a safe input: RFC 7748 decoding masks bit 255 and reduces mod p; a u-coordinate
  lies either on Curve25519 (order 8*l) or on its quadratic twist (order 4*l'), both with large prime
  subgroups (Curve25519 is twist-secure), so no invalid-curve attack exists and H need not land on the curve.
  Clamping makes the scalar a multiple of the cofactor 8, which removes any small-order component:
  blinded values lie in a prime-order subgroup.
* Low-order points. The few u values of order dividing 8 (0, 1, p-1, two points of order 8, and
  non-canonical encodings such as p and p+1) give the all-zero output, which ``cryptography`` refuses.
  A hashed ID lands there with probability ~2**-250; if it ever does, that u is replaced by
  ``SHA-256(b"fedforest/psi/v1/low-order-remap\0" || u)`` (repeated if needed), a function of the ID
  only, so every party maps the ID alike and nothing crashes. A value to *re-blind* that is low-order
  cannot come from an honest party and raises `ProtocolError`.

Protocol for M >= 2 parties through the master (`run_psi` drives it in-process; sizes for n_i rows)
------------------------------------------------------------------------------------------------------
1. party i -> master: ``B_i = X25519(k_i, H(x))`` for its IDs, sorted by value (``pi_i``, the order
   that sorts them: `PSIParty.outgoing`), 32 n_i bytes.
2. rounds r = 1 .. M-1, all lists at once: master -> party (i+r) mod M: owner i's list (32 n_i bytes);
   that party applies its scalar (`PSIParty.reblind`) and returns the list in the same order (32 n_i).
   After M-1 rounds every list carries every party's scalar exactly once.
3. master: `intersect_blinded` on the fully blinded lists; master -> party i: int64 positions into the
   list it sent, in canonical order (sorted by fully blinded value), 8 |intersection| bytes. Party i maps
   them to its row numbers (`PSIParty.rows_from_positions`); the i-th position is the same ID at every
   party, which is the aligned row order vertical training needs (as `fedcore.vertical.alignment`).
Each party sends 32 * sum_j n_j bytes and receives 32 * sum_{j != i} n_j + 8 |intersection| bytes; M round
trips. Two parties without a master: A plays the master's part for B's list (B re-blinds A's list in A's
order and sends its own sorted list; A re-blinds it, intersects, and returns B's positions).

Security (semi-honest parties and master, no collusion; DDH hard in Curve25519's prime-order groups)
----------------------------------------------------------------------------------------------------
* A party sees other parties' lists only partially blinded, each with a different set of scalars, so
  under DDH they look random and cannot be compared with anything it holds. It learns the sizes n_j and,
  from the master, which of its OWN rows are in the global intersection (hence its size).
* The master sees only blinded values it cannot invert or test guesses against (it knows no scalar). It
  learns every n_i and the intersection size, and, because it compares fully blinded lists, also the size
  of every sub-intersection (e.g. |A and B but not C|) when M > 2. The send orders pi_i hide which rows
  matched from the master (positions index the sent lists), so row order (e.g. sorted by customer or by
  date) leaks nothing: a list sorted by its own blinded values is a function of the set of values the
  master receives anyway, so its order carries nothing about the rows' order; it is as good as the secret
  random permutation it replaced (issue #29), and a party on Dask makes it per key range on its workers
  without ever holding the whole list (`fedcore.compute.dask_psi`). The canonical order depends on all
  secrets: no single party chooses it.
* Without the key, H is public: a party or outsider holding a party's scalar could test guessed IDs;
  with the consortium key, nobody outside the consortium can even form H(x), so a leaked scalar or a
  recorded transcript cannot be tested against guessed IDs (e.g. phone numbers) by outsiders. All
  parties must use the same key (or none), else the intersection is empty.
* Not covered, inherent to PSI: a party may input made-up IDs to probe whether they are members;
  malicious deviations (wrong scalar, dropping values) are not detected; a party colluding with the
  master learns the sub-intersection structure the master sees. Secrets are fresh per run by default;
  reusing a secret across runs lets the runs' transcripts be linked.
"""

from __future__ import annotations

import hashlib
import hmac
import multiprocessing
import os
import secrets as _secrets
import time
from collections.abc import Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedcore.errors import ParameterError, ProtocolError
from fedcore.privacy._x25519_batch import POINT_SIZE, scalarmult_chunk
from fedcore.privacy.hashing import _check_key, _normalized_list

BLINDED_SIZE = POINT_SIZE
SECRET_SIZE = 32
HASH_TAG = b"fedforest/psi/v1/hash-to-u\x00"
_CHUNK_ROWS = 20_000  # ~1 s of work: small enough that the phase barriers leave cores idle only briefly
_MIN_CHUNK_ROWS = 1_000
_MIN_PARALLEL_OPS = 40_000  # below ~2 s of X25519 work, starting worker processes costs more than it saves
_BLINDED_DTYPE = np.dtype(f"S{BLINDED_SIZE}")


@dataclass(frozen=True)
class PSIMessage:
    """One message of the protocol as recorded by `run_psi` (payload exactly as it crosses the wire)."""

    sender: str
    receiver: str
    kind: str  # "blinded", "reblind", "reblinded" or "positions"
    owner: str  # the party whose list (or result) this is
    payload: np.ndarray

    @property
    def nbytes(self) -> int:
        """Bytes of the payload."""
        return int(self.payload.nbytes)


def hash_to_u(texts: Sequence[str], key: bytes | None = None) -> np.ndarray:
    """``(n, 32) uint8`` u-coordinates of normalised IDs.

    SHA-256(TAG || id), or HMAC-SHA256(key, TAG || id).
    """
    if key is None:
        base = hashlib.sha256(HASH_TAG).copy
        digests = []
        for text in texts:
            h = base()
            h.update(text.encode())
            digests.append(h.digest())
    else:
        mac = hmac.new(_check_key(key), HASH_TAG, "sha256").copy
        digests = []
        for text in texts:
            keyed = mac()
            keyed.update(text.encode())
            digests.append(keyed.digest())
    return np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(-1, BLINDED_SIZE).copy()


def _party_texts(name: str, ids: pd.Series | Sequence) -> list[str]:
    """A party's normalised IDs, refusing empty inputs and duplicates (by count, never naming an ID)."""
    series = ids if isinstance(ids, pd.Series) else pd.Series(list(ids), dtype=object)
    if len(series) == 0:
        raise ParameterError(f"PSI party {name!r} has no IDs; every party needs at least one ID")
    texts = _normalized_list(series)
    refuse_duplicates(name, len(texts) - len(set(texts)), len(texts))
    return texts


def refuse_duplicates(name: str, n_dup: int, n_rows: int) -> None:
    """Refuse a party with `n_dup` repeated IDs among `n_rows` (by count, never naming an ID)."""
    if n_dup:
        raise ParameterError(f"PSI party {name!r} has {n_dup} duplicate IDs among {n_rows} rows "
                             "(after normalisation); each row needs a unique ID")


def new_secret() -> bytes:
    """A fresh blinding secret (what `PSIParty` draws when it is given none)."""
    return _secrets.token_bytes(SECRET_SIZE)


def blinded_ids(ids: pd.Series, key: bytes | None, secret: bytes) -> np.ndarray:
    """``(n, 32) uint8`` X25519(secret, H(id)) of `ids` in row order, repeats not checked.

    What `PSIParty.blinded_own` computes, for one block of a party's IDs blinded where the block is (its
    own Dask workers, `fedcore.compute.dask_psi`, which refuses repeated IDs there).
    """
    return _Pending(scalarmult_chunk(secret, hash_to_u(_normalized_list(ids), key).tobytes(), True)).result()


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise ParameterError(f"a PSI party needs a non-empty name, got {name!r}")
    return name


def _check_secret(name: str, secret: bytes | None) -> bytes:
    if secret is None:
        return new_secret()
    if not isinstance(secret, (bytes, bytearray)) or len(secret) != SECRET_SIZE:
        size = len(secret) if isinstance(secret, (bytes, bytearray)) else type(secret).__name__
        raise ParameterError(f"PSI party {name!r}: the secret must be {SECRET_SIZE} bytes, got {size}")
    return bytes(secret)


def as_blinded(values: np.ndarray, what: str) -> np.ndarray:
    """`values` as a C-contiguous ``(m, 32) uint8`` array, else a ProtocolError saying what arrived."""
    arr = np.asarray(values)
    if arr.dtype != np.uint8 or arr.ndim != 2 or arr.shape[1] != BLINDED_SIZE:
        raise ProtocolError(f"{what}: expected blinded values as a (m, {BLINDED_SIZE}) uint8 array, "
                            f"got {arr.dtype}{list(arr.shape)}")
    return np.ascontiguousarray(arr)


def _chunk_rows(n: int) -> int:
    """Rows per worker task: at most 20k, small inputs in about 8 tasks."""
    return min(_CHUNK_ROWS, max(_MIN_CHUNK_ROWS, -(-n // 8)))


class _Pending:
    """Blinded values being computed (in worker processes or already done); `result()` waits for them."""

    def __init__(self, parts: list[Future] | bytes) -> None:
        self._parts = parts

    def result(self) -> np.ndarray:
        data = self._parts if isinstance(self._parts, bytes) else b"".join(f.result() for f in self._parts)
        return np.frombuffer(data, dtype=np.uint8).reshape(-1, BLINDED_SIZE).copy()


def _start(secret: bytes, values: np.ndarray, executor: Executor | None, remap: bool) -> _Pending:
    """Start X25519(secret, .) on every row, chunked over `executor` (or inline when it is None)."""
    data = values.tobytes()
    if executor is None:
        return _Pending(scalarmult_chunk(secret, data, remap))
    step = _chunk_rows(len(values)) * BLINDED_SIZE
    return _Pending([executor.submit(scalarmult_chunk, secret, data[i:i + step], remap)
                     for i in range(0, len(data), step)])


class PSIParty:
    """One institution in ECDH-PSI: hashes its IDs at construction and blinds/re-blinds with its secret."""

    def __init__(self, name: str, ids: pd.Series | Sequence, *, key: bytes | None = None,
                 secret: bytes | None = None) -> None:
        """Hash this party's IDs now; `secret` blinds them later (a fresh one when None)."""
        texts = _party_texts(_check_name(name), ids)
        self._start_party(name, len(texts), _check_secret(name, secret), hash_to_u(texts, key), None)

    def _start_party(self, name: str, n_rows: int, secret: bytes, u: np.ndarray,
                     blinded: np.ndarray | None) -> None:
        self.name, self.n_rows, self._secret, self._u = name, n_rows, secret, u
        self._blinded: np.ndarray | None = blinded
        self._order: np.ndarray | None = None

    def __repr__(self) -> str:  # never show IDs or the secret
        """The name and row count only."""
        return f"PSIParty({self.name!r}, {self.n_rows} rows)"

    def _start_blinding(self, executor: Executor | None) -> _Pending:
        return _start(self._secret, self._u, executor, remap=True)

    def _start_reblind(self, values: np.ndarray, executor: Executor | None) -> _Pending:
        values = as_blinded(values, f"PSI party {self.name!r} asked to re-blind")
        return _start(self._secret, values, executor, remap=False)

    def blinded_own(self, *, executor: Executor | None = None) -> np.ndarray:
        """``(n, 32) uint8`` X25519(k, H(id)) of its own IDs in row order (computed once, then cached)."""
        if self._blinded is None:
            self._blinded = self._start_blinding(executor).result()
        return self._blinded

    def reblind(self, values: np.ndarray, *, executor: Executor | None = None) -> np.ndarray:
        """Apply this party's scalar to another party's ``(m, 32) uint8`` values, keeping their order."""
        return self._start_reblind(values, executor).result()

    def send_order(self) -> np.ndarray:
        """The permutation of row numbers in which this party sends its list: its blinded values sorted.

        A function of the values sent alone, so it tells nothing about the rows' order (module doc).
        """
        if self._order is None:
            self._order = np.argsort(self.blinded_own().view(_BLINDED_DTYPE).ravel(), kind="stable")
        return self._order

    def outgoing(self, *, executor: Executor | None = None) -> np.ndarray:
        """What this party sends to start the protocol: `blinded_own` rows in the secret `send_order`."""
        return self.blinded_own(executor=executor)[self.send_order()]

    def rows_from_positions(self, positions: np.ndarray) -> np.ndarray:
        """Map the master's positions (into the `outgoing` list) to this party's row numbers, order kept."""
        return self.send_order()[checked_positions(self.name, positions, self.n_rows)]


def checked_positions(name: str, positions: np.ndarray, n_rows: int) -> np.ndarray:
    """The master's positions into a party's sent list of `n_rows` as int64, else a ProtocolError.

    A 1-D integer array, each position in range and none repeated.
    """
    pos = np.asarray(positions)
    if pos.ndim != 1 or (pos.size and pos.dtype.kind not in "iu"):
        raise ProtocolError(f"PSI party {name!r}: positions must be a 1-D integer array, "
                            f"got {pos.dtype}{list(pos.shape)}")
    pos = pos.astype(np.int64, copy=False)
    if pos.size and (pos.min() < 0 or pos.max() >= n_rows):
        raise ProtocolError(f"PSI party {name!r}: positions run from {pos.min()} to {pos.max()}, "
                            f"outside its {n_rows} rows")
    if len(np.unique(pos)) != len(pos):
        raise ProtocolError(f"PSI party {name!r}: positions repeat a row")
    return pos


def _sorted_digests(name: str, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One party's fully blinded values as sorted ``S32`` plus the sorting permutation; refuses repeats."""
    digests = as_blinded(values, f"fully blinded values of {name!r}").view(_BLINDED_DTYPE).ravel()
    order = np.argsort(digests, kind="stable")
    ordered = digests[order]
    n_dup = int(np.count_nonzero(ordered[1:] == ordered[:-1]))
    if n_dup:
        raise ProtocolError(f"the fully blinded values of {name!r} repeat {n_dup} times; "
                            "distinct IDs always give distinct values, so a party sent a corrupt list")
    return ordered, order


def _intersect_sorted(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The values of sorted, duplicate-free `a` that also occur in sorted `b`, sorted."""
    if len(a) == 0 or len(b) == 0:
        return a[:0]
    idx = np.minimum(np.searchsorted(b, a), len(b) - 1)
    return a[b[idx] == a]


def intersect_blinded(fully_blinded: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Master side: per party, int64 positions of its rows in the intersection.

    In canonical (sorted) order.
    """
    if not fully_blinded:
        raise ProtocolError("no parties' fully blinded values to intersect")
    ordered, order = {}, {}
    for name, values in fully_blinded.items():
        ordered[name], order[name] = _sorted_digests(name, values)
    names = sorted(ordered, key=lambda n: len(ordered[n]))  # smallest first keeps the running set small
    common = ordered[names[0]]
    for name in names[1:]:
        common = _intersect_sorted(common, ordered[name])
    return {name: order[name][np.searchsorted(ordered[name], common)].astype(np.int64) for name in ordered}


def _check_parties(parties: list[PSIParty]) -> None:
    if len(parties) < 2 or not all(isinstance(p, PSIParty) for p in parties):
        raise ParameterError(f"run_psi needs at least 2 PSIParty objects, got {len(parties)}")
    names = [p.name for p in parties]
    if len(set(names)) != len(names):
        raise ParameterError(f"PSI party names must be unique, got {names}")


def _usable_cores() -> int:
    """CPU cores this process may run on (respects CPU affinity masks)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def psi_executor(workers: int | None = None) -> ProcessPoolExecutor:
    """A process pool for `blinded_own` / `reblind` (``executor=``).

    It has `workers` processes (default: all cores).

    Forkserver start: safe beside threads (Prefect, Flight); the calling script needs the usual
    ``if __name__ == "__main__":`` guard. Use it as a context manager so the workers stop afterwards.
    """
    workers = _usable_cores() if workers is None else int(workers)
    if workers < 1:
        raise ParameterError(f"workers must be at least 1, got {workers}")
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("forkserver"))


def _make_executor(workers: int | None, n_ops: int) -> ProcessPoolExecutor | None:
    """`psi_executor(workers)`, or None (inline) for a single worker.

    Also None for too little work to pay for processes.
    """
    n_workers = _usable_cores() if workers is None else int(workers)
    if n_workers <= 1 or n_ops < _MIN_PARALLEL_OPS:
        return None
    return psi_executor(n_workers)


class _Wire:
    """In-process stand-in for the transport: records messages and counts bytes per party."""

    def __init__(self, names: list[str], record: list[PSIMessage] | None) -> None:
        self.record = record
        self.sent = dict.fromkeys(names, 0)
        self.received = dict.fromkeys(names, 0)

    def send(self, sender: str, receiver: str, kind: str, owner: str, payload: np.ndarray) -> np.ndarray:
        if sender in self.sent:
            self.sent[sender] += payload.nbytes
        if receiver in self.received:
            self.received[receiver] += payload.nbytes
        if self.record is not None:
            self.record.append(PSIMessage(sender, receiver, kind, owner, payload.copy()))
        return payload


def _round_robin(parties: list[PSIParty], wire: _Wire, executor: Executor | None,
                 clock: dict[str, float]) -> dict[str, np.ndarray]:
    """Steps 1-2 of the protocol: every list goes once through every other party; the fully blinded lists."""
    m, start = len(parties), time.perf_counter()
    pending = {p.name: p._start_blinding(executor) for p in parties if p._blinded is None}
    lists = {}
    for p in parties:
        if p.name in pending:
            p._blinded = pending[p.name].result()
        lists[p.name] = wire.send(p.name, "master", "blinded", p.name, p.outgoing())
    clock["blind"] = time.perf_counter() - start
    for r in range(1, m):
        reblinding = {}
        for i, owner in enumerate(parties):
            holder = parties[(i + r) % m]
            values = wire.send("master", holder.name, "reblind", owner.name, lists[owner.name])
            reblinding[owner.name] = (holder, holder._start_reblind(values, executor))
        for name, (holder, job) in reblinding.items():
            lists[name] = wire.send(holder.name, "master", "reblinded", name, job.result())
    clock["reblind"] = time.perf_counter() - start - clock["blind"]
    return lists


def run_psi(parties: list[PSIParty], *, workers: int | None = None,
            record: list[PSIMessage] | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """Run the round-robin PSI in-process; per party, its row numbers in the intersection in canonical order.

    `workers` processes share the X25519 work (default: all cores; 1, or under ~40k multiplications:
    inline), started as in `psi_executor`. If `record` is a list, every message is appended to it as a
    `PSIMessage`. Stats: rounds (master<->party round trips, = M), n_common, rows, bytes_sent and
    bytes_received per party, master_bytes_sent, seconds, seconds_by_step (blind, reblind, intersect).
    """
    _check_parties(parties)
    wire = _Wire([p.name for p in parties], record)
    clock: dict[str, float] = {}
    start = time.perf_counter()
    executor = _make_executor(workers, len(parties) * sum(p.n_rows for p in parties))
    try:
        lists = _round_robin(parties, wire, executor, clock)
    finally:
        if executor is not None:
            executor.shutdown(cancel_futures=True)
    mark = time.perf_counter()
    found = intersect_blinded(lists)
    clock["intersect"] = time.perf_counter() - mark
    rows = {p.name: p.rows_from_positions(wire.send("master", p.name, "positions", p.name, found[p.name]))
            for p in parties}
    stats = {"rounds": len(parties), "n_common": len(found[parties[0].name]),
             "rows": {p.name: p.n_rows for p in parties}, "bytes_sent": wire.sent,
             "bytes_received": wire.received, "master_bytes_sent": sum(wire.received.values()),
             "seconds": time.perf_counter() - start, "seconds_by_step": clock}
    return rows, stats
