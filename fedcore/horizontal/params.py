"""Hyper-parameters of the horizontal engines (Federated Extra-Trees and PPD-ERT), validated once."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from fedcore.errors import ParameterError
from fedcore.trees.params import candidate_count, check_int

PRIVACY_MODES = ("none", "ldp", "gdp")
CLASSIFICATION_CRITERIA = ("gini", "entropy")
REGRESSION_CRITERIA = ("squared_error",)
DEPTH_UNLIMITED = 10_000


@dataclass(frozen=True)
class ExtraTreesParams:
    """Hyper-parameters with scikit-learn's meanings. Extra-Trees grow on all rows (no bootstrap)."""

    task: str = "classification"
    n_estimators: int = 100
    criterion: str = "gini"
    max_depth: int | None = None
    min_samples_split: int = 2
    min_samples_leaf: int = 1
    max_features: str | int | float | None = "sqrt"
    random_state: int = 0
    tree_batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.task not in ("classification", "regression"):
            raise ParameterError(f"task must be 'classification' or 'regression', got {self.task!r}")
        allowed = CLASSIFICATION_CRITERIA if self.task == "classification" else REGRESSION_CRITERIA
        if self.criterion not in allowed:
            raise ParameterError(f"criterion for {self.task} must be one of {list(allowed)}, got {self.criterion!r}")
        check_int("n_estimators", self.n_estimators, 1)
        if self.max_depth is not None:
            check_int("max_depth", self.max_depth, 1)
        check_int("min_samples_split", self.min_samples_split, 2)
        check_int("min_samples_leaf", self.min_samples_leaf, 1)
        check_int("random_state", self.random_state, 0)
        if self.tree_batch_size is not None:
            check_int("tree_batch_size", self.tree_batch_size, 1)
        mf = self.max_features
        if isinstance(mf, bool):
            raise ParameterError(f"max_features must be 'sqrt', 'log2', an int, a float in (0, 1] or None, got {mf!r}")
        if isinstance(mf, str) and mf not in ("sqrt", "log2"):
            raise ParameterError(f"max_features must be 'sqrt', 'log2', an int, a float in (0, 1] or None, got {mf!r}")
        if isinstance(mf, float) and not 0 < mf <= 1:
            raise ParameterError(f"max_features as a fraction must be in (0, 1], got {mf}")
        if isinstance(mf, int) and mf < 1:
            raise ParameterError(f"max_features must be >= 1, got {mf}")

    def n_candidate_features(self, n_features: int) -> int:
        """How many candidate features each node draws."""
        return candidate_count(self.max_features, n_features)

    @property
    def depth_limit(self) -> int:
        """max_depth, or a bound no tree reaches."""
        return self.max_depth if self.max_depth is not None else DEPTH_UNLIMITED

    def batches(self) -> list[list[int]]:
        """Tree indices grouped into the batches grown together."""
        size = self.tree_batch_size or self.n_estimators
        return [list(range(a, min(a + size, self.n_estimators))) for a in range(0, self.n_estimators, size)]

    def to_dict(self) -> dict:
        """JSON-ready parameters."""
        return asdict(self)


def check_privacy_mode(privacy: str, task: str) -> str:
    """Refuse unknown privacy modes and LDP for regression."""
    if privacy not in PRIVACY_MODES:
        raise ParameterError(f"privacy must be one of {list(PRIVACY_MODES)}, got {privacy!r}")
    if privacy == "ldp" and task != "classification":
        raise ParameterError("privacy='ldp' randomizes class labels and works for classification only; "
                             "use privacy='gdp' (Laplace noise) or 'none' for regression")
    return privacy
