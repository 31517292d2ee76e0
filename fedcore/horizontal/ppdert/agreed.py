"""What every PPD-ERT role derives the same way, without communication.

The seed-shared candidate splits of the open nodes, the fingerprint of the declared domains, and the context
that binds a signed key to its session.
"""

from __future__ import annotations

import hashlib
import json
import threading

import numpy as np

from fedcore.horizontal.growth import (
    ranked_features,
    tree_segments,
)
from fedcore.privacy.settings import THRESHOLD_MODES as THRESHOLD_MODES  # PPD-ERT's, in its privacy setting
from fedcore.privacy.settings import check_threshold_mode as check_threshold_mode
from fedcore.randomness import stream

KEY_CONTEXT_FIELDS = ("algorithm", "schema", "domains", "k", "n_parties", "secure", "session_id",
                      "thresholds", "n_cells")


def candidate_draws(seed: int, act_tree: np.ndarray, depth: int, n_features: int,
                    k: int) -> tuple[np.ndarray, np.ndarray]:
    """The shared draws of the open nodes.

    Candidate features (A, k) and uniforms in [0, 1) (A, k) that place each threshold in its interval, from
    stream(seed, ppdert_candidates, tree, depth); identical at every role. The last few levels' draws are
    kept by their exact arguments (`_RECENT`), so roles that share a process (the in-process estimators and
    simulator: the master and every party) draw a level once; each role gets its own copies.
    """
    trees = np.ascontiguousarray(act_tree, dtype=np.int64)
    key = (int(seed), int(depth), int(n_features), int(k), trees.tobytes())
    with _LOCK:  # parties may answer side by side, in threads (`InProcessTransport(concurrent=True)`)
        drawn = _RECENT.get(key)
        if drawn is None:
            drawn = _RECENT[key] = _draws(int(seed), trees, int(depth), int(n_features), int(k))
            while len(_RECENT) > _KEPT_LEVELS:
                del _RECENT[next(iter(_RECENT))]
    features, u = drawn
    return features.copy(), u.copy()


_KEPT_LEVELS = 4
_LOCK = threading.Lock()
_RECENT: dict[tuple[int, int, int, int, bytes], tuple[np.ndarray, np.ndarray]] = {}
"""The draws of the last `_KEPT_LEVELS` distinct levels asked for, oldest first: a pure function's results,
keyed by every argument (the open nodes' trees as bytes, not a hash a hostile request could collide)."""


def _draws(seed: int, act_tree: np.ndarray, depth: int, n_features: int,
           k: int) -> tuple[np.ndarray, np.ndarray]:
    """`candidate_draws` computed: each tree's stream draws its nodes' feature keys, then their uniforms."""
    keys = np.empty((len(act_tree), n_features))
    u = np.empty((len(act_tree), k), dtype=np.float64)
    for tree, a, b in tree_segments(act_tree):
        rng = stream(seed, "ppdert_candidates", tree, depth)
        rng.random(out=keys[a:b])  # the features' keys first, as `draw_features` draws them
        rng.random(out=u[a:b])
    return ranked_features(keys, k), u


def ppdert_candidates(seed: int, act_tree: np.ndarray, depth: int, low: np.ndarray, high: np.ndarray,
                      k: int) -> tuple[np.ndarray, np.ndarray]:
    """The paper's candidate splits (`thresholds="domain"`).

    Features (A, k) and thresholds (A, k) drawn uniformly in the declared domains, so every role derives them
    without communication.
    """
    features, u = candidate_draws(seed, act_tree, depth, len(low), k)
    return features, domain_thresholds(features, u, low, high)


def domain_thresholds(features: np.ndarray, u: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The paper's thresholds: the shared uniforms placed in each candidate feature's declared domain."""
    lo, hi = low[features], high[features]
    return lo + u * (hi - lo)


def domain_fingerprint(low: np.ndarray, high: np.ndarray) -> str:
    """SHA-256 of the declared domains: master and parties check they agree."""
    return hashlib.sha256(np.ascontiguousarray(low, "<f8").tobytes()
                          + np.ascontiguousarray(high, "<f8").tobytes()).hexdigest()


def key_context(hello: dict) -> bytes:
    """What a party's signature on its secure-aggregation key is bound to.

    The session id and run parameters of the hello it received (a key signed for another session does not
    verify).
    """
    from fedcore.privacy.keyauth import context_digest

    fields = {name: hello.get(name) for name in KEY_CONTEXT_FIELDS}
    return context_digest(b"fedforest ppdert hello", json.dumps(fields, sort_keys=True).encode())
