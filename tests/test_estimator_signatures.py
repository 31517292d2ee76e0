"""Each classifier and regressor pair takes the same parameters, but for `decision_threshold`.

scikit-learn's `get_params` reads an estimator's parameters from its own `__init__` signature, so every
estimator spells its parameters out (as scikit-learn's own do). This keeps the pairs from drifting apart:
a parameter added to one and not the other, or a changed default, fails here.
"""

from __future__ import annotations

import inspect

import pytest

from fedcore.horizontal.boosting import HorizontalBoostingClassifier, HorizontalBoostingRegressor
from fedcore.horizontal.estimators import FederatedExtraTreesClassifier, FederatedExtraTreesRegressor
from fedcore.vertical.boosting_estimators import FederatedBoostingClassifier, FederatedBoostingRegressor
from fedcore.vertical.estimators import FederatedForestClassifier, FederatedForestRegressor

FOREST_TASK_DEFAULTS = {"criterion": ("gini", "squared_error"), "max_features": ("sqrt", 1.0)}
PAIRS = [  # (classifier, regressor, the defaults that differ by task, as scikit-learn's forests')
    (FederatedForestClassifier, FederatedForestRegressor, FOREST_TASK_DEFAULTS),
    (FederatedExtraTreesClassifier, FederatedExtraTreesRegressor, FOREST_TASK_DEFAULTS),
    (FederatedBoostingClassifier, FederatedBoostingRegressor, {}),
    (HorizontalBoostingClassifier, HorizontalBoostingRegressor, {}),
]


@pytest.mark.parametrize(("classifier", "regressor", "task_defaults"), PAIRS,
                         ids=[c.__name__ for c, _, _ in PAIRS])
def test_a_classifier_takes_its_regressors_parameters_and_a_decision_threshold(classifier, regressor,
                                                                               task_defaults) -> None:
    ours = dict(inspect.signature(classifier.__init__).parameters)
    theirs = dict(inspect.signature(regressor.__init__).parameters)
    threshold = ours.pop("decision_threshold")
    assert threshold.default is None and threshold.kind is inspect.Parameter.KEYWORD_ONLY
    assert list(ours) == list(theirs)
    for name, parameter in ours.items():
        other = theirs[name]
        assert (parameter.kind, parameter.annotation) == (other.kind, other.annotation), name
        if name in task_defaults:
            assert (parameter.default, other.default) == task_defaults[name], name
        else:
            assert parameter.default == other.default, name
