"""PPD-ERT (Aminifar et al., SAC 2021): privacy-preserving distributed extremely randomized trees.

A global seed shared by the parties (and the master) generates the same candidate splits everywhere
without communication: per open node, k distinct features and one threshold each, drawn uniformly in the
feature's DECLARED domain (`feature_ranges`, from the data contracts; categorical columns use their code
domain), never from the data. Each party counts, per candidate and branch, its rows of each class; the
master only ever sees the SUM over parties, through pairwise-mask secure aggregation
(`fedcore.privacy.secagg`), picks the best candidate per node (gini or entropy) and tells the parties
its index. Growth, stopping and leaf values are shared with FET (`growth.py`).

Rounds:

    hello          1       schema and domain check; each party's X25519 public key, signed (M > 1)
    ppdert_level   1/level previous decisions (+ the relayed signed keys, first level only) -> masked counts
    model          1       the complete forest to every party

so a fit takes 2 + L rounds, L = number of levels with open nodes summed over tree batches. Each level's
counts are masked under a fresh round id. A run resumed from checkpoints (`growth.py`) restores the round
counter with the finished batches, so every level keeps the round id it has in an uninterrupted run; the
resumed session has fresh keys and a fresh session id (new `hello`), so no mask of the interrupted session
is ever used again, and the counts of a batch grown again are the same plain values, masked anew. With a single party there is no peer to mask with: it sends its
plain counts, flagged `plain`, and the master accepts that only when M = 1 or when the session was set
up without secure aggregation (`secure=False`, which every party must also be configured for: a
baseline for measuring what the masks cost, not a privacy mode).

Authenticated keys (`fedcore.privacy.keyauth`): each party signs its public key, bound to `key_context`
of the hello it received and to its name, with its identity (an institution agent: its mutual-TLS
certificate's key; the simulator: an ephemeral Ed25519 key). The master relays key, signature and
credential; every party verifies every peer's before deriving masks, and a substituted, unsigned or
replayed key stops the session with `KeyAuthenticationError` naming the party.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from fedcore.errors import KeyAuthenticationError, ProtocolError
from fedcore.horizontal.growth import (
    BranchStatsLevels,
    LevelResult,
    ProgressCallback,
    draw_features,
    tree_segments,
)
from fedcore.horizontal.model import HorizontalForest
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.rows import PartyRows, check_hello, narrow, receive_model
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.protocol.dispatch import Protocol, Step
from fedcore.protocol.messages import Message
from fedcore.randomness import stream
from fedcore.transport.base import Transport

if TYPE_CHECKING:
    from fedcore.privacy.keyauth import PartyIdentity

log = logging.getLogger(__name__)

KEY_CONTEXT_FIELDS = ("algorithm", "schema", "domains", "k", "n_parties", "secure", "session_id")


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


def key_context(hello: dict) -> bytes:
    """What a party's signature on its secure-aggregation key is bound to: the session id and run
    parameters of the hello it received (a key signed for another session does not verify)."""
    from fedcore.privacy.keyauth import context_digest

    fields = {name: hello.get(name) for name in KEY_CONTEXT_FIELDS}
    return context_digest(b"fedforest ppdert hello", json.dumps(fields, sort_keys=True).encode())


PPDERT_PROTOCOL = Protocol(
    "PPD-ERT", initial="idle",
    states={"idle": "no session: before hello, or after the model",
            "greeted": "after hello",
            "counted": "after a level's ppdert_level"},
    steps=[
        Step("idle", "hello", "greeted", "hello_reply"),
        Step(("greeted", "counted"), "ppdert_level", "counted", ("ppdert_masked_counts", "ppdert_plain_counts")),
        # from greeted: every batch was restored from checkpoints
        Step(("greeted", "counted"), "model", "idle", "ack"),
    ])
"""What a PPD-ERT party answers, in which order (see fedcore.protocol.dispatch): never FET's messages, whose
min/max ranges would reveal exactly what PPD-ERT's declared domains keep private."""


