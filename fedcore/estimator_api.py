"""scikit-learn's estimator conventions for both settings' simulation estimators.

Without importing scikit-learn (a test and benchmark dependency only).

What an estimator gets by inheriting `EstimatorBase` and `ClassifierMixin` / `RegressorMixin`:

- `get_params(deep=True)` / `set_params(**params)` read the parameter names off `__init__`'s signature, as
  scikit-learn's `BaseEstimator` does, so `sklearn.base.clone` and grid searches work. `__init__` only stores
  each argument, untouched, under its own name; checking them is `fit`'s job (through the settings'
  parameter dataclasses, `ForestParams` and `ExtraTreesParams`).
- a `__repr__` listing the parameters that differ from their defaults;
- `NotFittedError` (an `AttributeError` and a `ValueError`, as scikit-learn's) raised by `check_fitted` with
  scikit-learn's message, and `__sklearn_is_fitted__` for `sklearn.utils.validation.check_is_fitted`;
- `score(X, y)`: accuracy for classifiers, R^2 for regressors, over whatever `predict` takes as X;
- `_estimator_type` and `__sklearn_tags__`, so `sklearn.base.is_classifier` / `is_regressor` recognise them;
- `node_impurity_decrease` and `impurity_importances`: scikit-learn's impurity-based `feature_importances_`
  computed from a forest's node weights and values.

Fitted attributes end in `_` and are absent until `fit` (or `load`) sets them.
"""

from __future__ import annotations

import inspect
import sys
from collections import defaultdict
from typing import Any, Protocol

import numpy as np

from fedcore import errors
from fedcore.errors import InputError, ParameterError
from fedcore.metrics import decide

NotFittedError = errors.NotFittedError
"""An estimator was used before `fit`: an AttributeError and a ValueError, like scikit-learn's, so
`hasattr(model, "classes_")` is False before fit and handlers of either kind catch it."""


def check_fitted(estimator: Any) -> None:
    """Raise NotFittedError, with scikit-learn's message, unless `estimator` is fitted."""
    if not estimator.__sklearn_is_fitted__():
        raise NotFittedError(f"This {type(estimator).__name__} instance is not fitted yet. Call 'fit' with "
                             "appropriate arguments before using this estimator.")


class EstimatorBase:
    """Parameters from `__init__`'s signature (get, set, repr) and the fitted state (see the module doc).

    Subclasses name in `_fitted_attribute` the attribute `fit` sets last (its presence means fitted), spell
    out every parameter in `__init__` (no *args, no **kwargs) and store them with `_store_params(locals())`.
    """

    _estimator_type: str | None = None
    _fitted_attribute = ""
    master_: Any  # set by the setting's fit (or load): the master, whose `params` the model was fitted with

    @property
    def params(self) -> Any:
        """The validated forest parameters.

        Those the model was fitted with once fitted (`params_`), else the current constructor parameters,
        checked now (ParameterError names a bad one).
        """
        return self.params_ if self.__sklearn_is_fitted__() else self._forest_params()

    @property
    def params_(self) -> Any:
        """The forest parameters the model was fitted with (its master's)."""
        check_fitted(self)
        return self.master_.params

    def _forest_params(self) -> Any:
        """The setting's parameter object of the constructor parameters: the one place they are checked."""
        raise NotImplementedError

    @classmethod
    def _get_param_names(cls) -> list[str]:
        """The parameter names of `__init__`, sorted (as scikit-learn lists them)."""
        if cls.__init__ is object.__init__:
            return []
        names = []
        for p in inspect.signature(cls.__init__).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"{cls.__name__}.__init__ takes *{p.name}: an estimator spells out every "
                                "parameter in its signature (get_params, set_params and clone read it)")
            if p.name != "self":
                names.append(p.name)
        return sorted(names)

    def _store_params(self, arguments: dict[str, Any]) -> None:
        """The whole body of `__init__`: each argument stored unchanged under its own name (pass locals())."""
        for name in self._get_param_names():
            setattr(self, name, arguments[name])

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor parameters by name.

        With `deep`, also `name__sub` for parameters that are estimators themselves.
        """
        out: dict[str, Any] = {}
        for name in self._get_param_names():
            value = getattr(self, name)
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                out.update((f"{name}__{k}", v) for k, v in value.get_params().items())
            out[name] = value
        return out

    def set_params(self, **params: Any) -> EstimatorBase:
        """Set constructor parameters (`name__sub` reaches into a parameter that is an estimator).

        Values are checked by the next `fit`. Returns the estimator.
        """
        if not params:
            return self
        valid = self.get_params(deep=True)
        nested: dict[str, dict[str, Any]] = defaultdict(dict)
        for key, value in params.items():
            name, delimiter, sub = key.partition("__")
            if name not in valid:
                raise ParameterError(f"Invalid parameter {name!r} for estimator {type(self).__name__}. Valid "
                                     f"parameters are: {self._get_param_names()!r}.")
            if delimiter:
                nested[name][sub] = value
            else:
                setattr(self, name, value)
                valid[name] = value
        for name, sub_params in nested.items():
            valid[name].set_params(**sub_params)
        return self

    def __repr__(self) -> str:
        """The class name with the parameters that differ from their defaults."""
        defaults = {name: p.default for name, p in inspect.signature(type(self).__init__).parameters.items()}
        changed = [f"{name}={value!r}" for name, value in self.get_params(deep=False).items()
                   if not _same_value(value, defaults.get(name, inspect.Parameter.empty))]
        return f"{type(self).__name__}({', '.join(changed)})"

    def __sklearn_is_fitted__(self) -> bool:
        """Whether `fit` (or `load`) has completed: `sklearn.utils.validation.check_is_fitted` asks this."""
        return getattr(self, self._fitted_attribute, None) is not None

    def __sklearn_tags__(self):
        """scikit-learn's tags (estimator type, NaN and categorical input allowed, a target required).

        Only scikit-learn calls this, so its Tags classes are taken from the scikit-learn already loaded:
        fedcore itself neither imports nor requires scikit-learn. (scikit-learn < 1.6 reads
        `_estimator_type` instead.)
        """
        sk = sys.modules["sklearn.utils"]
        kind = self._estimator_type
        return sk.Tags(
            estimator_type=kind, target_tags=sk.TargetTags(required=True),
            classifier_tags=sk.ClassifierTags() if kind == "classifier" else None,
            regressor_tags=sk.RegressorTags() if kind == "regressor" else None,
            input_tags=sk.InputTags(allow_nan=True, categorical=True, string=True),
        )


class _Predictor(Protocol):
    """What the mixins' `score` needs of the estimator it is mixed into."""

    def predict(self, X: Any) -> Any: ...


