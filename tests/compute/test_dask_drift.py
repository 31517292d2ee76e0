"""A batch's drift scores from its blocks on Dask workers equal the in-process scores exactly."""

from __future__ import annotations

import numpy as np

from fedcore.compute.dask_drift import block_scores
from fedcore.drift import batch_scores, training_snapshot
from tests.test_drift import _table


def test_block_scores_equal_the_in_process_scores_whatever_the_blocks(three_workers) -> None:
    snapshot = training_snapshot(_table(3000, 11))
    batch = _table(900, 12, shift=0.3, channel="app")
    expected = batch_scores(snapshot, batch)
    for cuts in ([0, 900], [0, 1, 450, 900], [0, 300, 301, 600, 899, 900]):
        frames = [three_workers.scatter(batch.iloc[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
        assert block_scores(three_workers, frames, len(batch), snapshot) == expected
    assert block_scores(three_workers, [], 0, snapshot) == {}
    assert max(expected.values()) > 0.2 and np.isfinite(list(expected.values())).all()
