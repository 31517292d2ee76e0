"""The master's role in PPD-ERT: the level strategy of the one grower (`fedcore/trees/grower.py`) that
sums the parties' masked counts of the seed-shared candidates (see the package doc)."""

from __future__ import annotations

import hashlib

import numpy as np

from fedcore.errors import KeyAuthenticationError, ProtocolError
from fedcore.horizontal.growth import (
    BranchStatsLevels,
    LevelResult,
    ProgressCallback,
)
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.ppdert.agreed import domain_fingerprint, ppdert_candidates
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.privacy.secagg import MODULUS_BITS, ring_bits_for
from fedcore.protocol.messages import Message
from fedcore.transport.base import Transport


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
        self.mask_bits = MODULUS_BITS  # until the parties' row counts are known (hello)

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
        # the narrowest ring that holds any count's sum over all rows: fewer key-stream and wire bytes
        self.mask_bits = ring_bits_for(sum(self.party_rows.values()))
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
        header = {"depth": depth, "n_trees": len(trees), "round_id": self._round_id, "mask_bits": self.mask_bits}
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
                ring = np.dtype(f"uint{self.mask_bits}")
                if reply.kind != "ppdert_masked_counts" or reply.arrays.get("masked", np.zeros(0)).dtype != ring:
                    raise ProtocolError(f"party {name!r} answered {reply.kind!r}; with {len(self.parties)} parties "
                                        f"only counts masked in the agreed {self.mask_bits}-bit ring are accepted")
                masked.append(reply.arrays["masked"])
            from fedcore.privacy.secagg import unmask_sum

            total = unmask_sum(masked)
            if total.size and int(total.min()) < 0:  # counts cannot be negative: a sum wrapped around the ring
                raise ProtocolError(f"the masked counts sum to negative values in the {self.mask_bits}-bit ring: "
                                    "a party counted more rows than it reported, or masked in another ring")
        if total.size != size:
            raise ProtocolError(f"aggregated counts have {total.size} entries, expected {size}")
        branch = total.reshape(*features.shape, 2, self.n_stats).astype(np.float64)
        return LevelResult(features, thresholds, np.ones(features.shape, dtype=bool), branch)
