"""Hyper-parameters of the horizontal engines (Federated Extra-Trees and PPD-ERT), validated once."""

from __future__ import annotations

from dataclasses import dataclass

from fedcore.errors import ParameterError
from fedcore.trees.params import COMPLETE_NODE_BYTES, TreeParams

CLASSIFICATION_CRITERIA = ("gini", "entropy")
REGRESSION_CRITERIA = ("squared_error",)


@dataclass(frozen=True)
class ExtraTreesParams(TreeParams):
    """Hyper-parameters with scikit-learn's meanings. Extra-Trees grow on all rows (no bootstrap)."""

    @classmethod
    def from_config(cls, params: dict, privacy: object) -> ExtraTreesParams:
        """A config's `params:` (horizontal privacy needs nothing of them here: `plan.check_params`)."""
        return cls(**params)

    def _check_criterion(self) -> None:
        allowed = CLASSIFICATION_CRITERIA if self.task == "classification" else REGRESSION_CRITERIA
        if self.criterion not in allowed:
            raise ParameterError(f"criterion for {self.task} must be one of {list(allowed)}, got "
                                 f"{self.criterion!r}")

    def node_bytes(self, n_outputs: int, colocated_parties: int = 0) -> int:
        """The complete forest's node (fedcore/horizontal/model.py), held by the master and by every party."""
        return (COMPLETE_NODE_BYTES + 8 * n_outputs) * (1 + colocated_parties)
