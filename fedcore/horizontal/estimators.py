"""Simulation API: scikit-learn-shaped estimators that run the horizontal engines in process.

They use an in-process transport; every message still crosses as Arrow bytes, so byte counts and transcripts
are real.

    parties = [frame.iloc[:300], frame.iloc[300:]]          # same columns, different rows
    model = FederatedExtraTreesClassifier(50, privacy="none").fit(parties, label="y")
    model.predict(new_rows)                                  # local: every party holds the whole forest

The agreed schema (columns, kinds, category lists, classes) is derived from the frames here; in a
deployment it comes from the data contracts. Categorical columns need the same pandas Categorical dtype at
every party, or an explicit `categories={column: [...]}`. Missing values go right at every split.

The estimators follow scikit-learn's conventions (`fedcore.estimator_api`): the constructor only stores
its parameters (checked by `fit`, through `ExtraTreesParams` and the privacy and threshold checks),
`get_params` / `set_params` / `clone` work, fitted attributes end in `_`, and `score(frame, y)` takes what
`predict` takes.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from fedcore.algorithms import EXTRA_TREES, PPD_ERT
from fedcore.compute import DEFAULT_BLOCK_ROWS
from fedcore.compute.cluster import compute_from_spec, held_cluster
from fedcore.errors import ParameterError
from fedcore.estimator_api import (
    ClassifierMixin,
    RegressorMixin,
    check_fitted,
)
from fedcore.horizontal.fet.master import FederatedExtraTreesMaster
from fedcore.horizontal.fet.party import HorizontalParty
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.plan import check_bounded_depth
from fedcore.horizontal.ppdert.master import PPDERTMaster
from fedcore.horizontal.ppdert.noise import DistributedNoise
from fedcore.horizontal.ppdert.party import PPDERTParty
from fedcore.horizontal.validation import (
    MISSING_RANGES,
    PartyFrames,
    build_schema,
    named_parties,
    resolve_feature_ranges,
)
from fedcore.privacy.accounting import DEFAULT_DELTA
from fedcore.privacy.ldp import LabelLDP
from fedcore.privacy.settings import (
    DistributedDP,
    GlobalDP,
    LocalDP,
    PrivacySetting,
    SecureAggregation,
    label_ldp_fields,
    privacy_with,
)
from fedcore.simulated_fit import SimulatedFederation


def party_noise_seed(random_state: int, name: str) -> int:
    """The simulation's stand-in for a party's own secret seed, reproducible per (random_state, name)."""
    return (int(random_state) << 32) ^ zlib.crc32(name.encode())


class _HorizontalForest(SimulatedFederation):
    """Shared machinery of the horizontal estimators."""

    _fitted_attribute = "model_"
    _setting: PrivacySetting  # parsed by `fit` (`_check_settings`)
    # the constructor parameters every horizontal estimator has (`_store_params` sets them)
    n_estimators: int
    max_depth: int | None
    min_samples_split: int
    min_samples_leaf: int
    max_features: str | int | float | None
    criterion: str
    categories: Mapping[str, Sequence] | None
    bootstrap: bool
    tree_batch_size: int | None
    memory_budget_mb: int | None
    random_state: int
    compute: Any
    """Where each party does its row work: None (in process), "local:N" (a LocalCluster of N workers for
    the fit), a Dask scheduler address, or a `distributed.Client` (`fedcore.compute`). Every party's rows
    go to that cluster in blocks of `block_rows` rows; the forest is the in-process one."""
    block_rows: int | None
    feature_ranges: Mapping[str, tuple[float, float]] | None
    """Declared (low, high) of numeric columns, where thresholds come from declared domains (PPD-ERT, FET's
    DP modes); `allow_data_ranges=True` (simulation only) takes missing ones from the pooled rows."""
    allow_data_ranges: bool
    _low: np.ndarray | None
    _high: np.ndarray | None
    ranges_source_: str | None
    """Where the declared domains came from (`_resolve_domains`); None where thresholds need none."""

    def _forest_params(self) -> ExtraTreesParams:
        """ExtraTreesParams of the constructor parameters: the one place they are checked."""
        if self.bootstrap:
            raise ParameterError("bootstrap=True is not supported by the horizontal engines: Extra-Trees "
                                 "grow every tree on all rows, which keeps federated runs identical to the "
                                 "pooled run; leave bootstrap=False")
        return ExtraTreesParams(
            task=self._task, n_estimators=self.n_estimators, criterion=self.criterion,
            max_depth=self.max_depth, min_samples_split=self.min_samples_split,
            min_samples_leaf=self.min_samples_leaf, max_features=self.max_features,
            random_state=self.random_state, tree_batch_size=self.tree_batch_size,
            memory_budget_mb=self.memory_budget_mb)

    def _check_settings(self) -> None:
        """Parse the privacy setting (`fedcore.privacy.settings`) and check the engine's own settings."""

    @property
    def privacy_setting_(self) -> PrivacySetting:
        """The privacy setting the model was fitted with, every default filled in."""
        check_fitted(self)
        return self._setting

    def _make_parties(self, frames: dict[str, pd.DataFrame], schema) -> list[HorizontalParty]:
        """The parties of this fit (its checked parameters are `self._params`)."""
        raise NotImplementedError

    def _rows(self, name: str, frame: pd.DataFrame, schema) -> dict[str, Any]:
        """A party's rows as its constructor takes them: the frame, or (`compute`) blocks on the cluster."""
        if self._cluster is None:
            return {"frame": frame}
        from fedcore.compute.dask_rows import DaskPartyRows

        return {"frame": None, "rows": DaskPartyRows.from_frame(name, frame, schema, self._cluster.client,
                                                                self._block_rows)}

    def _make_master(self, transport, schema):
        """The master of this fit (its checked parameters are `self._params`)."""
        raise NotImplementedError

    def fit(self, parties: PartyFrames, label: str):
        """Train on party DataFrames with the same columns (including `label`) and different rows."""
        self._params = self._forest_params()
        self._check_settings()
        frames = named_parties(parties)
        schema = build_schema(frames, label, self._task, self.categories)
        self._check_before_fit(schema, frames)
        compute = compute_from_spec(self.compute, self.block_rows)
        self._block_rows = (self.block_rows if self.block_rows is not None
                            else getattr(compute, "block_rows", DEFAULT_BLOCK_ROWS))
        members: list = []
        with held_cluster(compute) as self._cluster:  # let go when the fit ends or fails
            try:
                members = self._make_parties(frames, schema)
                transport = self._in_process_transport(members)
                master = self._make_master(transport, schema)
                model = self._fit_master(master, self._params.memory_budget_mb)
            finally:  # the rows leave the cluster with the fit: the model predicts in process
                if self._cluster is not None:
                    for member in members:
                        member.rows.close()
                self._cluster = None
        self.schema_ = schema
        self.label_ = label
        self.parties_ = members
        self.transport_ = transport
        self.master_ = master
        self.model_ = model  # last: its presence marks the estimator fitted
        return self

    def _check_before_fit(self, schema, frames) -> None:
        """Mode-specific checks before any party object exists."""

    def _resolve_domains(self, schema, frames) -> None:
        """The declared domains thresholds are drawn in (`_low`, `_high`) and where they came from.

        `ranges_source_`: "declared", or the pooled data's extent with `allow_data_ranges` (a simulation
        convenience, said so in the privacy report).
        """
        self._low, self._high, self.ranges_source_ = resolve_feature_ranges(
            schema, self.feature_ranges, frames, bool(self.allow_data_ranges))

    def _predict_values(self, frame: pd.DataFrame) -> np.ndarray:
        check_fitted(self)
        if not isinstance(frame, pd.DataFrame):
            raise ParameterError(f"predict takes one pandas DataFrame of rows, got {type(frame).__name__}")
        return self.model_.predict_values(self.schema_.encode(frame))

    def predict_contributions(self, frame: pd.DataFrame) -> np.ndarray:
        """Each row's feature contributions (exact TreeSHAP, `fedcore.horizontal.contributions`), bias last.

        XGBoost's `pred_contribs` layout: (n_rows, n_features + 1) for regression, (n_rows, n_classes,
        n_features + 1) for classification (contributions to each class's probability); features in
        `feature_names_in_` order, the last column the expected value. Each row's columns sum to its
        prediction. Boosting's are margins, as XGBoost's: (n_rows, n_features + 1) for two classes (the
        log-odds of the second), (n_rows, n_classes, n_features + 1) for more. Every institution holds the
        whole model, so it can explain its own rows alone.
        """
        from fedcore.horizontal.contributions import contributions

        check_fitted(self)
        if not isinstance(frame, pd.DataFrame):
            raise ParameterError(f"predict_contributions takes one pandas DataFrame of rows, got "
                                 f"{type(frame).__name__}")
        phi, expected = contributions(self.model_, self.schema_.encode(frame))
        bias = np.broadcast_to(expected, (phi.shape[0], 1, phi.shape[2]))
        out = np.concatenate([phi, bias], axis=1).transpose(0, 2, 1)  # (rows, outputs, features + 1)
        return out[:, 0, :] if out.shape[1] == 1 else out  # one output: regression, boosting's log-odds

    def to_onnx(self) -> Any:
        """The fitted forest as an ONNX `ModelProto` (needs the [export] extra; docs/design.md, Export).

        Its input `X` is float64 rows encoded by the schema: `self.schema_.encode(frame)`.
        """
        from fedcore.models.export import exported_trees
        from fedcore.models.onnx_export import to_onnx

        check_fitted(self)
        return to_onnx(exported_trees(self.model_), self.model_.algorithm)

    def to_treelite(self) -> Any:
        """The fitted forest as a `treelite.Model` (needs the [export] extra); input as for `to_onnx`."""
        from fedcore.models.export import exported_trees
        from fedcore.models.treelite_export import to_treelite

        check_fitted(self)
        return to_treelite(exported_trees(self.model_))

    @property
    def n_features_in_(self) -> int:
        """Number of feature columns (the agreed schema's)."""
        check_fitted(self)
        return self.schema_.n_features

    @property
    def feature_names_in_(self) -> np.ndarray:
        """The feature columns in schema order (the order of `feature_importances_`)."""
        check_fitted(self)
        return np.array(self.schema_.names, dtype=object)

    @property
    def feature_importances_(self) -> np.ndarray:
        """Impurity-based importances over `feature_names_in_`, summing to 1.

        Scikit-learn's definition (the weighted impurity decrease of each split, as a share of its tree's
        total, averaged over the trees).

        Every institution holds the whole forest, so every one can compute this same vector. It is computed
        from the forest's node weights (aggregated row counts) and values (class probabilities or target
        means), see `fedcore.estimator_api.node_impurity_decrease`: exact when those are (privacy "none" and
        PPD-ERT), an estimate from the released noisy ones under "gdp" and "ldp".
        """
        check_fitted(self)
        return self.model_.importances(self.params_.criterion, self.schema_.n_features)


