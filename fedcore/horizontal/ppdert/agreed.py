"""What every PPD-ERT role derives the same way, without communication: the seed-shared candidate splits
of the open nodes, the fingerprint of the declared domains, and the context that binds a signed key to
its session."""

from __future__ import annotations

import hashlib
import json

import numpy as np

from fedcore.horizontal.growth import (
    draw_features,
    tree_segments,
)
from fedcore.randomness import stream

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
