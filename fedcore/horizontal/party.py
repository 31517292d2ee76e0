"""The institution's role in horizontal Federated Extra-Trees: it holds some rows of every column (and
their labels) and answers the master's requests with aggregates only.

Per level the party receives the candidate features of every open node (`fet_ranges`) and replies with
its local min and max of each over the node's rows; then it receives the thresholds (`fet_stats`) and
replies with per-branch label statistics in its privacy mode:

* none: exact integer class counts, or (count, sum of quantised targets) for regression;
* gdp: the same vector plus Laplace noise, `epsilon` per query, from the party's own seeded stream;
* ldp: sums of instant randomized-response bits of Bloom-encoded labels (permanent responses fixed once
  per sample and reused across trees), plus plain branch sizes.

Rows never leave; the party tracks which open node each of its rows sits in, per tree of the batch
(`RowPartition`), and applies the master's decisions locally. All row work is vectorised NumPy over
(tree, row) entries, chunked to bound memory.
"""

from __future__ import annotations

import secrets

import numpy as np
import pandas as pd

from fedcore.errors import ProtocolError
from fedcore.horizontal.model import HorizontalForest
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.protocol.messages import Message
from fedcore.randomness import stream

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


class HorizontalParty:
    """One institution: its rows, the agreed schema, its privacy settings and the protocol handlers.

    `noise_seed` seeds the party's own random streams (Laplace noise, randomized response); it never comes
    from the master. None draws a fresh random seed (runs are then not reproducible).
    """

    algorithm = "fet"

    def __init__(self, name: str, frame: pd.DataFrame, schema: HorizontalSchema, *, privacy: str = "none",
                 epsilon: float = 1.0, ldp=None, noise_seed: int | None = None) -> None:
        self.name = name
        self.schema = schema
        self.privacy = privacy
        self.epsilon = float(epsilon)
        self.ldp = ldp
        self.noise_seed = int(noise_seed) if noise_seed is not None else secrets.randbits(63)
        self.X = schema.encode(frame)
        self.y = schema.encode_labels(frame[schema.label])
        self.n_rows = len(self.X)
        self.partition = RowPartition(self.n_rows)
        self.model: HorizontalForest | None = None
        self.accountant = None
        self.reports_per_row = 0  # LDP: instant reports the busiest row has sent
        self._features = np.zeros((0, 0), np.int64)
        self._thresholds = np.zeros((0, 0))
        self._reports = 0
        self._q: np.ndarray | None = None
        self._q_shift: int | None = None
        self._permanent: np.ndarray | None = None
        if privacy == "gdp":
            from fedcore.privacy.laplace import PrivacyAccountant

            self.accountant = PrivacyAccountant()

    # -- dispatch -------------------------------------------------------------------------------
    def handle(self, message: Message) -> Message:
        """Answer one protocol message."""
        handler = getattr(self, f"_on_{message.kind}", None)
        if handler is None:
            raise ProtocolError(f"party {self.name!r} cannot handle message kind {message.kind!r}")
        return handler(message)

    def _check_hello(self, h: dict) -> None:
        if h.get("algorithm") != self.algorithm:
            raise ProtocolError(f"party {self.name!r} runs {self.algorithm!r}, the master asked for {h.get('algorithm')!r}")
        if h.get("schema") != self.schema.fingerprint():
            raise ProtocolError(f"party {self.name!r}: the master's schema fingerprint differs from the party's; "
                                "both must use the same data contract (columns, categories, classes)")

    def _on_hello(self, message: Message) -> Message:
        h = message.header
        self._check_hello(h)
        if h.get("privacy") != self.privacy:
            raise ProtocolError(f"party {self.name!r} is configured for privacy={self.privacy!r}, the master asked "
                                f"for {h.get('privacy')!r}; the party's own setting wins: reconfigure the master")
        header = {"n_rows": self.n_rows}
        if self.schema.task == "regression":
            largest = float(np.abs(self.y).max()) if self.n_rows else 0.0
            header["y_exponent"] = int(np.frexp(largest)[1])  # |y| < 2**y_exponent: a power of two, not a value
        if self.privacy == "ldp":
            self._permanent = self.ldp.permanent_bits(self.y, self.schema.n_classes,
                                                      stream(self.noise_seed, "ldp_permanent"))
        return Message("hello_reply", header)

    # -- growth ---------------------------------------------------------------------------------
    def _start_level(self, message: Message) -> None:
        """Reset on a new batch, or apply the previous level's decisions."""
        h, a = message.header, message.arrays
        if h.get("new_batch"):
            self.partition.reset(int(h["n_trees"]))
        else:
            self.partition.apply(self.X, a["chosen"], a["next_pos"], self._features, self._thresholds)

    def _on_fet_ranges(self, message: Message) -> Message:
        self._start_level(message)
        features = message.arrays["features"].astype(np.int64)
        if features.shape[0] != self.partition.n_open:
            raise ProtocolError(f"party {self.name!r}: candidates for {features.shape[0]} nodes, "
                                f"{self.partition.n_open} are open")
        if features.size and (features.min() < 0 or features.max() >= self.schema.n_features):
            raise ProtocolError(f"party {self.name!r}: candidate feature index outside the schema")
        n_open, k = features.shape
        low = np.full(n_open * k, np.inf)
        high = np.full(n_open * k, -np.inf)
        _, rows, p = self.partition.entries()
        for part in chunks(len(rows), k):
            values = self.X[rows[part, None], features[p[part]]]
            codes = p[part, None] * k + np.arange(k)
            present = ~np.isnan(values)
            np.minimum.at(low, codes[present], values[present])
            np.maximum.at(high, codes[present], values[present])
        self._features = features
        return Message("fet_ranges_reply", {}, {"min": low.reshape(n_open, k), "max": high.reshape(n_open, k)})

    def _on_fet_stats(self, message: Message) -> Message:
        thresholds = message.arrays["thresholds"].astype(np.float64)
        if thresholds.shape != self._features.shape:
            raise ProtocolError(f"party {self.name!r}: thresholds of shape {thresholds.shape} do not match the "
                                f"candidates {self._features.shape}")
        self._thresholds = thresholds
        self._reports += 1
        if self.privacy == "ldp":
            return self._ldp_reply()
        if self.schema.task == "regression":
            counts = self._regression_sums(int(message.header["q_shift"]))
        else:
            counts = self.class_counts()
        if self.privacy == "none":
            return Message("fet_counts", {}, {"counts": counts})
        return self._gdp_reply(counts, int(message.header.get("q_bound_bits", 0)))

    def class_counts(self) -> np.ndarray:
        """Exact per-branch class counts of every candidate of every open node: (A, k, 2, C) int64."""
        n_open, k = self._features.shape
        C = self.schema.n_classes
        out = np.zeros(n_open * k * 2 * C, dtype=np.int64)
        _, rows, p = self.partition.entries()
        for part in chunks(len(rows), k):
            codes = branch_codes(self.X, rows[part], p[part], self._features, self._thresholds)
            codes = codes * C + self.y[rows[part], None]
            out += np.bincount(codes.reshape(-1), minlength=out.size)
        return out.reshape(n_open, k, 2, C)

    def _quantised(self, shift: int) -> np.ndarray:
        """Targets as int64 fixed point y * 2**shift (exact in float64 sums: see the master's scale)."""
        if self._q is None or self._q_shift != shift:
            self._q = np.rint(np.ldexp(self.y, shift)).astype(np.int64)
            self._q_shift = shift
        return self._q

    def _regression_sums(self, shift: int) -> np.ndarray:
        """Per-branch (count, sum of quantised targets) of every candidate: (A, k, 2, 2) int64.

        The master picks the scale so that |sum of q| over all rows stays below 2**52: float64 bincount sums
        are then exact integers whatever the order, hence layout-independent.
        """
        q = self._quantised(shift).astype(np.float64)
        n_open, k = self._features.shape
        size = n_open * k * 2
        n = np.zeros(size, dtype=np.int64)
        s = np.zeros(size, dtype=np.float64)
        _, rows, p = self.partition.entries()
        for part in chunks(len(rows), k):
            codes = branch_codes(self.X, rows[part], p[part], self._features, self._thresholds)
            n += np.bincount(codes.reshape(-1), minlength=size)
            s += np.bincount(codes.reshape(-1), weights=np.repeat(q[rows[part]], k), minlength=size)
        return np.stack([n, s.astype(np.int64)], axis=-1).reshape(n_open, k, 2, 2)

    def _gdp_reply(self, counts: np.ndarray, q_bound_bits: int) -> Message:
        from fedcore.privacy.laplace import laplace_counts

        rng = stream(self.noise_seed, "laplace", self._reports)
        if self.schema.task == "regression":
            # (count, sum) per branch: half the budget each; a row moves the sum by at most 2**q_bound_bits
            noisy = np.empty(counts.shape, dtype=np.float64)
            noisy[..., 0] = laplace_counts(counts[..., 0], self.epsilon / 2, rng)
            noisy[..., 1] = laplace_counts(counts[..., 1], self.epsilon / 2, rng, sensitivity=float(2 ** q_bound_bits))
        else:
            noisy = laplace_counts(counts, self.epsilon, rng)
        # per row: one query per candidate per tree it is active in (branches are disjoint: parallel)
        queries = counts.shape[1] * self.partition.active_slots_per_row()
        if queries:
            self.accountant.spend(self.epsilon, queries=queries)
        return Message("fet_noisy_counts", {}, {"counts": noisy})

    def _ldp_reply(self) -> Message:
        n_open, k = self._features.shape
        n_bits = self.ldp.n_bits
        size = n_open * k * 2
        sums = np.zeros(size * n_bits, dtype=np.float64)
        sizes = np.zeros(size, dtype=np.int64)
        rng = stream(self.noise_seed, "ldp_instant", self._reports)
        _, rows, p = self.partition.entries()
        for part in chunks(len(rows), k * n_bits):
            codes = branch_codes(self.X, rows[part], p[part], self._features, self._thresholds)
            instant = self.ldp.instant_bits(self._permanent[rows[part]], rng)  # one fresh report per entry
            sizes += np.bincount(codes.reshape(-1), minlength=size)
            bit_codes = codes[:, :, None] * n_bits + np.arange(n_bits)
            weights = np.broadcast_to(instant[:, None, :], bit_codes.shape).astype(np.float64)
            sums += np.bincount(bit_codes.reshape(-1), weights=weights.reshape(-1), minlength=sums.size)
        self.reports_per_row += self.partition.active_slots_per_row()
        return Message("fet_bit_sums", {}, {"bit_sums": sums.astype(np.int64).reshape(n_open, k, 2, n_bits),
                                            "sizes": sizes.reshape(n_open, k, 2)})

    # -- the finished model -----------------------------------------------------------------------
    def _on_model(self, message: Message) -> Message:
        h = message.header
        self.model = HorizontalForest.from_arrays(message.arrays, n_trees=int(h["n_trees"]), task=h["task"],
                                                  algorithm=h["algorithm"], schema=self.schema)
        self.partition = RowPartition(self.n_rows)
        return Message("ack", {"n_nodes": self.model.n_nodes})

    def privacy_spent(self) -> dict:
        """What this party has released, in its own accounting."""
        if self.privacy == "gdp":
            return self.accountant.to_dict()
        if self.privacy == "ldp":
            return {"reports_per_row": self.reports_per_row, **self.ldp.epsilon()}
        return {}
