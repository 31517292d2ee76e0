"""What every horizontal party holds whatever its algorithm: its own rows and labels, which open node each
row sits in, the current level's candidate splits, and per-branch counting over them.

Federated Extra-Trees (`party.py`) and PPD-ERT (`ppdert.py`) parties each hold a `PartyRows` and add their
own protocol on top; neither inherits the other's handlers. Also shared: the session check of `hello`
(`check_hello`) and taking the finished forest (`receive_model`).

All row work is vectorised NumPy over (tree, row) entries, chunked to bound memory.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedcore.errors import ProtocolError
from fedcore.horizontal.model import HorizontalForest
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.protocol.messages import Message

CHUNK_ELEMENTS = 1 << 21
"""Upper bound on (entries x candidates [x bits]) processed at once."""


class RowPartition:
    """Which open node of the current level each row sits in, per tree of the batch (-1: in a leaf)."""

    def __init__(self, n_rows: int) -> None:
        self.n_rows = n_rows
        self.pos = np.zeros((0, n_rows), dtype=np.int32)
        self.n_open = 0
        self._entries: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def reset(self, n_trees: int) -> None:
        """A new batch: every row sits in the root of every tree; root t is open node t."""
        self.pos = np.repeat(np.arange(n_trees, dtype=np.int32)[:, None], self.n_rows, axis=1)
        self.n_open = n_trees
        self._entries = None

    def entries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tree slot, row, open-node position) of every row that sits in an open node (cached per level)."""
        if self._entries is None:
            flat = np.flatnonzero(self.pos.reshape(-1) >= 0)
            slot, rows = np.divmod(flat, self.n_rows)
            self._entries = (slot, rows, self.pos.reshape(-1)[flat].astype(np.int64))
        return self._entries

    def apply(self, X: np.ndarray, chosen: np.ndarray, next_pos: np.ndarray,
              features: np.ndarray, thresholds: np.ndarray) -> None:
        """Move rows into the children of the nodes that split (`chosen` candidate) and out of the others."""
        chosen = chosen.astype(np.int64)
        next_pos = next_pos.astype(np.int64)
        if len(chosen) != self.n_open or len(next_pos) != 2 * int((chosen >= 0).sum()):
            raise ProtocolError(f"split decisions for {len(chosen)} nodes and {len(next_pos)} children do not match "
                                f"the {self.n_open} open nodes of the previous level")
        slot, rows, p = self.entries()
        c = chosen[p]
        split = c >= 0
        rank = np.cumsum(chosen >= 0) - 1
        new = np.full(len(p), -1, dtype=np.int64)
        ps, cs, rs = p[split], c[split], rows[split]
        right = ~(X[rs, features[ps, cs]] <= thresholds[ps, cs])  # NaN goes right
        new[split] = next_pos[2 * rank[ps] + right]
        self.pos[slot, rows] = new
        self._entries = None
        self.n_open = int(next_pos.max()) + 1 if len(next_pos) else 0

    def active_slots_per_row(self) -> int:
        """The most trees any single row is active in (for per-row privacy accounting)."""
        return int((self.pos >= 0).sum(axis=0).max()) if self.pos.size else 0


