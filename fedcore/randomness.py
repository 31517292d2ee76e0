"""Seeded random streams keyed by purpose and tree, so that every role draws the same numbers.

All randomness in training comes from here: a stream is a pure function of (seed, purpose, keys), which
is what makes a federated run reproduce the single-party run exactly, whatever the party layout.
"""

from __future__ import annotations

import numpy as np

PURPOSES = {"bootstrap": 1, "features": 2, "tree_features": 3, "thresholds": 4, "split": 5,
            "ldp_permanent": 6, "ldp_instant": 7, "gdp_noise": 8,
            # horizontal engine: master-side draws keyed by (tree, depth)
            "fet_features": 9, "fet_thresholds": 10, "ppdert_candidates": 11,
            # vertical bootstrap: one stream per canonical chunk of rows, keyed by (tree, chunk)
            "bootstrap_chunk": 12,
            # PPD-ERT secagg-dp: a party's discrete Gaussian noise, keyed by round id, and its noisy row count
            "secagg_dp_noise": 13, "secagg_dp_count": 14,
            # boosting: the rows a round keeps (subsample), keyed by round
            "subsample": 15,
            # FET-GDP: a party's noise on its marginal histograms and row count (both once, at hello), on its
            # leaf class counts (plan leaves), keyed by its count of answered queries
            "gdp_marginals": 16, "gdp_count": 17, "gdp_leaves": 18,
            # drift snapshot: the training rows the deciles are taken from, keyed by row position (counters)
            "drift_deciles": 19,
            # FET-GDP plan marginals: a drawn node's further candidate features, keyed by (tree, depth)
            "fet_marginal_features": 20}

BOOTSTRAP_CHUNK_ROWS = 1 << 16
"""Rows per canonical bootstrap chunk: fixed, so a draw never depends on how rows are cut into blocks."""


def stream(seed: int, purpose: str, *keys: int) -> np.random.Generator:
    """Return the generator for `purpose` and integer `keys` (tree, depth, ...) under `seed`."""
    if purpose not in PURPOSES:
        raise KeyError(f"unknown random purpose {purpose!r}")
    spawn_key = (PURPOSES[purpose], *[int(k) for k in keys])
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(int(seed), spawn_key=spawn_key)))


def bootstrap_chunk_totals(seed: int, tree: int, n_rows: int, n_draws: int) -> np.ndarray:
    """How many of tree `tree`'s `n_draws` bootstrap draws fall in each canonical chunk of rows (int64).

    The draws are uniform integers over all rows from the (seed, tree) stream, counted by chunk (row >> 16):
    integers only, so every CPU gets the same totals. Drawn in pieces, so memory stays bounded.
    """
    rng = stream(seed, "bootstrap", tree)
    n_chunks = -(-n_rows // BOOTSTRAP_CHUNK_ROWS)
    totals = np.zeros(n_chunks, np.int64)
    shift = BOOTSTRAP_CHUNK_ROWS.bit_length() - 1
    for first in range(0, n_draws, 1 << 22):
        draws = rng.integers(0, n_rows, size=min(1 << 22, n_draws - first), dtype=np.int64)
        totals += np.bincount(draws >> shift, minlength=n_chunks)
    return totals


def bootstrap_counts(seed: int, tree: int, n_rows: int, n_draws: int, start: int = 0,
                     stop: int | None = None, totals: np.ndarray | None = None) -> np.ndarray:
    """How often each of rows [start, stop) is drawn into tree `tree`'s bootstrap sample (int32).

    A multinomial draw of `n_draws` over `n_rows` rows, layout-independent: the per-chunk totals
    (`bootstrap_chunk_totals`, pass them as `totals` to draw them once), then each chunk's rows drawn
    uniformly from its own (seed, tree, chunk) stream. Given its total, a chunk's draws are uniform over
    its rows, so the counts are those of `n_draws` uniform draws over all rows; a block of rows computes
    only the chunks it overlaps, and gets the same counts as the whole table's.
    """
    stop = n_rows if stop is None else stop
    if totals is None:
        totals = bootstrap_chunk_totals(seed, tree, n_rows, n_draws)
    out = np.zeros(stop - start, np.int32)
    if stop <= start:
        return out
    for chunk in range(start // BOOTSTRAP_CHUNK_ROWS, (stop - 1) // BOOTSTRAP_CHUNK_ROWS + 1):
        low = chunk * BOOTSTRAP_CHUNK_ROWS
        size = min(BOOTSTRAP_CHUNK_ROWS, n_rows - low)
        rng = stream(seed, "bootstrap_chunk", tree, chunk)
        counts = np.bincount(rng.integers(0, size, size=int(totals[chunk]), dtype=np.int64), minlength=size)
        lo, hi = max(start, low), min(stop, low + size)
        out[lo - start:hi - start] = counts[lo - low:hi - low]
    return out


def counter_key(seed: int, purpose: str, *keys: int) -> np.ndarray:
    """The 128-bit key (2 uint64) of `purpose` and `keys` under `seed`, for the counter-based fedcore.philox.

    For draws addressed by position (a row's LDP words, whichever block holds the row): their words come from
    counters under this key, secret as long as `seed` is. Taken from `stream`'s own SeedSequence.
    """
    return stream(seed, purpose, *keys).bit_generator.seed_seq.generate_state(2, np.uint64)
