"""Hyper-parameters of the horizontal engines (Federated Extra-Trees and PPD-ERT), validated once."""

from __future__ import annotations

from dataclasses import dataclass

from fedcore.algorithms import EXTRA_TREES
from fedcore.errors import ParameterError
from fedcore.trees.params import COMPLETE_NODE_BYTES, TreeParams

PRIVACY_MODES = EXTRA_TREES.privacy_modes
CLASSIFICATION_CRITERIA = ("gini", "entropy")
REGRESSION_CRITERIA = ("squared_error",)


@dataclass(frozen=True)
class ExtraTreesParams(TreeParams):
    """Hyper-parameters with scikit-learn's meanings. Extra-Trees grow on all rows (no bootstrap)."""

    def _check_criterion(self) -> None:
        allowed = CLASSIFICATION_CRITERIA if self.task == "classification" else REGRESSION_CRITERIA
        if self.criterion not in allowed:
            raise ParameterError(f"criterion for {self.task} must be one of {list(allowed)}, got "
                                 f"{self.criterion!r}")

    def node_bytes(self, n_outputs: int, colocated_parties: int = 0) -> int:
        """The complete forest's node (fedcore/horizontal/model.py), held by the master and by every party."""
        return (COMPLETE_NODE_BYTES + 8 * n_outputs) * (1 + colocated_parties)


def check_privacy_mode(privacy: str, task: str) -> str:
    """Refuse unknown privacy modes and LDP for regression."""
    if privacy not in PRIVACY_MODES:
        raise ParameterError(f"privacy must be one of {list(PRIVACY_MODES)}, got {privacy!r}")
    if privacy == "ldp" and task != "classification":
        raise ParameterError("privacy='ldp' randomizes class labels and works for classification only; "
                             "use privacy='gdp' (Laplace noise) or 'none' for regression")
    return privacy
