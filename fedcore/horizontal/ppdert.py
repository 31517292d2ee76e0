"""PPD-ERT (Aminifar et al., SAC 2021): privacy-preserving distributed extremely randomized trees.

A global seed shared by the parties (and the master) generates the same candidate splits everywhere
without communication: per open node, k distinct features and one threshold each, drawn uniformly in the
feature's DECLARED domain (`feature_ranges`, from the data contracts; categorical columns use their code
domain), never from the data. Each party counts, per candidate and branch, its rows of each class; the
master only ever sees the SUM over parties, through pairwise-mask secure aggregation
(`fedcore.privacy.secagg`), picks the best candidate per node (gini or entropy) and tells the parties
its index. Growth, stopping and leaf values are shared with FET (`growth.py`).

Rounds:

    hello          1       schema and domain check; each party's X25519 public key (M > 1)
    ppdert_level   1/level previous decisions (+ the relayed public keys, first level only) -> masked counts
    model          1       the complete forest to every party

so a fit takes 2 + L rounds, L = number of levels with open nodes summed over tree batches. Each level's
counts are masked under a fresh round id. With a single party there is no peer to mask with: it sends its
plain counts, flagged `plain`, and the master accepts that only when M = 1 or when the session was set
up without secure aggregation (`secure=False`, which every party must also be configured for: a
baseline for measuring what the masks cost, not a privacy mode).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from fedcore.errors import ProtocolError
from fedcore.horizontal.growth import (
    LevelResult,
    LevelwiseMaster,
    ProgressCallback,
    draw_features,
    tree_segments,
)
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.party import HorizontalParty
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.protocol.messages import Message
from fedcore.randomness import stream
from fedcore.transport.base import Transport


def ppdert_candidates(seed: int, act_tree: np.ndarray, depth: int, low: np.ndarray, high: np.ndarray,
                      k: int) -> tuple[np.ndarray, np.ndarray]:
    """The shared candidate splits of the open nodes: features (A, k) and thresholds (A, k), from
    stream(seed, ppdert_candidates, tree, depth) and the declared domains; identical at every role."""
    features = np.empty((len(act_tree), k), dtype=np.int64)
    u = np.empty((len(act_tree), k), dtype=np.float64)
    for tree, a, b in tree_segments(act_tree):
        rng = stream(seed, "ppdert_candidates", tree, depth)
        features[a:b] = draw_features(rng, b - a, len(low), k)
        u[a:b] = rng.random((b - a, k))
    lo, hi = low[features], high[features]
    return features, lo + u * (hi - lo)


def domain_fingerprint(low: np.ndarray, high: np.ndarray) -> str:
    """SHA-256 of the declared domains: master and parties check they agree."""
    return hashlib.sha256(np.ascontiguousarray(low, "<f8").tobytes() + np.ascontiguousarray(high, "<f8").tobytes()
                          ).hexdigest()


class PPDERTParty(HorizontalParty):
    """One institution in PPD-ERT: regenerates the candidates from the shared seed, masks its counts."""

    algorithm = "ppdert"

    def __init__(self, name: str, frame: pd.DataFrame, schema: HorizontalSchema, *, seed: int,
                 low: np.ndarray, high: np.ndarray, k: int, secure: bool = True) -> None:
        super().__init__(name, frame, schema, privacy="secagg" if secure else "none")
        self.secure = bool(secure)
        self.seed = int(seed)
        self.low, self.high, self.k = np.asarray(low, np.float64), np.asarray(high, np.float64), int(k)
        self.aggregator = None
        self._agreed = False

    def _on_hello(self, message: Message) -> Message:
        h = message.header
        self._check_hello(h)
        if h.get("domains") != domain_fingerprint(self.low, self.high):
            raise ProtocolError(f"party {self.name!r}: the master's feature domains differ from the party's declared "
                                "ranges; both must come from the same data contract")
        if int(h.get("k", -1)) != self.k:
            raise ProtocolError(f"party {self.name!r}: the master draws {h.get('k')} candidates per node, the party {self.k}")
        if bool(h.get("secure", True)) != self.secure:
            raise ProtocolError(f"party {self.name!r} runs PPD-ERT {'with' if self.secure else 'without'} secure "
                                f"aggregation; the master asked for {'it' if h.get('secure', True) else 'plain counts'}")
        arrays = {}
        if int(h["n_parties"]) > 1 and self.secure:
            from fedcore.privacy.secagg import SecureAggregator

            self.aggregator = SecureAggregator(self.name, bytes.fromhex(h["session_id"]))
            arrays["public_key"] = np.frombuffer(self.aggregator.public_key(), dtype=np.uint8).copy()
        return Message("hello_reply", {"n_rows": self.n_rows}, arrays)

    def _on_ppdert_level(self, message: Message) -> Message:
        h, a = message.header, message.arrays
        if "peer_keys" in a:
            if self.aggregator is None:
                raise ProtocolError(f"party {self.name!r} got peer keys but the session has a single party")
            keys = {name: bytes(row.astype(np.uint8).tobytes()) for name, row in zip(h["peer_names"], a["peer_keys"],
                                                                                     strict=True) if name != self.name}
            self.aggregator.agree(keys)
            self._agreed = True
        self._start_level(message)
        act_tree = a["tree"].astype(np.int64)
        if len(act_tree) != self.partition.n_open:
            raise ProtocolError(f"party {self.name!r}: the master lists {len(act_tree)} open nodes, "
                                f"{self.partition.n_open} are open here")
        self._features, self._thresholds = ppdert_candidates(self.seed, act_tree, int(h["depth"]), self.low,
                                                             self.high, self.k)
        counts = self.class_counts().reshape(-1)
        if self.aggregator is None:
            return Message("ppdert_plain_counts", {"plain": True}, {"counts": counts})
        if not self._agreed:
            raise ProtocolError(f"party {self.name!r}: no peer keys were relayed before the first masked round")
        return Message("ppdert_masked_counts", {}, {"masked": self.aggregator.mask(counts, int(h["round_id"]))})


class PPDERTMaster(LevelwiseMaster):
    """Coordinates one PPD-ERT training over a transport (see module doc)."""

    algorithm = "ppdert"

    def __init__(self, transport: Transport, params: ExtraTreesParams, schema: HorizontalSchema, *,
                 low: np.ndarray, high: np.ndarray, session_id: bytes | None = None,
                 progress: ProgressCallback | None = None, secure: bool = True) -> None:
        super().__init__(transport, params, schema, progress)
        self.secure = bool(secure)
        self.low, self.high = np.asarray(low, np.float64), np.asarray(high, np.float64)
        if session_id is None:
            session_id = hashlib.sha256(f"fedforest-ppdert|{params.random_state}|{'|'.join(self.parties)}"
                                        .encode()).digest()[:16]
        self.session_id = session_id
        self._keys: dict[str, bytes] = {}
        self._relayed = False
        self._round_id = 0

    def setup(self) -> None:
        header = {"algorithm": self.algorithm, "schema": self.schema.fingerprint(),
                  "domains": domain_fingerprint(self.low, self.high), "k": self.k,
                  "n_parties": len(self.parties), "session_id": self.session_id.hex(), "secure": self.secure}
        replies = self.transport.exchange({name: Message("hello", header) for name in self.parties})
        if len(self.parties) > 1 and self.secure:
            for name, reply in replies.items():
                if "public_key" not in reply.arrays:
                    raise ProtocolError(f"party {name!r} sent no public key for secure aggregation")
                self._keys[name] = bytes(reply.arrays["public_key"].astype(np.uint8).tobytes())

    def _level(self, trees, depth, act_tree, act_node, transition) -> LevelResult:
        features, thresholds = ppdert_candidates(self.params.random_state, act_tree, depth, self.low, self.high, self.k)
        self._round_id += 1
        header = {"depth": depth, "n_trees": len(trees), "round_id": self._round_id}
        arrays = {"tree": act_tree.astype(np.int32)}
        if transition is None:
            header["new_batch"] = True
        else:
            arrays.update(transition)
        if self._keys and not self._relayed:
            header["peer_names"] = list(self._keys)
            arrays["peer_keys"] = np.stack([np.frombuffer(k, dtype=np.uint8) for k in self._keys.values()])
            self._relayed = True
        replies = self.transport.exchange({name: Message("ppdert_level", header, arrays) for name in self.parties})
        size = features.size * 2 * self.n_stats
        if len(self.parties) == 1 or not self.secure:
            kinds = {name: r.kind for name, r in replies.items() if r.kind != "ppdert_plain_counts"}
            if kinds:
                raise ProtocolError(f"parties answered {kinds}, expected ppdert_plain_counts")
            total = sum(r.arrays["counts"].astype(np.int64) for r in replies.values())
        else:
            masked = []
            for name in self.parties:
                reply = replies[name]
                if reply.kind != "ppdert_masked_counts" or reply.arrays.get("masked", np.zeros(0)).dtype != np.uint64:
                    raise ProtocolError(f"party {name!r} answered {reply.kind!r}; with {len(self.parties)} parties "
                                        "only masked uint64 counts are accepted")
                masked.append(reply.arrays["masked"])
            from fedcore.privacy.secagg import unmask_sum

            total = unmask_sum(masked)
        if total.size != size:
            raise ProtocolError(f"aggregated counts have {total.size} entries, expected {size}")
        branch = total.reshape(*features.shape, 2, self.n_stats).astype(np.float64)
        return LevelResult(features, thresholds, np.ones(features.shape, dtype=bool), branch)