class _FETBase(_HorizontalForest):
    """Federated Extra-Trees estimators.

    `privacy`: "none", "gdp" or "ldp" (classification), a mapping with `mode` and its fields, or a
    `PrivacySetting` (`fedcore.privacy.settings`). `epsilon`, `delta` and `ldp` (a `LabelLDP`) are
    shorthands for its fields: gdp's (epsilon, delta), the whole model's budget per row (gdp needs a
    `max_depth`); ldp's epsilon for each row's label, and its mechanism. A field the mode does not use is
    refused.

    In gdp and ldp no party sends a node's min or max: thresholds are drawn in the declared domains
    (`feature_ranges`, as PPD-ERT's; `allow_data_ranges=True` in a simulation takes the pooled rows' extent),
    narrowed along each path by the splits. Mode none draws them in the nodes' exact ranges (the paper's).
    """

    privacy: str | Mapping[str, Any] | PrivacySetting
    epsilon: float | None
    delta: float | None
    ldp: LabelLDP | None

    def __init__(self, n_estimators: int = 100, *, max_depth: int | None = None, min_samples_split: int = 2,
                 min_samples_leaf: int = 1, max_features: str | int | float | None = "sqrt",
                 criterion: str = "gini", privacy: str | Mapping[str, Any] | PrivacySetting = "none",
                 epsilon: float | None = None, delta: float | None = None, ldp: LabelLDP | None = None,
                 feature_ranges: Mapping[str, tuple[float, float]] | None = None,
                 allow_data_ranges: bool = False,
                 categories: Mapping[str, Sequence] | None = None, bootstrap: bool = False,
                 tree_batch_size: int | None = None, memory_budget_mb: int | None = None,
                 random_state: int = 0, progress: bool = False, record_transcript: bool = False,
                 record_payloads: bool = False, compute: Any = None, block_rows: int | None = None,
                 decision_threshold: float | None = None) -> None:
        self._store_params(locals())

    def _check_settings(self) -> None:
        if self.ldp is not None and not isinstance(self.ldp, LabelLDP):
            raise ParameterError(f"ldp must be a LabelLDP, got {type(self.ldp).__name__}")
        fields: dict[str, Any] = {"epsilon": self.epsilon, "delta": self.delta}
        given = label_ldp_fields(self.ldp, complete=False) if self.ldp is not None else {}
        for name, value in given.items():
            if fields.get(name) is not None:  # k-RR's report_epsilon
                raise ParameterError(f"privacy: {name} given both as {name}= and in ldp=; give it once")
            fields[name] = value
        self._setting = privacy_with(self.privacy, EXTRA_TREES, self._task, **fields)
        if self.ldp is not None and not isinstance(self._setting, LocalDP):
            raise ParameterError(f"privacy: ldp= (the label mechanism) applies to mode 'ldp' only, not "
                                 f"{self._setting.mode!r}")
        check_bounded_depth(self._setting, self._params.max_depth)
        self._privacy = self._setting.mode
        self._gdp = self._setting if isinstance(self._setting, GlobalDP) else None
        self._ldp = self._setting.ldp if isinstance(self._setting, LocalDP) else None

    def _check_before_fit(self, schema, frames) -> None:
        if self._privacy == "ldp":  # "auto" resolved for the classes: what runs, and what the report names
            self._setting = self._setting.for_classes(schema.n_classes)
            self._ldp = self._setting.ldp if isinstance(self._setting, LocalDP) else None
            self._label_ldp().check_classes(schema.n_classes)
        if self._privacy in ("gdp", "ldp"):
            self._resolve_domains(schema, frames)
        else:  # mode none: the nodes' exact ranges (the paper's)
            self._low = self._high = None
            self.ranges_source_ = None

    def _label_ldp(self) -> LabelLDP:
        """The label LDP mechanism of privacy "ldp" (`_check_settings` makes a default one if none given)."""
        assert self._ldp is not None, "privacy 'ldp' always has a mechanism after _check_settings"
        return self._ldp

    def _make_parties(self, frames, schema):
        budget = self._gdp or GlobalDP()  # used under gdp only
        return [HorizontalParty(name=name, schema=schema, privacy=self._privacy, epsilon=budget.epsilon,
                                delta=budget.delta, ldp=self._ldp,
                                noise_seed=party_noise_seed(self._params.random_state, name),
                                **self._rows(name, frame, schema))
                for name, frame in frames.items()]

    def _make_master(self, transport, schema):
        gdp = self._gdp
        return FederatedExtraTreesMaster(transport, self._params, schema, privacy=self._privacy,
                                         epsilon=gdp.epsilon if gdp else None,
                                         delta=gdp.delta if gdp else DEFAULT_DELTA, ldp=self._ldp,
                                         plan=gdp.plan if gdp else "splits",
                                         split_levels=gdp.split_levels if gdp else 0,
                                         low=self._low, high=self._high,
                                         progress=self._progress_callback())

    @property
    def privacy_report_(self) -> dict:
        """What the master saw and what it cost, in this run's privacy mode."""
        check_fitted(self)
        levels = self.master_.levels
        report: dict[str, Any] = {"algorithm": EXTRA_TREES.id, "mode": self._privacy,
                                  "setting": self._setting.to_dict(), "queries": levels}
        if self._privacy == "none":
            report["min_max"] = ("per-party min and max of each candidate feature over each open node, in "
                                 "the clear (as in the FET paper)")
        else:
            report["min_max"] = None
            report["thresholds"] = ("uniform in each node's box, the declared feature domain cut by the "
                                    "splits above it: no party sends a min or max")
            report["feature_ranges"] = self.ranges_source_
        if self._privacy == "none":
            report["label_statistics"] = "per-party plain integer branch counts"
            report["epsilon"] = None
            report["composed_epsilon"] = None
        elif self._privacy == "gdp":
            spent = {p.name: p.privacy_spent() for p in self.parties_}
            worst = max(spent.values(), key=lambda s: s["epsilon_total"])
            report.update({
                "label_statistics": "per-party Gaussian-noised branch counts",
                "epsilon_total": worst["epsilon_total"], "delta": worst["delta"],
                "epsilon_budget": worst["epsilon_budget"], "sigma": worst["sigma"],
                "releases_per_row": worst["releases_per_row"],
                "plan": self.master_.plan_report(),
                "composition": "dp-accounting's PLD accountant over the Gaussian releases the busiest row "
                               "took part in: one per tree it is active in, per chosen level, each the "
                               "node's branch counts of all k candidates (L2 sensitivity sqrt(k), "
                               "regression sqrt(2k)); plan leaves: one more per tree, its leaves' class "
                               "counts (L2 sensitivity 1, the same noise multiplier); with the marginal "
                               "histograms and the row count at hello",
                "parties": spent,
            })
        else:
            report.update(self._ldp_report())
        return report

    def _ldp_report(self) -> dict[str, Any]:
        """LDP: the mechanism, each row's epsilon (its report's, reused: post-processing) and its parameters.

        `epsilon_total` is that epsilon and `delta` 0: every report of a row repeats its one randomized
        response (Bloom: the permanent one bounds any number of instant reports), so the trees cost nothing
        more.
        """
        ldp = self.parties_[0].label_ldp()  # sized and resolved for the classes
        epsilon = ldp.epsilon()
        if ldp.mechanism == "bloom":
            statistics = ("per-party sums of instant randomized-response bits of Bloom-encoded labels, plus "
                          "plain branch sizes")
            composition = ("RAPPOR: each row's permanent response bounds any number of its instant reports "
                           f"(one report alone: epsilon {epsilon['instant']:.4g})")
            parameters: dict[str, Any] = {
                "n_bits": ldp.n_bits, "n_hashes": ldp.n_hashes, "keep_probability": ldp.keep_probability,
                "p_one_if_one": ldp.p_one_if_one, "p_one_if_zero": ldp.p_one_if_zero,
                "epsilon_instant": epsilon["instant"]}
        else:
            what = "k-ary randomized-response class reports" if ldp.mechanism == "krr" else \
                "optimized-unary-encoding bits of the class one-hot"
            statistics = f"per-party sums of {what}, plus plain branch sizes"
            composition = "each row's label is randomized once and the same report reused for every tree"
            parameters = {"epsilon": ldp.report_epsilon}
        return {"label_statistics": statistics, **LocalDP(ldp).budget(),
                "reports_per_row": max(p.reports_per_row for p in self.parties_),
                "composition": composition,
                "ldp_mechanism": {"mechanism": ldp.mechanism, **parameters, "estimator": ldp.estimator},
                "min_samples_leaf": self.master_.min_samples_leaf}  # raised to the LDP leaf floor


