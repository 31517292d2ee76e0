"""Horizontal setting (same columns, different rows): Federated Extra-Trees, PPD-ERT and histogram boosting.

Modules: `schema` (the agreed columns and encoding), `validation` (bad input, named errors), `params`,
`model` (the complete forest, local prediction, Arrow table), `growth` (the master's level strategy
shared by both algorithms: draws and split choice; the loop is `fedcore/trees/grower.py`), `rows` (the
party's rows, partition and counting, composed by both), `fet/` and `ppdert/` (each algorithm's master
and party), `boosting/` (histogram boosting under PPD-ERT's secure aggregation), `estimators` (simulation
API).
"""

from fedcore.horizontal.estimators import (
    FederatedExtraTreesClassifier,
    FederatedExtraTreesRegressor,
    PPDERTClassifier,
)
from fedcore.horizontal.model import HorizontalForest

__all__ = ["FederatedExtraTreesClassifier", "FederatedExtraTreesRegressor", "PPDERTClassifier",
           "HorizontalForest"]
