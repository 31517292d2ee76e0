"""The check every binary classifier's `decision_threshold` gets, whatever the setting or algorithm."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.errors import ParameterError


def assert_decides_at_thresholds(model, rows) -> None:
    """A fitted binary `model` (threshold unset) decides on `rows` as `decision_threshold` says.

    Unset: the most probable class; 0.2, 0.5, 0.8: the second class where its probability is at least the
    threshold; 1.5 refused at predict with the exact message. Leaves `model` at threshold 1.5.
    """
    proba = model.predict_proba(rows)
    np.testing.assert_array_equal(model.predict(rows), model.classes_[np.argmax(proba, axis=1)])  # unset
    for threshold in (0.2, 0.5, 0.8):
        model.set_params(decision_threshold=threshold)
        expected = np.where(proba[:, 1] >= threshold, model.classes_[1], model.classes_[0])
        np.testing.assert_array_equal(model.predict(rows), expected)
    with pytest.raises(ParameterError, match=r"^decision_threshold must be a number between 0 and 1 "
                                             r"\(or None\), got 1.5$"):
        model.set_params(decision_threshold=1.5).predict(rows)