class _Classifier(ClassifierMixin, _HorizontalForest):
    """Class predictions of a fitted horizontal classifier (FET or PPD-ERT)."""

    def predict_proba(self, frame: pd.DataFrame) -> np.ndarray:
        """Class probabilities (columns in `classes_` order), averaged over trees."""
        return self._predict_values(frame)

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        """The class per row (the label's values): the most probable, or at `decision_threshold`."""
        return self._decided(self.predict_proba(frame))

    @property
    def classes_(self) -> np.ndarray:
        """The union of the parties' classes, sorted."""
        check_fitted(self)
        return np.array(self.schema_.classes)


class FederatedExtraTreesClassifier(_Classifier, _FETBase):
    """Horizontal Federated Extra-Trees for classification; privacy "none", "ldp" or "gdp"."""

    _task = "classification"


class FederatedExtraTreesRegressor(RegressorMixin, _FETBase):
    """Horizontal Federated Extra-Trees for regression (variance reduction); privacy "none" or "gdp"."""

    _task = "regression"

    def __init__(self, n_estimators: int = 100, *, max_depth: int | None = None, min_samples_split: int = 2,
                 min_samples_leaf: int = 1, max_features: str | int | float | None = 1.0,
                 criterion: str = "squared_error",
                 privacy: str | Mapping[str, Any] | PrivacySetting = "none", epsilon: float | None = None,
                 delta: float | None = None, ldp: LabelLDP | None = None,
                 feature_ranges: Mapping[str, tuple[float, float]] | None = None,
                 allow_data_ranges: bool = False,
                 categories: Mapping[str, Sequence] | None = None, bootstrap: bool = False,
                 tree_batch_size: int | None = None, memory_budget_mb: int | None = None,
                 random_state: int = 0, progress: bool = False, record_transcript: bool = False,
                 record_payloads: bool = False, compute: Any = None, block_rows: int | None = None) -> None:
        """Store the parameters as given; `fit` checks them."""
        self._store_params(locals())

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        """Mean prediction of the trees."""
        return self._predict_values(frame)[:, 0]