class ClassifierMixin:
    """`score` is the accuracy of `predict`; scikit-learn sees a classifier."""

    _estimator_type: str | None = "classifier"

    def score(self: _Predictor, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Mean accuracy of `predict(X)` against `y` (weighted by `sample_weight`); X: what predict takes."""
        return accuracy(y, self.predict(X), sample_weight)

    def _decided(self: Any, proba: np.ndarray) -> np.ndarray:
        """The predicted class of each row of `proba`: at `decision_threshold` for two classes, if set.

        `decision_threshold` None: the most probable class; else the second (positive) class where its
        probability is at least the threshold (`fedcore.metrics.decide`).
        """
        threshold = getattr(self, "decision_threshold", None)
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                      or not 0 <= threshold <= 1):
            raise ParameterError(f"decision_threshold must be a number between 0 and 1 (or None), got "
                                 f"{threshold!r}")
        return self.classes_[decide(proba, threshold)]


class RegressorMixin:
    """`score` is the coefficient of determination R^2 of `predict`; scikit-learn sees a regressor."""

    _estimator_type: str | None = "regressor"

    def score(self: _Predictor, X: Any, y: Any, sample_weight: Any = None) -> float:
        """R^2 of `predict(X)` against `y` (weighted by `sample_weight`); X is what predict takes."""
        return r2(y, self.predict(X), sample_weight)


def accuracy(y_true: Any, y_pred: Any, sample_weight: Any = None) -> float:
    """Fraction (weighted) of predictions equal to the truth."""
    y_true, y_pred, weight = _aligned(y_true, y_pred, sample_weight, dtype=None)
    return float(np.average(y_true == y_pred, weights=weight))


def r2(y_true: Any, y_pred: Any, sample_weight: Any = None) -> float:
    """Coefficient of determination 1 - SS_res / SS_tot, scikit-learn's `r2_score`.

    A constant truth scores 1.0 when predicted exactly, else 0.0. The total sum of squares is taken around a
    refined mean (two passes), never as E[y^2] - E[y]^2, so a large offset in y costs no precision.
    """
    y_true, y_pred, weight = _aligned(y_true, y_pred, sample_weight, dtype=np.float64)
    mean = np.average(y_true, weights=weight)
    mean += np.average(y_true - mean, weights=weight)
    ss_res = float(np.sum(weight * (y_true - y_pred) ** 2))
    ss_tot = float(np.sum(weight * (y_true - mean) ** 2))
    if ss_tot == 0.0:
        return 1.0 if ss_res == 0.0 else 0.0
    return 1.0 - ss_res / ss_tot


def _aligned(y_true: Any, y_pred: Any, sample_weight: Any, dtype) -> tuple[np.ndarray, ...]:
    """Truth, predictions and weights as aligned 1-d arrays (unit weights by default)."""
    y_true = np.asarray(y_true, dtype=dtype).reshape(-1)
    y_pred = np.asarray(y_pred, dtype=dtype).reshape(-1)
    weight = (np.ones(len(y_true)) if sample_weight is None
              else np.asarray(sample_weight, dtype=np.float64).reshape(-1))
    if not len(y_true) == len(y_pred) == len(weight):
        raise InputError(f"y has {len(y_true)} values but there are {len(y_pred)} predictions and "
                         f"{len(weight)} sample weights")
    if len(y_true) == 0:
        raise InputError("cannot score zero rows")
    return y_true, y_pred, weight


def _same_value(value: Any, default: Any) -> bool:
    """Whether a parameter still has its default (for the repr): identity, equality, or both NaN."""
    if value is default:
        return True
    try:
        if type(value) is type(default) and bool(value == default):
            return True
    except (TypeError, ValueError):  # arrays and other values without a single truth value
        return False
    return isinstance(value, float) and isinstance(default, float) and np.isnan(value) and np.isnan(default)


# -- impurity-based feature importances ---------------------------------------------------------

def node_impurity_decrease(tree: np.ndarray, left: np.ndarray, right: np.ndarray, weight: np.ndarray,
                           value: np.ndarray, criterion: str, n_trees: int) -> np.ndarray:
    """The weighted impurity decrease of every split node (0 on leaves), as scikit-learn defines it.

    w_t i(t) - w_l i(l) - w_r i(r), from each node's weight (weighted sample count) and value (class
    probabilities, or the mean of a regression target), the node statistics the forests keep.

    Node arrays are sorted by (tree, node); `left` / `right` are child ids within the tree (node ids
    contiguous from 0 per tree), -1 on leaves. Because w_t = w_l + w_r and w_t v_t = w_l v_l + w_r v_r, the
    decrease equals sum over the children c of w_c D(v_c, v_t), with D the squared distance for gini
    (the summed variance of the one-hot class) and squared error, and the Kullback-Leibler divergence in
    bits for entropy / log_loss: exact, without the cancellation of subtracting impurities, and never
    negative. (With noised weights and values, as under differential privacy, the same formula estimates it.)
    """
    value = np.asarray(value, dtype=np.float64).reshape(len(tree), -1)
    weight = np.asarray(weight, dtype=np.float64)
    offsets = np.searchsorted(tree, np.arange(n_trees + 1))
    split = np.flatnonzero(np.asarray(left) >= 0)
    base = offsets[tree[split]]
    parent = value[split]
    decrease = np.zeros(len(tree), dtype=np.float64)
    for child in (base + left[split], base + right[split]):
        decrease[split] += weight[child] * _divergence(value[child], parent, criterion)
    return np.maximum(decrease, 0.0)


def _divergence(child: np.ndarray, parent: np.ndarray, criterion: str) -> np.ndarray:
    if criterion in ("entropy", "log_loss"):
        p = np.clip(child, 0.0, None)
        q = np.clip(parent, np.finfo(np.float64).tiny, None)
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(p > 0, p * np.log2(np.where(p > 0, p, 1.0) / q), 0.0)
        return terms.sum(axis=1)
    return ((child - parent) ** 2).sum(axis=1)


def impurity_importances(decrease: np.ndarray, tree: np.ndarray, n_trees: int, split_feature: np.ndarray,
                         n_features: int) -> np.ndarray:
    """scikit-learn's forest `feature_importances_` from the per-node decreases.

    In each tree, each split's decrease over the tree's total (a tree's importances sum to 1), summed per
    split feature and averaged over the trees that split at all; the vector sums to 1 (all zeros if no tree
    splits).

    `split_feature` is the feature index of each node's split, -1 where the node is a leaf *or where the
    caller does not know the feature*: a vertical party passes its own splits only and gets exactly its own
    features' entries of the forest's vector (the per-tree totals come from every node's decrease).
    """
    share, splitting_trees = split_shares(decrease, tree, n_trees)
    return importances_from_shares(share, split_feature, n_features, splitting_trees)


def split_shares(decrease: np.ndarray, tree: np.ndarray, n_trees: int) -> tuple[np.ndarray, int]:
    """Each node's decrease as a share of its tree's total decrease, and how many trees split at all.

    What a vertical master, which knows every node's statistics but no split's feature, sends each party
    for that party's own splits (`fedcore.vertical.importances`).
    """
    decrease = np.asarray(decrease, dtype=np.float64)
    totals = np.bincount(tree, weights=decrease, minlength=n_trees)
    share = np.divide(decrease, totals[tree], out=np.zeros_like(decrease), where=totals[tree] > 0)
    return share, int(np.count_nonzero(totals > 0))


def importances_from_shares(share: np.ndarray, split_feature: np.ndarray, n_features: int,
                            splitting_trees: int) -> np.ndarray:
    """Per feature, its splits' shares summed, averaged over the splitting trees (`impurity_importances`)."""
    known = np.asarray(split_feature) >= 0
    summed = np.bincount(np.asarray(split_feature)[known], weights=np.asarray(share)[known],
                         minlength=n_features)
    return summed / splitting_trees if splitting_trees else summed
