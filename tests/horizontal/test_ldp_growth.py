"""FET with label LDP: leaves hold enough reports for their class estimate, and branch sizes are exact."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedcore.errors import ParameterError
from fedcore.horizontal.estimators import FederatedExtraTreesClassifier
from fedcore.horizontal.model import NO_CHILD
from fedcore.privacy.ldp import LabelLDP
from tests.horizontal.common import split_rows


def many_class_table(n_rows: int = 1500, n_classes: int = 26, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_classes, 4)) * 3
    label = rng.integers(0, n_classes, n_rows)
    frame = pd.DataFrame(centres[label] + rng.normal(size=(n_rows, 4)), columns=[f"x{i}" for i in range(4)])
    frame["y"] = np.array([f"c{c:02d}" for c in label], dtype=object)
    return frame


def leaf_weights(forest) -> np.ndarray:
    return forest.weight[forest.left == NO_CHILD]


def test_leaf_floor_follows_the_design() -> None:
    bloom = LabelLDP(mechanism="bloom")
    assert bloom.leaf_floor(2) == 1 and bloom.leaf_floor(6) == 1  # few classes: a row is enough
    assert bloom.leaf_floor(26) == 3  # 64 bits, standard error 1.55 per report: ceil(1.55^2)
    # the default, epsilon 2: OUE for 26 classes (standard error 1.29 per report), k-RR for 6 (0.99)
    assert LabelLDP().leaf_floor(26) == 2 and LabelLDP().leaf_floor(6) == 1
    assert LabelLDP(min_leaf_reports=1).leaf_floor(26) == 1
    with pytest.raises(ParameterError, match="min_leaf_reports must be an integer >= 1, got 0"):
        LabelLDP(min_leaf_reports=0)


@pytest.mark.parametrize(("ldp", "floor"), [(LabelLDP(mechanism="bloom"), 3),
                                            (LabelLDP(min_leaf_reports=1), 1),
                                            (LabelLDP(min_leaf_reports=5), 5)])
def test_no_leaf_holds_fewer_rows_than_the_floor(ldp: LabelLDP, floor: int) -> None:
    parties = split_rows(many_class_table(), 3)
    model = FederatedExtraTreesClassifier(n_estimators=4, privacy="ldp", allow_data_ranges=True, ldp=ldp,
                                          random_state=1).fit(parties, label="y")
    weights = leaf_weights(model.model_)
    # weights are the exact branch sizes the parties sent, not the estimated counts' rounded sum
    np.testing.assert_array_equal(weights, np.round(weights))
    assert weights.min() >= floor
    if floor == 1:
        assert (weights < 3).any()  # the floor, not the data, stopped the default run


def test_a_min_samples_leaf_above_the_floor_is_kept() -> None:
    parties = split_rows(many_class_table(), 2)
    model = FederatedExtraTreesClassifier(n_estimators=3, privacy="ldp", allow_data_ranges=True,
                                          min_samples_leaf=6, random_state=2).fit(parties, label="y")
    assert leaf_weights(model.model_).min() >= 6


def test_krr_trains_and_reports_its_mechanism() -> None:
    parties = split_rows(many_class_table(n_classes=8), 3)
    ldp = LabelLDP(mechanism="krr", report_epsilon=6.0)
    model = FederatedExtraTreesClassifier(n_estimators=3, privacy="ldp", allow_data_ranges=True, ldp=ldp,
                                          random_state=3).fit(parties, label="y")
    report = model.privacy_report_
    assert report["ldp_mechanism"] == {"mechanism": "krr", "epsilon": 6.0, "estimator": "nnls"}
    assert report["min_samples_leaf"] == model.master_.min_samples_leaf == LabelLDP(
        mechanism="krr", report_epsilon=6.0).leaf_floor(8)
    # one report per row, reused for all 3 trees: the row's epsilon is that report's
    assert (report["mechanism"], report["epsilon"], report["epsilon_total"], report["delta"]) == \
        ("krr", 6.0, 6.0, 0.0)
    assert report["reports_per_row"] > 1
    truth = many_class_table(n_classes=8)
    # epsilon 6 on 8 classes reports the true class 98% of the time: the forest fits its training rows
    assert (model.predict(truth.drop(columns=["y"])) == truth["y"]).mean() > 0.8
