"""Simulation API of vertical gradient boosting (SecureBoost's protocol, plain mode), with XGBoost's names.

    parties = split_vertical(df, n_parties=3, label="y")
    model = FederatedBoostingClassifier(n_estimators=50, max_depth=4).fit(parties, label="y")
    proba = model.predict_proba([p.drop(columns="y", errors="ignore") for p in parties])

The same engine as `FederatedForestClassifier` (the vertical master and parties, one grower), run with
`BoostingParams`: each round the label holder sends the passive parties its rows' gradients and hessians
in place of labels, as they are or (`privacy="paillier"` or `"ou"`, SecureBoost) encrypted and packed.
Not yet: Dask parties, saving a model, importances, early stopping.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedcore.algorithms import BOOSTING
from fedcore.estimator_api import ClassifierMixin, RegressorMixin
from fedcore.privacy.homomorphic import AdditivePrivateKey
from fedcore.privacy.settings import EncryptedLabels, PrivacySetting, privacy_with
from fedcore.trees.boosting import BoostingParams
from fedcore.vertical.estimators import PartyFrames, _FederatedForest


class _FederatedBoosting(_FederatedForest):
    """Shared machinery of the boosting classifier and regressor (the forest's fit, boosting's parameters)."""

    compute = None  # no Dask (not constructor parameters)
    block_rows = None
    n_estimators: int
    learning_rate: float
    max_depth: int | None
    min_child_weight: float
    reg_lambda: float
    gamma: float
    subsample: float
    colsample_bytree: float
    max_bins: int
    random_state: int
    privacy: Any
    key_bits: int | None
    label_key: AdditivePrivateKey | None

    def __init__(
        self,
        n_estimators: int = 100,
        *,
        learning_rate: float = 0.3,
        max_depth: int | None = 6,
        min_child_weight: float = 1.0,
        reg_lambda: float = 1.0,
        gamma: float = 0.0,
        subsample: float = 1.0,
        colsample_bytree: float = 1.0,
        max_bins: int = 255,
        random_state: int = 0,
        privacy: str | dict[str, Any] | PrivacySetting = "none",
        key_bits: int | None = None,
        label_key: AdditivePrivateKey | None = None,
        prediction: str = "auto",
        predict_batch_rows: int = 8192,
        progress: bool = False,
        record_transcript: bool = False,
        record_payloads: bool = False,
    ) -> None:
        """Store the parameters as given (XGBoost's names; n_estimators counts rounds); `fit` checks them.

        `privacy`, `key_bits` and `label_key` as the forest's: `paillier` or `ou` encrypt each round's (g, h).
        """
        self._store_params(locals())

    def _forest_params(self) -> BoostingParams:
        """BoostingParams of the constructor parameters: the one place they are checked."""
        setting = privacy_with(self.privacy, BOOSTING, key_bits=self.key_bits)
        key_bits = setting.key_bits if isinstance(setting, EncryptedLabels) else None
        return BoostingParams(task=self._task, n_estimators=self.n_estimators,
                              learning_rate=self.learning_rate, max_depth=self.max_depth,
                              min_child_weight=self.min_child_weight,
                              reg_lambda=self.reg_lambda, gamma=self.gamma, subsample=self.subsample,
                              max_features=self.colsample_bytree, max_bins=self.max_bins,
                              random_state=self.random_state, privacy=setting.mode, key_bits=key_bits)

    @property
    def feature_importances_(self) -> dict:
        """Not yet for boosting (issue #33)."""
        raise AttributeError(f"{BOOSTING.title} has no feature_importances_ yet (issue #33)")

    def save(self, path) -> None:
        """Not yet for boosting: the model registry and artifacts know forests only (issue #32)."""
        raise NotImplementedError(f"{BOOSTING.title} models cannot be saved yet (issue #32)")

    @classmethod
    def load(cls, path):
        """Not yet for boosting (see `save`)."""
        raise NotImplementedError(f"{BOOSTING.title} models cannot be loaded yet (issue #32)")


class FederatedBoostingClassifier(ClassifierMixin, _FederatedBoosting):
    """Vertical gradient boosting for classification: logistic (two classes) or softmax (K trees a round)."""

    _task = "classification"

    def predict_proba(self, parties: PartyFrames, method: str | None = None) -> np.ndarray:
        """Class probabilities (columns in `classes_` order): the link of the summed margins."""
        return self._predict_values(parties, method)

    def predict(self, parties: PartyFrames, method: str | None = None) -> np.ndarray:
        """Most probable class per row, in the label's original values."""
        return self.classes_[np.argmax(self.predict_proba(parties, method), axis=1)]

    @property
    def classes_(self) -> np.ndarray:
        """Class labels, as known to the label holder."""
        classes = self.label_holder_.classes_
        assert classes is not None, "a fitted classifier's label holder has its classes"
        return classes


class FederatedBoostingRegressor(RegressorMixin, _FederatedBoosting):
    """Vertical gradient boosting for regression (squared error)."""

    _task = "regression"

    def predict(self, parties: PartyFrames, method: str | None = None) -> np.ndarray:
        """Base score plus the trees' leaf weights."""
        return self._predict_values(parties, method)[:, 0]
