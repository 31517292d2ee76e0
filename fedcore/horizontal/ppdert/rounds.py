"""The master's side of secure aggregation, shared by PPD-ERT and horizontal boosting.

The parties' signed public keys collected at hello and relayed once with the session's first request, and
one round of integer vectors summed under a fresh round id: masked in the named ring when there are several
parties and secure aggregation is on (the master sees only the sum), else each party's plain vector.
"""

from __future__ import annotations

from typing import cast

import numpy as np

from fedcore.errors import KeyAuthenticationError, ProtocolError
from fedcore.privacy.secagg import unmask_sum
from fedcore.protocol.messages import Message
from fedcore.transport.base import Transport


class MaskedRounds:
    """Keys and masked rounds of one session over `transport` (see the module doc)."""

    def __init__(self, transport: Transport, secure: bool) -> None:
        """Rounds to every party of `transport`; `secure=False`: plain vectors (a baseline, not privacy)."""
        self.transport = transport
        self.parties = list(transport.parties)
        self.secure = bool(secure)
        self.round_id = 0
        self._keys: dict[str, bytes] = {}
        self._key_proofs: dict[str, dict[str, str]] = {}
        self._relayed = False

    @property
    def masked(self) -> bool:
        """Whether rounds are masked: several parties under secure aggregation."""
        return len(self.parties) > 1 and self.secure

    def collect_keys(self, replies: dict[str, Message]) -> None:
        """Every party's signed public key from its hello reply (masked sessions only)."""
        if not self.masked:
            return
        for name, reply in replies.items():
            if "public_key" not in reply.arrays:
                raise ProtocolError(f"party {name!r} sent no public key for secure aggregation")
            if not reply.header.get("key_signature") or not reply.header.get("key_credential"):
                raise KeyAuthenticationError(f"party {name!r} sent its secure-aggregation key without a "
                                             "signature and credential; every key must be signed")
            self._keys[name] = bytes(reply.arrays["public_key"].astype(np.uint8).tobytes())
            self._key_proofs[name] = {k: reply.header[k] for k in ("key_signature", "key_credential")}

    def relay_keys(self, header: dict, arrays: dict) -> None:
        """The first request of the session relays every party's signed public key."""
        if self._keys and not self._relayed:
            header["peer_names"] = list(self._keys)
            header["peer_signatures"] = [self._key_proofs[n]["key_signature"] for n in self._keys]
            header["peer_credentials"] = [self._key_proofs[n]["key_credential"] for n in self._keys]
            arrays["peer_keys"] = np.stack([np.frombuffer(k, dtype=np.uint8) for k in self._keys.values()])
            self._relayed = True

    def exchange(self, kind: str, header: dict, arrays: dict, bits: int,
                 replies_as: tuple[str, str, str]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """One round under a fresh round id.

        `replies_as`: (masked reply kind, plain reply kind, the plain reply's array); masked replies carry
        `masked`. Every party's vector, summed (masked in the `bits`-bit ring, else plain), as flat int64;
        and each party's flat vector when they are plain (else empty).
        """
        self.round_id += 1
        header = {**header, "round_id": self.round_id, "mask_bits": bits}
        replies = self.transport.exchange(dict.fromkeys(self.parties, Message(kind, header, arrays)))
        masked_kind, plain_kind, field = replies_as
        if not self.masked:
            wrong = {name: r.kind for name, r in replies.items()
                     if r.kind != plain_kind or field not in r.arrays}
            if wrong:
                raise ProtocolError(f"parties answered {wrong}, expected {plain_kind} with {field!r}")
            for name, reply in replies.items():
                if not np.issubdtype(reply.arrays[field].dtype, np.integer):
                    raise ProtocolError(f"party {name!r}: {field} must be integers, got "
                                        f"{reply.arrays[field].dtype}")
            plain = {name: replies[name].arrays[field].reshape(-1) for name in self.parties}
            if len({v.size for v in plain.values()}) != 1:
                raise ProtocolError("parties sent vectors of different sizes: "
                                    f"{ {name: v.size for name, v in plain.items()} }")
            # typeshed's sum may return 0 (an empty iterable); there is always a party
            return cast(np.ndarray, sum(v.astype(np.int64) for v in plain.values())), plain
        ring = np.dtype(f"uint{bits}")
        masked = []
        for name in self.parties:
            reply = replies[name]
            if reply.kind != masked_kind or reply.arrays.get("masked", np.zeros(0)).dtype != ring:
                raise ProtocolError(f"party {name!r} answered {reply.kind!r}; with {len(self.parties)} "
                                    f"parties only {masked_kind} masked in the agreed {bits}-bit ring is "
                                    "accepted")
            masked.append(reply.arrays["masked"].reshape(-1))
        if len({m.size for m in masked}) != 1:
            raise ProtocolError(f"parties masked vectors of different sizes: {[m.size for m in masked]}")
        return unmask_sum(masked).astype(np.int64, copy=False), {}  # the 64-bit ring: its signed view as is
