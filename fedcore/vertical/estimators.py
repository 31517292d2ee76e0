"""Simulation API: scikit-learn-shaped estimators that run Federated Forest over an in-process transport.

    parties = split_vertical(df, n_parties=3, label="y")
    model = FederatedForestClassifier(n_estimators=100).fit(parties, label="y")
    proba = model.predict_proba([p.drop(columns="y", errors="ignore") for p in parties])

Each DataFrame is one party's columns of the same aligned rows; exactly one of them holds the label.
The estimators follow scikit-learn's conventions (`fedcore.estimator_api`): the constructor only stores
its parameters (checked by `fit`, through `ForestParams`), `get_params` / `set_params` / `clone` work,
fitted attributes end in `_`, and `score(parties, y)` takes what `predict` takes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import pandas as pd

from fedcore.algorithms import FOREST
from fedcore.compute import DEFAULT_BLOCK_ROWS
from fedcore.compute.cluster import DaskCompute, compute_from_spec, held_cluster
from fedcore.compute.dask_vertical import DaskVerticalRows
from fedcore.data.split import named_parties
from fedcore.estimator_api import (
    ClassifierMixin,
    RegressorMixin,
    check_fitted,
    impurity_importances,
    node_impurity_decrease,
)
from fedcore.privacy.homomorphic import AdditivePrivateKey
from fedcore.privacy.keyauth import ephemeral_identities
from fedcore.privacy.schemes import ENCRYPTED_MODES
from fedcore.privacy.settings import EncryptedLabels, PrivacySetting, privacy_with
from fedcore.simulated_fit import SimulatedFederation
from fedcore.trees.params import ForestParams
from fedcore.vertical.master import VerticalMaster
from fedcore.vertical.party import VerticalParty
from fedcore.vertical.persistence import load_simulation, save_simulation
from fedcore.vertical.rows import LocalRows
from fedcore.vertical.validation import validate_prediction_parties, validate_training_parties

if TYPE_CHECKING:
    from distributed import Client

PartyFrames = Sequence[pd.DataFrame] | Mapping[str, pd.DataFrame]

FOREST_PARAMS = tuple(f.name for f in fields(ForestParams) if f.name != "task")
"""The constructor parameters that are ForestParams fields (the others drive the simulation)."""


class _FederatedForest(SimulatedFederation):
    """Shared machinery of the classifier and the regressor."""

    _fitted_attribute = "master_"
    _algorithm = FOREST
    master_: VerticalMaster
    # constructor parameters read by name (`_store_params` sets them all; FOREST_PARAMS are read by getattr)
    label_key: AdditivePrivateKey | None
    prediction: str
    predict_batch_rows: int
    compute: Any
    """Where each party does its row work: None (in process), "local:N" (a LocalCluster of N workers for
    the fit), a Dask scheduler address, or a `distributed.Client` (`fedcore.compute`). Every party's rows
    go to that cluster in blocks of `block_rows` rows; the model is the in-process one (the forests and
    boosting, either task, plain or encrypted labels; issue #29)."""
    block_rows: int | None

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
        privacy: str | Mapping[str, Any] | PrivacySetting = "none",
        key_bits: int | None = None,
        label_key: AdditivePrivateKey | None = None,
        prediction: str = "auto",
        predict_batch_rows: int = 8192,
        progress: bool = False,
        record_transcript: bool = False,
        record_payloads: bool = False,
        compute: Any = None,
        block_rows: int | None = None,
        decision_threshold: float | None = None,
    ) -> None:
        self._store_params(locals())

    def _forest_params(self) -> ForestParams:
        """ForestParams of the constructor parameters: the one place they are checked."""
        values = {name: getattr(self, name) for name in FOREST_PARAMS}
        # `privacy`: a mode name, a mapping or a PrivacySetting; `key_bits` a shorthand for its field
        setting = privacy_with(values.pop("privacy"), FOREST, key_bits=values.pop("key_bits"))
        key_bits = setting.key_bits if isinstance(setting, EncryptedLabels) else None
        return ForestParams(task=self._task, privacy=setting.mode, key_bits=key_bits, **values)

    def fit(self, parties: PartyFrames, label: str) -> Self:
        """Train on party DataFrames (aligned rows, disjoint columns); the one holding `label` is active."""
        params = self._forest_params()
        frames = named_parties(parties)
        validate_training_parties(frames, label, self._task)
        key = self._feature_key(params.random_state)
        # no certificates in simulation: fresh Ed25519 identities, pinned at every party, sign the sealing
        # keys
        identities = ephemeral_identities(frames) if params.privacy in ENCRYPTED_MODES else {}
        members = [
            VerticalParty(name, frame, label if label in frame.columns else None, feature_key=key,
                          label_key=self.label_key if label in frame.columns else None,
                          identity=identities.get(name))
            for name, frame in frames.items()
        ]
        with held_cluster(self._compute()) as cluster:  # let go when the fit ends or fails
            try:
                if cluster is not None:
                    for member in members:
                        member.rows = DaskVerticalRows(member.features, cluster.client, self._block_rows,
                                                       member.name)
                transport = self._in_process_transport(members)
                master = VerticalMaster(transport, params, progress=self._progress_callback())
                self._fit_master(master, params.memory_budget_mb)
            finally:  # the rows leave the cluster with the fit: the model predicts in process
                if cluster is not None:
                    for member in members:
                        member.rows.close()
                        member.rows = LocalRows(member.features)
        self.training_communication_ = transport.stats.to_dict()
        self.label_ = label
        self.parties_ = members
        self.transport_ = transport
        self.master_ = master  # last: its presence marks the estimator fitted
        return self

    def _feature_key(self, random_state: int) -> bytes:
        """The key the parties derive opaque feature ids from (agents: from the consortium key).

        It orders the features at the master, so it decides ties between equal gains.
        """
        return hashlib.sha256(f"fedforest-simulation-{random_state}".encode()).digest()

    def _compute(self) -> DaskCompute | Client | None:
        """Where the fit runs (`compute`), or None in process (every vertical model runs on Dask)."""
        compute = compute_from_spec(self.compute, self.block_rows)
        if compute is None:
            return None
        self._block_rows = (self.block_rows if self.block_rows is not None
                            else getattr(compute, "block_rows", DEFAULT_BLOCK_ROWS))
        return compute

    def _predict_values(self, parties: PartyFrames, method: str | None = None) -> np.ndarray:
        n_rows = self._load_rows(parties)
        try:
            return self.master_.predict_values(n_rows, method or self.prediction, self.predict_batch_rows)
        finally:
            self.transport_.close()  # the rounds' threads end with the prediction

    def _load_rows(self, parties: PartyFrames) -> int:
        """Give every party its columns of the rows to predict (checked against the model); their count."""
        check_fitted(self)
        frames = named_parties(parties)
        columns = {p.name: p.trained_model.column_names for p in self.parties_}
        n_rows = validate_prediction_parties(frames, columns)
        for party in self.parties_:
            party.set_prediction_data(frames[party.name])
        return n_rows

    @classmethod
    def _constructor_params(cls, params: ForestParams) -> dict[str, Any]:
        """The constructor arguments that give `params` back (what `load` rebuilds the estimator with)."""
        return {k: v for k, v in params.to_dict().items() if k != "task"}

    @property
    def label_holder_(self) -> VerticalParty:
        """The active party (it keeps the class names)."""
        check_fitted(self)
        return next(p for p in self.parties_ if p.is_label_holder)

    @property
    def n_features_in_(self) -> int:
        """Number of feature columns over all parties."""
        return len(self.feature_names_in_)

    @property
    def feature_names_in_(self) -> np.ndarray:
        """The parties' feature columns, party after party (the order of the assembled importances)."""
        check_fitted(self)
        return np.array([c for p in self.parties_ for c in p.trained_model.column_names], dtype=object)

    @property
    def feature_importances_(self) -> dict[str, pd.Series]:
        """Impurity-based importances, per party: {party name: Series over that party's feature columns}.

        scikit-learn's definition (the weighted impurity decrease of each split, as a share of its tree's
        total, averaged over the trees), computed from the node weights (bootstrap-weighted row counts) and
        values (class probabilities or target means) of the master's tree structure, which come from the
        label holder's statistics: exact, not estimated (see `fedcore.estimator_api.node_impurity_decrease`).

        A party knows which feature each of its own splits uses, and no other party's: each party gets its
        own features' entries of the forest's importance vector, and they do not sum to 1 on their own.
        Only the simulation, which holds every party, can assemble the global vector,
        `pd.concat(model.feature_importances_.values())` (in `feature_names_in_` order), which sums to 1.
        """
        check_fitted(self)
        s = self.master_.trained_structure
        decrease = node_impurity_decrease(s.tree, s.left, s.right, s.weight, s.value, self.params_.criterion,
                                          s.n_trees)
        models = {p.name: p.trained_model for p in self.parties_}
        return {name: pd.Series(impurity_importances(decrease, s.tree, s.n_trees, m.feature,
                                                     len(m.column_names)),
                                index=pd.Index(m.column_names), name="importance")
                for name, m in models.items()}

    def save(self, path) -> None:
        """Write the master's table, each party's partial model and a manifest to directory `path`."""
        save_simulation(self, path)

    @classmethod
    def load(cls, path):
        """Read a model written by `save` (hashes are verified)."""
        return load_simulation(cls, path)

    def to_onnx(self) -> Any:
        """Refused, naming why: no single place holds a vertical model's thresholds (docs/design.md, Export).

        `save` writes the master's table and each party's own splits; in a federation, `fedforest models
        export --format structure` writes what one registry holds.
        """
        from fedcore.errors import ArtifactError
        from fedcore.models.export import NOT_EXPORTABLE

        raise ArtifactError(f"{type(self).__name__} is a vertical model: {NOT_EXPORTABLE}")

    def to_treelite(self) -> Any:
        """Refused as `to_onnx` is."""
        return self.to_onnx()


