"""Horizontal setting (same columns, different rows): Federated Extra-Trees and PPD-ERT.

Modules: `schema` (the agreed columns and encoding), `validation` (bad input, named errors), `params`,
`model` (the complete forest, local prediction, Arrow table), `growth` (level-wise growth shared by both
algorithms), `party` / `master` (FET roles), `ppdert` (PPD-ERT roles), `estimators` (simulation API).
"""

from fedcore.horizontal.estimators import (
    FederatedExtraTreesClassifier,
    FederatedExtraTreesRegressor,
    PPDERTClassifier,
)
from fedcore.horizontal.model import HorizontalForest

__all__ = ["FederatedExtraTreesClassifier", "FederatedExtraTreesRegressor", "PPDERTClassifier", "HorizontalForest"]
