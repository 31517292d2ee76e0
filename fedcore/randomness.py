"""Seeded random streams keyed by purpose and tree, so that every role draws the same numbers.

All randomness in training comes from here: a stream is a pure function of (seed, purpose, keys), which
is what makes a federated run reproduce the single-party run exactly, whatever the party layout.
"""

from __future__ import annotations

import numpy as np

PURPOSES = {"bootstrap": 1, "features": 2, "tree_features": 3, "thresholds": 4, "split": 5,
            "ldp_permanent": 6, "ldp_instant": 7, "laplace": 8,
            # horizontal engine: master-side draws keyed by (tree, depth)
            "fet_features": 9, "fet_thresholds": 10, "ppdert_candidates": 11}


def stream(seed: int, purpose: str, *keys: int) -> np.random.Generator:
    """Return the generator for `purpose` and integer `keys` (tree, depth, ...) under `seed`."""
    if purpose not in PURPOSES:
        raise KeyError(f"unknown random purpose {purpose!r}")
    spawn_key = (PURPOSES[purpose], *[int(k) for k in keys])
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(int(seed), spawn_key=spawn_key)))


def bootstrap_counts(seed: int, tree: int, n_rows: int, n_draws: int) -> np.ndarray:
    """How often each row is drawn into tree `tree`'s bootstrap sample (length n_rows, int32)."""
    rng = stream(seed, "bootstrap", tree)
    draws = rng.integers(0, n_rows, size=n_draws, dtype=np.int64)
    return np.bincount(draws, minlength=n_rows).astype(np.int32)


def counter_key(seed: int, purpose: str, *keys: int) -> np.ndarray:
    """The 128-bit key (2 uint64) of `purpose` and `keys` under `seed`, for the counter-based fedcore.philox.

    For draws addressed by position (a row's LDP words, whichever block holds the row): their words come from
    counters under this key, secret as long as `seed` is. Taken from `stream`'s own SeedSequence.
    """
    return stream(seed, purpose, *keys).bit_generator.seed_seq.generate_state(2, np.uint64)
