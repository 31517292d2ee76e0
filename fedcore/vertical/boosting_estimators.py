"""Simulation API of vertical gradient boosting (SecureBoost's protocol, plain mode), with XGBoost's names.

    parties = split_vertical(df, n_parties=3, label="y")
    model = FederatedBoostingClassifier(n_estimators=50, max_depth=4).fit(parties, label="y")
    proba = model.predict_proba([p.drop(columns="y", errors="ignore") for p in parties])

The same engine as `FederatedForestClassifier` (the vertical master and parties, one grower), run with
`BoostingParams`: each round the label holder sends the passive parties its rows' gradients and hessians
in place of labels, as they are or (`privacy="paillier"` or `"ou"`, SecureBoost) encrypted and packed.
`early_stopping_rounds` with `fit(..., eval_set=(parties, y))` keeps the rounds up to the best held-out
log-loss or RMSE (XGBoost's rule, `fedcore.trees.early_stopping`; the flows score the label holder's
held-out rows the same way). `save` / `load` as the forests'; `feature_importances_` per party (gain
importances). `compute=` and `block_rows=` as the forests': every party's rows on a Dask cluster, the same
model (issue #29, `fedcore.compute.dask_vertical`).
"""

from __future__ import annotations

from typing import Any, Self

import numpy as np
import pandas as pd

from fedcore.algorithms import BOOSTING
from fedcore.errors import ParameterError
from fedcore.estimator_api import RegressorMixin, check_fitted
from fedcore.metrics import class_codes
from fedcore.privacy.homomorphic import AdditivePrivateKey
from fedcore.privacy.settings import EncryptedLabels, PrivacySetting, privacy_with
from fedcore.trees.boosting import BoostingParams
from fedcore.trees.early_stopping import kept_rounds, round_scores
from fedcore.trees.params import ForestParams
from fedcore.vertical.estimators import PartyFrames, _Classifier, _FederatedForest


class _FederatedBoosting(_FederatedForest):
    """Shared machinery of the boosting classifier and regressor (the forest's fit, boosting's parameters)."""

    _algorithm = BOOSTING
    n_estimators: int
    learning_rate: float
    max_depth: int | None
    min_child_weight: float
    reg_lambda: float
    gamma: float
    subsample: float
    colsample_bytree: float
    early_stopping_rounds: int | None
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
        early_stopping_rounds: int | None = None,
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
        compute: Any = None,
        block_rows: int | None = None,
    ) -> None:
        """Store the parameters as given (XGBoost's names; n_estimators counts rounds); `fit` checks them.

        `privacy`, `key_bits` and `label_key` as the forest's: `paillier` or `ou` encrypt each round's (g, h).
        `compute`, `block_rows`: where each party's rows are, as the forest's (None: in process).
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
                              early_stopping_rounds=self.early_stopping_rounds,
                              random_state=self.random_state, privacy=setting.mode, key_bits=key_bits)

    @classmethod
    def _constructor_params(cls, params: ForestParams) -> dict[str, Any]:
        """XGBoost's names of saved BoostingParams (colsample_bytree is the engine's max_features)."""
        assert isinstance(params, BoostingParams), "a boosting model is saved with BoostingParams"
        names = ("n_estimators", "learning_rate", "max_depth", "min_child_weight", "reg_lambda", "gamma",
                 "subsample", "early_stopping_rounds", "max_bins", "random_state")
        return {**{name: getattr(params, name) for name in names}, "colsample_bytree": params.max_features}

    def fit(self, parties: PartyFrames, label: str,
            eval_set: tuple[PartyFrames, np.ndarray] | None = None) -> Self:
        """Train on party DataFrames, as the forests do; with `early_stopping_rounds`, score `eval_set`.

        `eval_set`: (party frames of held-out rows without the label, their labels). The model keeps the
        rounds up to the best held-out score (`best_iteration_`, zero-based, as XGBoost's).
        """
        if (self.early_stopping_rounds is None) != (eval_set is None):
            raise ParameterError("early stopping needs both early_stopping_rounds and eval_set=(parties, y): "
                                 "the held-out rows it scores")
        super().fit(parties, label)
        combination = self.master_.combination
        self.best_iteration_ = self.master_.trained_structure.n_trees // combination.trees_per_round - 1
        if eval_set is not None and self.early_stopping_rounds is not None:
            frames, y = eval_set
            values = self.master_.tree_values(self._load_rows(frames))
            y = np.asarray(y)
            if len(y) != len(values):
                raise ParameterError(f"eval_set has {len(values)} rows and {len(y)} labels")
            classes = self.label_holder_.classes_
            codes = class_codes(y, classes) if classes is not None else y
            rounds = kept_rounds(round_scores(combination, codes, values), self.early_stopping_rounds)
            self.master_.keep_trees(rounds * combination.trees_per_round)
            for party in self.parties_:  # each with its own splits' importance shares over the kept trees
                party.keep_first_trees(rounds * combination.trees_per_round,
                                       self.master_.kept_shares(party.name))
            self.best_iteration_ = rounds - 1
        return self

    @property
    def feature_importances_(self) -> dict[str, pd.Series]:
        """Gain importances, per party: {party name: Series over that party's feature columns}.

        Each feature's total split gain as a share of every split's in the model (XGBoost's `total_gain`,
        normalised), from the shares the master sent each party of its own splits
        (`fedcore.vertical.importances`): together they sum to 1, each party's alone to its share. Over the
        rounds kept (with early stopping: as a fit of only those rounds).
        """
        check_fitted(self)
        out = {}
        for party in self.parties_:
            assert party.importances is not None, "finalize gives every party its gain importances"
            out[party.name] = pd.Series(party.importances, index=pd.Index(party.trained_model.column_names),
                                        name="importance")
        return out


class FederatedBoostingClassifier(_Classifier, _FederatedBoosting):
    """Vertical gradient boosting for classification: logistic (two classes) or softmax (K trees a round)."""

    _task = "classification"
    decision_threshold: float | None

    def __init__(self, n_estimators: int = 100, *, learning_rate: float = 0.3, max_depth: int | None = 6,
                 min_child_weight: float = 1.0, reg_lambda: float = 1.0, gamma: float = 0.0,
                 subsample: float = 1.0, colsample_bytree: float = 1.0,
                 early_stopping_rounds: int | None = None, max_bins: int = 255, random_state: int = 0,
                 privacy: str | dict[str, Any] | PrivacySetting = "none", key_bits: int | None = None,
                 label_key: AdditivePrivateKey | None = None, prediction: str = "auto",
                 predict_batch_rows: int = 8192, progress: bool = False, record_transcript: bool = False,
                 record_payloads: bool = False, compute: Any = None, block_rows: int | None = None,
                 decision_threshold: float | None = None) -> None:
        """The shared parameters, and `decision_threshold` (binary labels) as the forest classifiers'."""
        self._store_params(locals())


class FederatedBoostingRegressor(RegressorMixin, _FederatedBoosting):
    """Vertical gradient boosting for regression (squared error)."""

    _task = "regression"

    def predict(self, parties: PartyFrames, method: str | None = None) -> np.ndarray:
        """Base score plus the trees' leaf weights."""
        return self._predict_values(parties, method)[:, 0]