class PPDERTParty:
    """One institution in PPD-ERT: regenerates the candidates from the shared seed, masks its counts.

    It holds its rows and counts them like a FET party (`PartyRows`), but answers only `PPDERT_PROTOCOL`.
    """

    algorithm = "ppdert"
    protocol = PPDERT_PROTOCOL
    accountant = None
    """Noise counters an institution agent checkpoints per batch (`HorizontalInstitutionAgent`): PPD-ERT adds
    no noise, so they stay empty and zero."""
    reports_per_row = 0
    _reports = 0

    def __init__(self, name: str, frame: pd.DataFrame, schema: HorizontalSchema, *, seed: int,
                 low: np.ndarray, high: np.ndarray, k: int, secure: bool = True,
                 identity: PartyIdentity | None = None) -> None:
        """`identity` signs this party's secure-aggregation key and verifies its peers' (required with
        secure aggregation and more than one party)."""
        self.name = name
        self.schema = schema
        self.privacy = "secagg" if secure else "none"
        self.rows = PartyRows(name, frame, schema)
        self.X, self.y, self.n_rows = self.rows.X, self.rows.y, self.rows.n_rows
        self.model: HorizontalForest | None = None
        self.identity = identity
        self._key_context = b""
        self._n_parties = 0
        self.secure = bool(secure)
        self.seed = int(seed)
        self.low, self.high, self.k = np.asarray(low, np.float64), np.asarray(high, np.float64), int(k)
        self.aggregator = None
        self._agreed = False
        self.machine = PPDERT_PROTOCOL.start(log)

    def handle(self, message: Message) -> Message:
        """Answer one protocol message, or refuse it (ProtocolError) when it is not the next one of
        `PPDERT_PROTOCOL`."""
        return self.machine.handle(self, message)

    def privacy_spent(self) -> dict:
        """What this party has released in its own accounting: nothing beyond masked sums."""
        return {}

    def _on_hello(self, message: Message) -> Message:
        h = message.header
        check_hello(self.name, self.algorithm, self.schema, h)
        if h.get("domains") != domain_fingerprint(self.low, self.high):
            raise ProtocolError(f"party {self.name!r}: the master's feature domains differ from the party's declared "
                                "ranges; both must come from the same data contract")
        if int(h.get("k", -1)) != self.k:
            raise ProtocolError(f"party {self.name!r}: the master draws {h.get('k')} candidates per node, the party {self.k}")
        if bool(h.get("secure", True)) != self.secure:
            raise ProtocolError(f"party {self.name!r} runs PPD-ERT {'with' if self.secure else 'without'} secure "
                                f"aggregation; the master asked for {'it' if h.get('secure', True) else 'plain counts'}")
        arrays, header = {}, {"n_rows": self.n_rows}
        self._n_parties = int(h["n_parties"])
        self.aggregator, self._agreed = None, False
        if self._n_parties > 1 and self.secure:
            from fedcore.privacy.secagg import SecureAggregator

            if self.identity is None or self.identity.name != self.name:
                found = "none" if self.identity is None else f"the identity of {self.identity.name!r}"
                raise KeyAuthenticationError(f"party {self.name!r} needs its own signing identity to authenticate "
                                             f"its secure-aggregation key (got {found}): an institution agent uses "
                                             "its mutual-TLS certificate and key")
            self.aggregator = SecureAggregator(self.name, bytes.fromhex(h["session_id"]))
            self._key_context = key_context(h)
            signed = self.identity.sign_key(self._key_context, self.aggregator.public_key())
            arrays["public_key"] = np.frombuffer(signed.public_key, dtype=np.uint8).copy()
            header.update(signed.to_header())
        return Message("hello_reply", header, arrays)

    def _on_ppdert_level(self, message: Message) -> Message:
        h, a = message.header, message.arrays
        if "peer_keys" in a:
            if self.aggregator is None:
                raise ProtocolError(f"party {self.name!r} got peer keys but the session has a single party")
            if self._agreed:
                raise ProtocolError(f"party {self.name!r}: peer keys were relayed already in this session")
            self.aggregator.agree(self._verified_peer_keys(h, a["peer_keys"]))
            self._agreed = True
        act_tree = a["tree"].astype(np.int64)
        self.rows.start_level(h, a, len(act_tree))
        self.rows.features, self.rows.thresholds = ppdert_candidates(self.seed, act_tree, int(h["depth"]), self.low,
                                                                     self.high, self.k)
        counts = self.rows.class_counts().reshape(-1)
        if self.aggregator is None:
            return Message("ppdert_plain_counts", {"plain": True}, {"counts": narrow(counts)})
        if not self._agreed:
            raise ProtocolError(f"party {self.name!r}: no peer keys were relayed before the first masked round")
        return Message("ppdert_masked_counts", {}, {"masked": self.aggregator.mask(counts, int(h["round_id"]))})

    def _on_model(self, message: Message) -> Message:
        self.model = receive_model(self.name, self.algorithm, self.schema, message)
        self.rows.clear()
        return Message("ack", {"n_nodes": self.model.n_nodes})

    def _verified_peer_keys(self, h: dict, rows: np.ndarray) -> dict[str, bytes]:
        """The relayed peers' public keys, each checked against its party's signature for this session."""
        from fedcore.privacy.keyauth import SignedKey

        names = list(h.get("peer_names") or [])
        if len(names) != len(rows) or len(set(names)) != len(names) or len(names) != self._n_parties \
                or self.name not in names:
            raise ProtocolError(f"party {self.name!r}: the master relayed keys for {names}; expected one for each of "
                                f"the {self._n_parties} parties, this one included")
        n = len(names)
        signatures = h.get("peer_signatures") or [None] * n
        credentials = h.get("peer_credentials") or [None] * n
        if len(signatures) != n or len(credentials) != n:
            raise ProtocolError(f"party {self.name!r}: the master relayed {len(signatures)} signatures and "
                                f"{len(credentials)} credentials for {n} keys")
        signed = [SignedKey.from_header(name, row.astype(np.uint8).tobytes(), sig, cred)
                  for name, row, sig, cred in zip(names, rows, signatures, credentials, strict=True)]
        own = next(s for s in signed if s.party == self.name)
        if own.public_key != self.aggregator.public_key():
            raise KeyAuthenticationError(f"party {self.name!r}: the master relayed another key as this party's own")
        return self.identity.verify_peers(self._key_context, signed)


