"""What every PPD-ERT role derives the same way, without communication.

The seed-shared candidate splits of the open nodes, the fingerprint of the declared domains, and the context
that binds a signed key to its session.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedcore.errors import ParameterError
from fedcore.horizontal.growth import (
    draw_features,
    tree_segments,
)
from fedcore.horizontal.ppdert.cells import CELL_CHOICES, DEFAULT_CELLS
from fedcore.randomness import stream

KEY_CONTEXT_FIELDS = ("algorithm", "schema", "domains", "k", "n_parties", "secure", "session_id",
                      "thresholds", "n_cells")
THRESHOLD_MODES = ("histogram", "domain")
"""Where candidate thresholds come from: the populated grid cells of the node's rows (`cells.py`), or
the declared domain, as in the paper."""


def check_threshold_mode(thresholds: str, n_cells: int) -> tuple[str, int]:
    """Refuse an unknown threshold mode or grid size (both roles check what they are configured with)."""
    if thresholds not in THRESHOLD_MODES:
        raise ParameterError(f"PPD-ERT thresholds must be one of {list(THRESHOLD_MODES)}, got {thresholds!r}")
    if isinstance(n_cells, bool) or n_cells not in CELL_CHOICES:
        raise ParameterError(f"PPD-ERT histogram cells must be one of {list(CELL_CHOICES)}, got {n_cells!r}")
    return thresholds, int(n_cells)


def threshold_settings(privacy: Mapping[str, Any]) -> dict[str, Any]:
    """PPD-ERT's threshold mode and grid from a `privacy:` mapping, defaults filled in and checked.

    {"thresholds": ..., "cells": ...}, histogram on DEFAULT_CELLS cells by default. Config, master session and
    institution agents all read them here.
    """
    mode, cells = check_threshold_mode(privacy.get("thresholds", "histogram"),
                                       privacy.get("cells", DEFAULT_CELLS))
    return {"thresholds": mode, "cells": cells}


def candidate_draws(seed: int, act_tree: np.ndarray, depth: int, n_features: int,
                    k: int) -> tuple[np.ndarray, np.ndarray]:
    """The shared draws of the open nodes.

    Candidate features (A, k) and uniforms in [0, 1) (A, k) that place each threshold in its interval, from
    stream(seed, ppdert_candidates, tree, depth); identical at every role.
    """
    features = np.empty((len(act_tree), k), dtype=np.int64)
    u = np.empty((len(act_tree), k), dtype=np.float64)
    for tree, a, b in tree_segments(act_tree):
        rng = stream(seed, "ppdert_candidates", tree, depth)
        features[a:b] = draw_features(rng, b - a, n_features, k)
        u[a:b] = rng.random((b - a, k))
    return features, u


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
