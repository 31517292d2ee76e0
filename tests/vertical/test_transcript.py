"""Round counts of vertical Federated Forest.

They grow with depth only (DESIGN principle 1). What crosses the wire in each vertical mode is asserted by the
mode table of tests/test_wire_invariants.py.
"""

from __future__ import annotations

import pytest

from fedcore.data.split import split_vertical
from fedcore.vertical.estimators import FederatedForestClassifier
from tests.conftest import mixed_table


@pytest.mark.parametrize("n_estimators,n_rows", [(3, 300), (12, 300), (3, 900)])
def test_training_rounds_grow_with_depth_only(n_estimators: int, n_rows: int) -> None:
    depth = 4
    table = mixed_table(n_rows=n_rows, seed=22, n_classes=2)
    parties = split_vertical(table, 2, label="target", seed=0)
    model = FederatedForestClassifier(n_estimators=n_estimators, max_depth=depth).fit(parties, label="target")
    assert model.master_.structure.max_depth() == depth
    # setup, labels, configure, finalize + per batch: begin (the first level's find), apply, then
    # (find + apply) per further split level, final find
    assert model.communication_["rounds"] == 4 + (2 * depth + 1)


def test_tree_batches_add_rounds_per_batch() -> None:
    table = mixed_table(n_rows=300, seed=23, n_classes=2)
    parties = split_vertical(table, 2, label="target", seed=0)
    model = FederatedForestClassifier(n_estimators=6, max_depth=3,
                                      tree_batch_size=2).fit(parties, label="target")
    assert model.communication_["rounds"] == 4 + 3 * (2 * 3 + 1)