class _Classifier(ClassifierMixin, _FederatedForest):
    """Class predictions of a fitted vertical classifier (forest or boosting), from the label holder."""

    def predict_proba(self, parties: PartyFrames, method: str | None = None) -> np.ndarray:
        """Class probabilities (`classes_` order): the trees' mean, or boosting's link of their sum."""
        return self._predict_values(parties, method)

    def predict(self, parties: PartyFrames, method: str | None = None) -> np.ndarray:
        """The class per row (the label's values): the most probable, or at `decision_threshold`."""
        return self._decided(self.predict_proba(parties, method))

    @property
    def classes_(self) -> np.ndarray:
        """Class labels, as known to the label holder."""
        classes = self.label_holder_.classes_
        assert classes is not None, "a fitted (or loaded) classifier's label holder has its classes"
        return classes


class FederatedForestClassifier(_Classifier):
    """Vertical Federated Forest for classification (binary and multiclass)."""

    _task = "classification"


class FederatedForestRegressor(RegressorMixin, _FederatedForest):
    """Vertical Federated Forest for regression (squared error)."""

    _task = "regression"

    def __init__(
        self,
        n_estimators: int = 100,
        *,
        criterion: str = "squared_error",
        max_depth: int | None = None,
        min_samples_split: int = 2,
        min_samples_leaf: int = 1,
        min_impurity_decrease: float = 0.0,
        max_features: str | int | float | None = 1.0,
        feature_sampling: str = "node",
        bootstrap: bool = True,
        max_samples: int | float | None = None,
        max_bins: int = 255,
        random_state: int = 0,
        tree_batch_size: int | None = None,
        memory_budget_mb: int | None = None,
        privacy: str | Mapping[str, Any] | PrivacySetting = "none",
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
        """Store the parameters as given; `fit` checks them."""
        self._store_params(locals())

    def predict(self, parties: PartyFrames, method: str | None = None) -> np.ndarray:
        """Mean prediction of the trees."""
        return self._predict_values(parties, method)[:, 0]