def chunks(n: int, width: int):
    """Slices over n entries so that entries x width stays under CHUNK_ELEMENTS."""
    step = max(1, CHUNK_ELEMENTS // max(width, 1))
    for start in range(0, n, step):
        yield slice(start, min(start + step, n))


def branch_codes(X: np.ndarray, rows: np.ndarray, p: np.ndarray, features: np.ndarray,
                 thresholds: np.ndarray) -> np.ndarray:
    """(node position * k + candidate) * 2 + branch for every entry and candidate: (m, k) int64."""
    k = features.shape[1]
    values = X[rows[:, None], features[p]]
    right = ~(values <= thresholds[p])
    return (p[:, None] * k + np.arange(k)) * 2 + right


class PartyRows:
    """One horizontal party's rows (encoded with the agreed schema), their labels, the row partition of the
    current tree batch and the current level's candidates (features and thresholds, (open nodes, k))."""

    def __init__(self, name: str, frame: pd.DataFrame, schema: HorizontalSchema) -> None:
        self.name = name
        self.schema = schema
        self.X = schema.encode(frame)
        self.y = schema.encode_labels(frame[schema.label])
        self.n_rows = len(self.X)
        self.partition = RowPartition(self.n_rows)
        self.features = np.zeros((0, 0), np.int64)
        self.thresholds = np.zeros((0, 0))
        self._in_batch = False

    def clear(self) -> None:
        """No batch in progress (a new session, or the finished model)."""
        self.partition = RowPartition(self.n_rows)
        self._in_batch = False

    def start_level(self, header: dict, arrays: dict[str, np.ndarray], n_open: int) -> None:
        """A level's request: reset the partition on a new batch (`new_batch`, `n_trees`), or apply the
        previous level's decisions (`chosen`, `next_pos`); the request must cover the `n_open` nodes then open."""
        if header.get("new_batch"):
            n_trees = int(header["n_trees"])
            if n_trees != n_open:  # checked before the partition (n_trees x rows) is allocated
                raise ProtocolError(f"party {self.name!r}: a new batch of {n_trees} trees, but the request covers "
                                    f"{n_open} open nodes")
            self.partition.reset(n_trees)
            self._in_batch = True
        elif not self._in_batch:
            raise ProtocolError(f"party {self.name!r}: a level of a tree batch that was never started (the first "
                                "level of a batch carries new_batch)")
        else:
            self.partition.apply(self.X, arrays["chosen"], arrays["next_pos"], self.features, self.thresholds)
        if n_open != self.partition.n_open:
            raise ProtocolError(f"party {self.name!r}: the request covers {n_open} open nodes, "
                                f"{self.partition.n_open} are open")

    def branch_codes(self, width: int):
        """(rows, branch codes) of every row in an open node, chunk by chunk (chunks sized for `width`
        values per entry): codes are (node position * k + candidate) * 2 + branch, (m, k) int64."""
        _, rows, p = self.partition.entries()
        for part in chunks(len(rows), width):
            yield rows[part], branch_codes(self.X, rows[part], p[part], self.features, self.thresholds)

    def class_counts(self) -> np.ndarray:
        """Exact per-branch class counts of every candidate of every open node: (A, k, 2, C) int64."""
        n_open, k = self.features.shape
        C = self.schema.n_classes
        out = np.zeros(n_open * k * 2 * C, dtype=np.int64)
        for rows, codes in self.branch_codes(k):
            codes = codes * C + self.y[rows, None]
            out += np.bincount(codes.reshape(-1), minlength=out.size)
        return out.reshape(n_open, k, 2, C)


def check_hello(name: str, algorithm: str, schema: HorizontalSchema, header: dict) -> None:
    """A session's `hello` must name this party's algorithm and the agreed schema."""
    if header.get("algorithm") != algorithm:
        raise ProtocolError(f"party {name!r} runs {algorithm!r}, the master asked for {header.get('algorithm')!r}")
    if header.get("schema") != schema.fingerprint():
        raise ProtocolError(f"party {name!r}: the master's schema fingerprint differs from the party's; "
                            "both must use the same data contract (columns, categories, classes)")


def receive_model(name: str, algorithm: str, schema: HorizontalSchema, message: Message) -> HorizontalForest:
    """The complete forest of a `model` message, which must be one of this party's algorithm."""
    h = message.header
    if h.get("algorithm") != algorithm:
        raise ProtocolError(f"party {name!r} trained {algorithm!r}; the master sent a {h.get('algorithm')!r} model")
    return HorizontalForest.from_arrays(message.arrays, n_trees=int(h["n_trees"]), task=h["task"],
                                        algorithm=h["algorithm"], schema=schema)
