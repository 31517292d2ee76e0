"""The vertical bootstrap: a multinomial draw that any cut of the rows into blocks reproduces exactly."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.randomness import BOOTSTRAP_CHUNK_ROWS, bootstrap_chunk_totals, bootstrap_counts

N_ROWS = 2 * BOOTSTRAP_CHUNK_ROWS + 3000  # three chunks, the last one short


@pytest.mark.parametrize("cuts", [[1], [40_000, 70_000, 131_072], [65_535, 65_536, 65_537, 100_000]])
def test_any_cut_into_blocks_gives_the_whole_tables_counts(cuts: list[int]) -> None:
    whole = bootstrap_counts(5, 2, N_ROWS, N_ROWS - 17)
    totals = bootstrap_chunk_totals(5, 2, N_ROWS, N_ROWS - 17)
    edges = [0, *cuts, N_ROWS]
    blocks = [bootstrap_counts(5, 2, N_ROWS, N_ROWS - 17, start, stop, totals)
              for start, stop in zip(edges[:-1], edges[1:], strict=True)]
    assert whole.dtype == np.int32 and whole.sum() == N_ROWS - 17
    np.testing.assert_array_equal(np.concatenate(blocks), whole)
    assert not np.array_equal(whole, bootstrap_counts(5, 3, N_ROWS, N_ROWS - 17))  # trees differ


def test_the_counts_are_a_uniform_multinomial() -> None:
    """Over 30 trees the counts behave as n uniform draws with replacement.

    Chunk totals within 5 sigma of their binomial means, per-row sums pass a chi-square test against
    uniform, and the share of rows never drawn is (1 - 1/n)^n.
    """
    n_trees, n_draws = 30, N_ROWS
    counts = np.stack([bootstrap_counts(9, t, N_ROWS, n_draws) for t in range(n_trees)]).astype(np.int64)
    assert np.all(counts.sum(axis=1) == n_draws)
    p_last = 3000 / N_ROWS
    last = counts[:, 2 * BOOTSTRAP_CHUNK_ROWS:].sum()
    mean, sd = n_trees * n_draws * p_last, np.sqrt(n_trees * n_draws * p_last * (1 - p_last))
    assert abs(last - mean) < 5 * sd
    per_row = counts.sum(axis=0)
    expected = n_trees * n_draws / N_ROWS
    chi2 = float(((per_row - expected) ** 2 / expected).sum())
    df = N_ROWS - 1
    assert abs(chi2 - df) < 5 * np.sqrt(2 * df)
    zero_share = float((counts == 0).mean())
    p_zero = (1 - 1 / N_ROWS) ** n_draws
    assert abs(zero_share - p_zero) < 5 * np.sqrt(p_zero * (1 - p_zero) / counts.size)
