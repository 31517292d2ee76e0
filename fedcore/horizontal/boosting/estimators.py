"""Simulation API of horizontal gradient boosting under secure aggregation, with XGBoost's names.

    parties = [frame.iloc[:300], frame.iloc[300:]]          # same columns, different rows
    model = HorizontalBoostingClassifier(50, max_depth=4, feature_ranges=ranges).fit(parties, label="y")
    model.predict(new_rows)                                  # local: every party holds the whole model

As the horizontal forests, the estimators run every role in process over the in-process transport; the
bins come from the declared domains (`feature_ranges`; `allow_data_ranges=True` takes the pooled rows' extent
in a simulation). The model is the single-party model, byte for byte, whatever the parties (fixed-point
gradients, `fixedpoint.py`), in process or with every party's rows on a Dask cluster (`compute=`, as the
forests'). Not yet: subsample < 1 (rows have no global position to draw by), saving, early stopping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from fedcore.algorithms import HORIZONTAL_BOOSTING
from fedcore.errors import ParameterError
from fedcore.estimator_api import RegressorMixin, check_fitted
from fedcore.horizontal.boosting.fixedpoint import FRACTION_BITS, RING_BITS
from fedcore.horizontal.boosting.master import HorizontalBoostingMaster
from fedcore.horizontal.boosting.params import DEFAULT_BINS, check_subsample
from fedcore.horizontal.boosting.party import HorizontalBoostingParty
from fedcore.horizontal.estimators import _Classifier, _HorizontalForest
from fedcore.trees.boosting import BoostingParams

MISSING_BIN_RANGES = (
    "horizontal boosting cuts the declared feature domains into its bins, never the data: pass "
    "feature_ranges={column: (low, high)} for the numeric columns (from the data contracts), or "
    "allow_data_ranges=True in a simulation to use the pooled data's ranges")


class _HorizontalBoosting(_HorizontalForest):
    """Shared machinery of the horizontal boosting classifier and regressor."""

    n_estimators: int
    learning_rate: float
    min_child_weight: float
    reg_lambda: float
    gamma: float
    subsample: float
    colsample_bytree: float
    max_bins: int
    secure_aggregation: bool

    def __init__(self, n_estimators: int = 100, *, learning_rate: float = 0.3, max_depth: int | None = 6,
                 min_child_weight: float = 1.0, reg_lambda: float = 1.0, gamma: float = 0.0,
                 subsample: float = 1.0, colsample_bytree: float = 1.0, max_bins: int = DEFAULT_BINS,
                 feature_ranges: Mapping[str, tuple[float, float]] | None = None,
                 allow_data_ranges: bool = False, categories: Mapping[str, Sequence] | None = None,
                 secure_aggregation: bool = True, random_state: int = 0, progress: bool = False,
                 record_transcript: bool = False, record_payloads: bool = False, compute: Any = None,
                 block_rows: int | None = None) -> None:
        """Store the parameters as given (XGBoost's names; n_estimators counts rounds); `fit` checks them."""
        self._store_params(locals())

    def _forest_params(self) -> BoostingParams:  # type: ignore[override]
        """BoostingParams of the constructor parameters: the one place they are checked."""
        check_subsample(self.subsample)
        return BoostingParams(task=self._task, n_estimators=self.n_estimators,
                              learning_rate=self.learning_rate, max_depth=self.max_depth,
                              min_child_weight=self.min_child_weight, reg_lambda=self.reg_lambda,
                              gamma=self.gamma, subsample=self.subsample, max_features=self.colsample_bytree,
                              max_bins=self.max_bins, random_state=self.random_state)

    def _check_settings(self) -> None:
        if self.feature_ranges is None and not self.allow_data_ranges:
            raise ParameterError(MISSING_BIN_RANGES)

    def _check_before_fit(self, schema, frames) -> None:
        self._resolve_domains(schema, frames)

    def _make_parties(self, frames, schema):
        identities = {}
        if self.secure_aggregation and len(frames) > 1:
            from fedcore.privacy.keyauth import ephemeral_identities

            identities = ephemeral_identities(frames)
        return [HorizontalBoostingParty(name, schema=schema, low=self._low, high=self._high,
                                        max_bins=self.max_bins, secure=bool(self.secure_aggregation),
                                        identity=identities.get(name), **self._rows(name, frame, schema))
                for name, frame in frames.items()]

    def _make_master(self, transport, schema):
        return HorizontalBoostingMaster(transport, self._params, schema, low=self._low, high=self._high,
                                        secure=bool(self.secure_aggregation),
                                        progress=self._progress_callback())

    @property
    def feature_importances_(self) -> np.ndarray:
        """Gain importances over `feature_names_in_`, summing to 1: each feature's share of the split gains.

        XGBoost's `total_gain`, normalised (its `feature_importances_` default is the mean gain per split).
        The master chose every split by its gain from the summed histograms; every institution gets the same
        vector with the model's signed manifest.
        """
        check_fitted(self)
        return self.master_.importances()

    @property
    def privacy_report_(self) -> dict[str, Any]:
        """What the master saw in this run."""
        check_fitted(self)
        single = len(self.parties_) == 1
        if single:
            statistics = "plain histograms of the single party (no peers to mask with)"
        elif not self.secure_aggregation:
            statistics = "plain per-party histograms (secure aggregation switched off: a baseline only)"
        else:
            statistics = ("only the sum over all parties of each node's per feature and bin (count, g, h), "
                          "by "
                          f"pairwise-mask secure aggregation in the {RING_BITS}-bit ring")
        return {"algorithm": HORIZONTAL_BOOSTING.id, "setting": HORIZONTAL_BOOSTING.setting,
                "mode": "secagg" if self.secure_aggregation else "none", "label_statistics": statistics,
                "base_score": "the sum over all parties of class counts (or rows and label sum)",
                "fixed_point_bits": FRACTION_BITS, "bins": "equal cells of the declared domains",
                "feature_ranges": self.ranges_source_, "parties": len(self.parties_),
                "queries": self.master_.levels + 1, "plain_single_party": single}


class HorizontalBoostingClassifier(_Classifier, _HorizontalBoosting):
    """Horizontal gradient boosting for classification: logistic (2 classes) or softmax (K trees a round)."""

    _task = "classification"
    decision_threshold: float | None

    def __init__(self, n_estimators: int = 100, *, learning_rate: float = 0.3, max_depth: int | None = 6,
                 min_child_weight: float = 1.0, reg_lambda: float = 1.0, gamma: float = 0.0,
                 subsample: float = 1.0, colsample_bytree: float = 1.0, max_bins: int = DEFAULT_BINS,
                 feature_ranges: Mapping[str, tuple[float, float]] | None = None,
                 allow_data_ranges: bool = False, categories: Mapping[str, Sequence] | None = None,
                 secure_aggregation: bool = True, random_state: int = 0, progress: bool = False,
                 record_transcript: bool = False, record_payloads: bool = False, compute: Any = None,
                 block_rows: int | None = None, decision_threshold: float | None = None) -> None:
        """The shared parameters, and `decision_threshold` (binary labels) as the forest classifiers'."""
        self._store_params(locals())


class HorizontalBoostingRegressor(RegressorMixin, _HorizontalBoosting):
    """Horizontal gradient boosting for regression (squared error)."""

    _task = "regression"

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        """Base score plus the trees' leaf weights."""
        return self._predict_values(frame)[:, 0]