class PPDERTMaster(BranchStatsLevels):
    """Coordinates one PPD-ERT training over a transport (see module doc)."""

    algorithm = "ppdert"

    def __init__(self, transport: Transport, params: ExtraTreesParams, schema: HorizontalSchema, *,
                 low: np.ndarray, high: np.ndarray, session_id: bytes | None = None,
                 progress: ProgressCallback | None = None, secure: bool = True,
                 memory_budget: int | None = None) -> None:
        super().__init__(transport, params, schema, progress, memory_budget)
        self.secure = bool(secure)
        self.low, self.high = np.asarray(low, np.float64), np.asarray(high, np.float64)
        if session_id is None:
            session_id = hashlib.sha256(f"fedforest-ppdert|{params.random_state}|{'|'.join(self.parties)}"
                                        .encode()).digest()[:16]
        self.session_id = session_id
        self._keys: dict[str, bytes] = {}
        self._key_proofs: dict[str, dict[str, str]] = {}
        self._relayed = False
        self._round_id = 0

    def counters(self) -> dict[str, int]:
        """The secure-aggregation round id, checkpointed so a resumed run numbers rounds as before."""
        return {"round_id": self._round_id}

    def restore_counters(self, counters: dict[str, int]) -> None:
        self._round_id = counters["round_id"]

    def setup(self) -> None:
        header = {"algorithm": self.algorithm, "schema": self.schema.fingerprint(),
                  "domains": domain_fingerprint(self.low, self.high), "k": self.k,
                  "n_parties": len(self.parties), "session_id": self.session_id.hex(), "secure": self.secure}
        replies = self.transport.exchange({name: Message("hello", header) for name in self.parties})
        self._note_parties(replies)
        if len(self.parties) > 1 and self.secure:
            for name, reply in replies.items():
                if "public_key" not in reply.arrays:
                    raise ProtocolError(f"party {name!r} sent no public key for secure aggregation")
                if not reply.header.get("key_signature") or not reply.header.get("key_credential"):
                    raise KeyAuthenticationError(f"party {name!r} sent its secure-aggregation key without a "
                                                 "signature and credential; every key must be signed")
                self._keys[name] = bytes(reply.arrays["public_key"].astype(np.uint8).tobytes())
                self._key_proofs[name] = {k: reply.header[k] for k in ("key_signature", "key_credential")}

    def _level(self, trees, depth, act_tree, act_node, transition) -> LevelResult:
        features, thresholds = ppdert_candidates(self.params.random_state, act_tree, depth, self.low, self.high, self.k)
        self._round_id += 1
        header = {"depth": depth, "n_trees": len(trees), "round_id": self._round_id}
        arrays = {"tree": act_tree.astype(np.int32)}
        if transition is None:
            self._new_batch(header)
        else:
            arrays.update(transition)
        if self._keys and not self._relayed:
            header["peer_names"] = list(self._keys)
            header["peer_signatures"] = [self._key_proofs[n]["key_signature"] for n in self._keys]
            header["peer_credentials"] = [self._key_proofs[n]["key_credential"] for n in self._keys]
            arrays["peer_keys"] = np.stack([np.frombuffer(k, dtype=np.uint8) for k in self._keys.values()])
            self._relayed = True
        replies = self.transport.exchange(dict.fromkeys(self.parties, Message("ppdert_level", header, arrays)))
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
