"""Forest hyper-parameters shared by every role, validated once, with scikit-learn's meanings."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from fedcore.errors import ParameterError
from fedcore.privacy.paillier import KEY_BITS as PAILLIER_KEY_BITS
from fedcore.trees.criteria import CRITERIA, SQUARED_ERROR

PRIVACY_MODES = ("none", "paillier")
"""Vertical label protection: none (labels shared, the paper's FF) or Paillier-encrypted (SecureBoost-style)."""


DEPTH_UNLIMITED = 10_000
"""The depth bound used when max_depth is None: no tree reaches it."""


@dataclass(frozen=True)
class TreeParams:
    """What a forest of either setting is told, with scikit-learn's meanings, checked in one place: the
    task, how many trees, when to stop, how many candidate features, the seed and the tree batches.
    Each setting's params add their own fields and criteria (`_check_criterion`)."""

    task: str = "classification"
    n_estimators: int = 100
    criterion: str = "gini"
    max_depth: int | None = None
    min_samples_split: int = 2
    min_samples_leaf: int = 1
    max_features: str | int | float | None = "sqrt"
    random_state: int = 0
    tree_batch_size: int | None = None
    memory_budget_mb: int | None = None

    def __post_init__(self) -> None:
        if self.task not in ("classification", "regression"):
            raise ParameterError(f"task must be 'classification' or 'regression', got {self.task!r}")
        self._check_criterion()
        check_int("n_estimators", self.n_estimators, 1)
        if self.max_depth is not None:
            check_int("max_depth", self.max_depth, 1)
        check_int("min_samples_split", self.min_samples_split, 2)
        check_int("min_samples_leaf", self.min_samples_leaf, 1)
        check_int("random_state", self.random_state, 0)
        if self.tree_batch_size is not None:
            check_int("tree_batch_size", self.tree_batch_size, 1)
        if self.memory_budget_mb is not None:
            check_int("memory_budget_mb", self.memory_budget_mb, 1)
        mf = self.max_features
        if isinstance(mf, bool) or (isinstance(mf, str) and mf not in ("sqrt", "log2")) or not (
                mf is None or isinstance(mf, (str, int, float))):
            raise ParameterError(f"max_features must be 'sqrt', 'log2', an int, a float in (0, 1] or None, got {mf!r}")
        if isinstance(mf, float) and not 0 < mf <= 1:
            raise ParameterError(f"max_features as a fraction must be in (0, 1], got {mf}")
        if isinstance(mf, int) and mf < 1:
            raise ParameterError(f"max_features must be >= 1, got {mf}")

    def _check_criterion(self) -> None:
        """Refuse a criterion this setting does not grow with (overridden per setting)."""

    def n_candidate_features(self, n_features: int) -> int:
        """How many features each node (or tree) considers."""
        return candidate_count(self.max_features, n_features)

    @property
    def depth_limit(self) -> int:
        """max_depth, or a bound no tree reaches."""
        return self.max_depth if self.max_depth is not None else DEPTH_UNLIMITED

    def batches(self, batch_size: int | None = None) -> list[list[int]]:
        """Tree indices grouped into the batches grown together: `tree_batch_size` when set, else
        `batch_size` (the grower's plan from the memory budget), else all at once."""
        size = self.tree_batch_size or batch_size or self.n_estimators
        return [list(range(a, min(a + size, self.n_estimators))) for a in range(0, self.n_estimators, size)]

    def to_dict(self) -> dict:
        """JSON-ready parameters."""
        return asdict(self)


@dataclass(frozen=True)
class ForestParams(TreeParams):
    """Hyper-parameters of a vertical forest. Sizes (min_samples_*) count bootstrap-weighted rows."""

    min_impurity_decrease: float = 0.0
    feature_sampling: str = "node"
    bootstrap: bool = True
    max_samples: int | float | None = None
    max_bins: int = 255
    privacy: str = "none"
    paillier_key_bits: int = 2048

    def _check_criterion(self) -> None:
        if self.criterion not in CRITERIA:
            raise ParameterError(f"criterion must be one of {sorted(CRITERIA)}, got {self.criterion!r}")
        if (self.task == "regression") != (CRITERIA[self.criterion] == SQUARED_ERROR):
            raise ParameterError(f"criterion {self.criterion!r} does not fit task {self.task!r}")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.min_impurity_decrease < 0:
            raise ParameterError(f"min_impurity_decrease must be >= 0, got {self.min_impurity_decrease}")
        if self.feature_sampling not in ("node", "tree"):
            raise ParameterError(f"feature_sampling must be 'node' or 'tree', got {self.feature_sampling!r}")
        if self.max_samples is not None:
            if not self.bootstrap:
                raise ParameterError("max_samples needs bootstrap=True")
            if isinstance(self.max_samples, float) and not 0 < self.max_samples <= 1:
                raise ParameterError(f"max_samples as a fraction must be in (0, 1], got {self.max_samples}")
            if isinstance(self.max_samples, int) and self.max_samples < 1:
                raise ParameterError(f"max_samples must be >= 1, got {self.max_samples}")
        if not 2 <= self.max_bins <= 255:
            raise ParameterError(f"max_bins must be between 2 and 255, got {self.max_bins}")
        if self.privacy not in PRIVACY_MODES:
            raise ParameterError(f"privacy must be one of {PRIVACY_MODES} in the vertical setting, got {self.privacy!r}")
        if isinstance(self.paillier_key_bits, bool) or self.paillier_key_bits not in PAILLIER_KEY_BITS:
            raise ParameterError(f"paillier_key_bits must be one of {PAILLIER_KEY_BITS}, got {self.paillier_key_bits!r}")

    @property
    def criterion_code(self) -> int:
        """The numeric criterion used by the kernels."""
        return CRITERIA[self.criterion]

    def n_draws(self, n_rows: int) -> int | None:
        """Bootstrap sample size per tree, or None without bootstrap."""
        if not self.bootstrap:
            return None
        if self.max_samples is None:
            return n_rows
        if isinstance(self.max_samples, float):
            return max(1, round(self.max_samples * n_rows))
        return int(self.max_samples)

def candidate_count(max_features: str | int | float | None, n_features: int) -> int:
    """Features per candidate draw for scikit-learn's `max_features` (sqrt, log2, int, fraction, None)."""
    if max_features is None:
        k = n_features
    elif max_features == "sqrt":
        k = int(math.sqrt(n_features))
    elif max_features == "log2":
        k = int(math.log2(n_features))
    elif isinstance(max_features, float):
        k = int(max_features * n_features)
    else:
        k = int(max_features)
    return max(1, min(n_features, k))


def check_int(name: str, value: object, minimum: int) -> None:
    """Refuse a non-integer (or boolean) or one below `minimum`, naming the parameter."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ParameterError(f"{name} must be an integer >= {minimum}, got {value!r}")
