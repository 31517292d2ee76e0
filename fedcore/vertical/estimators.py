"""Simulation API: scikit-learn-like estimators that run Federated Forest over an in-process transport.

    parties = split_vertical(df, n_parties=3, label="y")
    model = FederatedForestClassifier(n_estimators=100).fit(parties, label="y")
    proba = model.predict_proba([p.drop(columns="y", errors="ignore") for p in parties])

Each DataFrame is one party's columns of the same aligned rows; exactly one of them holds the label.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from fedcore.data.split import named_parties
from fedcore.errors import NotFittedError
from fedcore.privacy.keyauth import ephemeral_identities
from fedcore.privacy.paillier import PaillierPrivateKey
from fedcore.progress import progress_bar
from fedcore.transport.inprocess import InProcessTransport
from fedcore.trees.budget import resolve_budget
from fedcore.trees.params import ForestParams
from fedcore.vertical.master import VerticalMaster
from fedcore.vertical.party import VerticalParty
from fedcore.vertical.persistence import load_simulation, save_simulation
from fedcore.vertical.validation import validate_prediction_parties, validate_training_parties

PartyFrames = Sequence[pd.DataFrame] | Mapping[str, pd.DataFrame]


class _FederatedForest:
    """Shared machinery of the classifier and the regressor."""

    _task = "classification"

    def __init__(
        self,
        n_estimators: int = 100,
        *,
        criterion: str = "gini",
        max_depth: int | None = None,
        min_samples_split: int = 2,
        min_samples_leaf: int = 1,
        min_impurity_decrease: float = 0.0,
        max_features: str | int | float | None = "sqrt",
        feature_sampling: str = "node",
        bootstrap: bool = True,
        max_samples: int | float | None = None,
        max_bins: int = 255,
        random_state: int = 0,
        tree_batch_size: int | None = None,
        memory_budget_mb: int | None = None,
        privacy: str = "none",
        paillier_key_bits: int = 2048,
        paillier_key: PaillierPrivateKey | None = None,
        prediction: str = "auto",
        predict_batch_rows: int = 8192,
        progress: bool = False,
        record_transcript: bool = False,
        record_payloads: bool = False,
    ) -> None:
        self.params = ForestParams(
            task=self._task, n_estimators=n_estimators, criterion=criterion, max_depth=max_depth,
            min_samples_split=min_samples_split, min_samples_leaf=min_samples_leaf,
            min_impurity_decrease=min_impurity_decrease, max_features=max_features,
            feature_sampling=feature_sampling, bootstrap=bootstrap, max_samples=max_samples,
            max_bins=max_bins, random_state=random_state, tree_batch_size=tree_batch_size,
            memory_budget_mb=memory_budget_mb,
            privacy=privacy, paillier_key_bits=paillier_key_bits,
        )
        self.paillier_key = paillier_key
        self.prediction = prediction
        self.predict_batch_rows = predict_batch_rows
        self.progress = progress
        self.record_transcript = record_transcript
        self.record_payloads = record_payloads
        self.parties_: list[VerticalParty] | None = None
        self.master_: VerticalMaster | None = None
        self.transport_: InProcessTransport | None = None
        self.fit_seconds_: float = 0.0

    def fit(self, parties: PartyFrames, label: str) -> _FederatedForest:
        """Train on party DataFrames (aligned rows, disjoint columns); the one holding `label` is active."""
        frames = named_parties(parties)
        validate_training_parties(frames, label, self._task)
        key = hashlib.sha256(f"fedforest-simulation-{self.params.random_state}".encode()).digest()
        # no certificates in simulation: fresh Ed25519 identities, pinned at every party, sign the sealing keys
        identities = ephemeral_identities(frames) if self.params.privacy == "paillier" else {}
        self.parties_ = [
            VerticalParty(name, frame, label if label in frame.columns else None, feature_key=key,
                          paillier_key=self.paillier_key if label in frame.columns else None,
                          identity=identities.get(name))
            for name, frame in frames.items()
        ]
        self.label_ = label
        self.transport_ = InProcessTransport({p.name: p.handle for p in self.parties_},
                                             record_transcript=self.record_transcript,
                                             record_payloads=self.record_payloads)
        self.master_ = VerticalMaster(self.transport_, self.params, progress=progress_bar() if self.progress else None)
        self.master_.shared_budget = resolve_budget(self.params.memory_budget_mb)  # one process for every role
        started = time.perf_counter()
        self.master_.fit()
        self.fit_seconds_ = time.perf_counter() - started
        self.training_communication_ = self.transport_.stats.to_dict()
        if self.progress:
            sys.stderr.write("\n")
        return self

    def _predict_values(self, parties: PartyFrames, method: str | None = None) -> np.ndarray:
        if self.master_ is None:
            raise NotFittedError(f"{type(self).__name__} is not fitted: call fit() or load() first")
        frames = named_parties(parties)
        n_rows = validate_prediction_parties(frames, {p.name: p.model.column_names for p in self.parties_})
        for party in self.parties_:
            party.set_prediction_data(frames[party.name])
        return self.master_.predict_values(n_rows, method or self.prediction, self.predict_batch_rows)

    @property
    def communication_(self) -> dict:
        """Rounds and bytes so far (training and prediction)."""
        return self.transport_.stats.to_dict() if self.transport_ else {}

    @property
    def label_holder_(self) -> VerticalParty:
        """The active party (it keeps the class names)."""
        return next(p for p in self.parties_ if p.is_label_holder)

    def save(self, path) -> None:
        """Write the master's table, each party's partial model and a manifest to directory `path`."""
        save_simulation(self, path)

    @classmethod
    def load(cls, path):
        """Read a model written by `save` (hashes are verified)."""
        return load_simulation(cls, path)


class FederatedForestClassifier(_FederatedForest):
    """Vertical Federated Forest for classification (binary and multiclass)."""

    _task = "classification"

    def predict_proba(self, parties: PartyFrames, method: str | None = None) -> np.ndarray:
        """Class probabilities (columns in `classes_` order), averaged over trees."""
        return self._predict_values(parties, method)

    def predict(self, parties: PartyFrames, method: str | None = None) -> np.ndarray:
        """Most probable class per row, in the label's original values."""
        return self.classes_[np.argmax(self.predict_proba(parties, method), axis=1)]

    @property
    def classes_(self) -> np.ndarray:
        """Class labels, as known to the label holder."""
        return self.label_holder_.classes_


class FederatedForestRegressor(_FederatedForest):
    """Vertical Federated Forest for regression (squared error)."""

    _task = "regression"

    def __init__(self, n_estimators: int = 100, *, criterion: str = "squared_error", max_features=1.0, **kwargs) -> None:
        super().__init__(n_estimators, criterion=criterion, max_features=max_features, **kwargs)

    def predict(self, parties: PartyFrames, method: str | None = None) -> np.ndarray:
        """Mean prediction of the trees."""
        return self._predict_values(parties, method)[:, 0]