class PPDERTClassifier(_Classifier, _HorizontalForest):
    """PPD-ERT classification: shared-seed candidate splits, securely aggregated (secagg-dp: noisy) counts."""

    _task = "classification"
    secure_aggregation: bool
    privacy: str | Mapping[str, Any] | PrivacySetting
    thresholds: str | None
    threshold_cells: int | None

    def __init__(self, n_estimators: int = 100, *,
                 feature_ranges: Mapping[str, tuple[float, float]] | None = None,
                 allow_data_ranges: bool = False, max_depth: int | None = None, min_samples_split: int = 2,
                 min_samples_leaf: int = 1, max_features: str | int | float | None = "sqrt",
                 criterion: str = "gini", categories: Mapping[str, Sequence] | None = None,
                 bootstrap: bool = False, tree_batch_size: int | None = None,
                 memory_budget_mb: int | None = None, random_state: int = 0, progress: bool = False,
                 record_transcript: bool = False, record_payloads: bool = False,
                 secure_aggregation: bool = True,
                 privacy: str | Mapping[str, Any] | PrivacySetting = "secagg", thresholds: str | None = None,
                 threshold_cells: int | None = None, compute: Any = None,
                 block_rows: int | None = None, decision_threshold: float | None = None) -> None:
        """Store the parameters as given (`fit` checks them); the PPD-ERT-specific ones are these.

        `secure_aggregation=False` sends plain per-party counts: only a baseline to measure the masks' cost.
        `privacy`: "secagg", a mapping with its fields (`thresholds`, `cells`) or a `PrivacySetting`
        (`fedcore.privacy.settings`); `thresholds` and `threshold_cells` are shorthands for its fields.
        `{"mode": "secagg-dp", "epsilon": ..., "delta": ...}` adds distributed discrete Gaussian noise to the
        masked counts (the model's budget against the master; needs `max_depth`; domain thresholds).
        Thresholds "histogram" (the default) draws each candidate threshold within the grid cells (16 per
        interval by default) that hold the node's rows, learning only the first and last populated cell
        over all parties (`fedcore/horizontal/ppdert/cells.py`); `"domain"` is the paper's draw, uniform in
        the declared domain, which reveals nothing beyond the counts but wastes thresholds on skewed columns.
        """
        self._store_params(locals())

    def _check_settings(self) -> None:
        setting = privacy_with(self.privacy, PPD_ERT, self._task, thresholds=self.thresholds,
                               cells=self.threshold_cells)
        assert isinstance(setting, (SecureAggregation, DistributedDP)), "PPD-ERT: secagg or secagg-dp"
        self._setting = setting
        self._thresholds, self._threshold_cells = setting.thresholds, setting.n_cells
        self._secure = bool(self.secure_aggregation)
        self._dp = setting if isinstance(setting, DistributedDP) else None
        if self._dp is not None and not self._secure:
            raise ParameterError("privacy 'secagg-dp' needs secure_aggregation=True: each party adds 1/P of "
                                 "the noise, enough only for the masked sum")
        check_bounded_depth(setting, self._params.max_depth)
        if self.feature_ranges is None and not self.allow_data_ranges:
            raise ParameterError(MISSING_RANGES)

    def _check_before_fit(self, schema, frames) -> None:
        self._resolve_domains(schema, frames)

    def _make_parties(self, frames, schema):
        k = self._params.n_candidate_features(schema.n_features)
        identities = {}
        if self._secure and len(frames) > 1:
            # no certificates in simulation: a fresh Ed25519 identity per party, pinned at every party, so
            # the keys are signed and verified exactly as in a deployment (see fedcore.privacy.keyauth)
            from fedcore.privacy.keyauth import ephemeral_identities

            identities = ephemeral_identities(frames)
        return [PPDERTParty(name=name, schema=schema, seed=self._params.random_state, low=self._low,
                            high=self._high, k=k, secure=self._secure, identity=identities.get(name),
                            thresholds=self._thresholds, n_cells=self._threshold_cells,
                            noise=self._party_noise(name), **self._rows(name, frame, schema))
                for name, frame in frames.items()]

    def _party_noise(self, name: str) -> DistributedNoise | None:
        """secagg-dp: the party's share of the noise under the setting's budget (audited with transcripts)."""
        if self._dp is None:
            return None
        return DistributedNoise(name, self._dp.epsilon, self._dp.delta,
                                party_noise_seed(self._params.random_state, name),
                                audit=bool(self.record_transcript))

    def _make_master(self, transport, schema):
        return PPDERTMaster(transport, self._params, schema, low=self._low, high=self._high,
                            progress=self._progress_callback(), secure=self._secure,
                            thresholds=self._thresholds, n_cells=self._threshold_cells, dp=self._dp)

    @property
    def privacy_report_(self) -> dict:
        """What the master saw in this run."""
        check_fitted(self)
        single = len(self.parties_) == 1
        if single:
            statistics = "plain counts of the single party (no peers to mask with)"
        elif not self._secure:
            statistics = ("plain per-party branch class counts (secure aggregation switched off: a baseline "
                          "only)")
        else:
            statistics = ("only the sum over all parties of the branch class counts, by pairwise-mask "
                          "secure aggregation (each party's vector is uniform modulo "
                          f"2**{self.master_.mask_bits} to the master)")
        if self._thresholds == "histogram":
            how = ("by secure aggregation of extreme-cell indicators" if not single and self._secure
                   else "from plain per-party extreme-cell indicators (no secure aggregation)")
            thresholds = (f"within the populated cells of a {self._threshold_cells}-cell grid per node and "
                          "candidate: the master learns the first and last cell holding any party's value, "
                          f"{how}")
        else:
            thresholds = ("uniform in the declared domains, from the shared seed: nothing learned from the "
                          "data")
        report = {
            "algorithm": PPD_ERT.id, "mode": self._setting.mode if self._secure else "none",
            "queries": self.master_.levels, "label_statistics": statistics, "thresholds": thresholds,
            "feature_ranges": self.ranges_source_, "parties": len(self.parties_),
            "plain_single_party": single, "epsilon": None, "composed_epsilon": None,
            "setting": self._setting.to_dict(),
        }
        if self._dp is not None:
            report.update(self._distributed_report())
        return report

    def _distributed_report(self) -> dict[str, Any]:
        """secagg-dp: each party's ledger; the busiest row's totals against the master and the coalition."""
        spent = {p.name: p.privacy_spent() for p in self.parties_}
        worst = max(spent.values(), key=lambda s: s["epsilon_total"])
        return {
            "label_statistics": ("only the sum over all parties of the branch class counts, each party's "
                                 "with discrete Gaussian noise of 1/P of the variance, by secure "
                                 "aggregation"),
            "row_counts": "each party's row count plus discrete Gaussian noise (count_sigma): no exact count",
            "epsilon_total": worst["epsilon_total"], "epsilon_coalition": worst["epsilon_coalition"],
            "delta": worst["delta"], "epsilon_budget": worst["epsilon_budget"], "sigma": worst["sigma"],
            "releases_per_row": worst["releases_per_row"],
            "composition": "dp-accounting's privacy loss distribution of the sum's exact law (the sampler's "
                           "table) over the counts the busiest row moved, composed with the noisy row count; "
                           "epsilon_coalition: against the master with the other P - 1 parties, who can "
                           "subtract their own noise (1/P of the variance is left)",
            "ledgers": spent,
        }


