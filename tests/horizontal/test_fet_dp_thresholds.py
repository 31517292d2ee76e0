"""FET's DP modes draw thresholds in the nodes' boxes (fedcore/horizontal/boxes.py), never in party extremes.

Every split's threshold lies in the box of its node: the feature's declared domain cut by the splits above
on the same path; a feature whose declared domain is a point is never a usable candidate.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.horizontal import FederatedExtraTreesClassifier
from fedcore.horizontal.validation import resolve_feature_ranges
from tests.horizontal.common import horizontal_table, split_rows


@pytest.mark.parametrize("mode", ["gdp", "ldp"])
def test_every_threshold_lies_in_its_nodes_box_and_a_point_domain_never_splits(mode: str) -> None:
    table = horizontal_table(seed=4)
    table["constant"] = 2.5  # declared (2.5, 2.5) by the pooled rows: a point
    frames = split_rows(table, 3)
    model = FederatedExtraTreesClassifier(6, max_depth=6, max_features=None, privacy=mode, epsilon=4.0,
                                          allow_data_ranges=True, random_state=1).fit(frames, "target")
    m, schema = model.model_, model.schema_
    low, high, _ = resolve_feature_ranges(schema, None, {str(i): f for i, f in enumerate(frames)}, True)
    constant = schema.names.index("constant")
    assert (low[constant], high[constant]) == (2.5, 2.5)
    splits = m.feature >= 0
    assert splits.sum() > 6 and not np.any(m.feature == constant)
    offsets = m.tree_offsets()
    narrowed = 0
    for tree in range(m.n_trees):
        stack = [(0, low.copy(), high.copy())]
        while stack:
            node, box_low, box_high = stack.pop()
            row = offsets[tree] + node
            f = int(m.feature[row])
            if f < 0:
                continue
            t = float(m.threshold[row])
            assert box_low[f] <= t < box_high[f], (tree, node, f, t, box_low[f], box_high[f])
            narrowed += bool(box_low[f] > low[f] or box_high[f] < high[f])
            left_high, right_low = box_high.copy(), box_low.copy()
            left_high[f], right_low[f] = t, t
            stack += [(int(m.left[row]), box_low, left_high), (int(m.right[row]), right_low, box_high)]
    assert narrowed > 0  # some split drew in a box its ancestors had cut
