"""One parameter check for both settings: the shared fields are refused with the same messages."""

from __future__ import annotations

import pytest

from fedcore.errors import ParameterError
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.trees.params import DEPTH_UNLIMITED, ForestParams, TreeParams

SETTINGS = [ForestParams, ExtraTreesParams]


@pytest.mark.parametrize("params", SETTINGS)
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_features": True}, "max_features must be 'sqrt', 'log2', an int, a float in (0, 1] or None, got True"),
    ({"max_features": "half"}, "max_features must be 'sqrt', 'log2', an int, a float in (0, 1] or None, got 'half'"),
    ({"max_features": [2]}, "max_features must be 'sqrt', 'log2', an int, a float in (0, 1] or None, got [2]"),
    ({"max_features": 1.5}, "max_features as a fraction must be in (0, 1], got 1.5"),
    ({"max_features": 0}, "max_features must be >= 1, got 0"),
    ({"n_estimators": True}, "n_estimators must be an integer >= 1, got True"),
    ({"max_depth": False}, "max_depth must be an integer >= 1, got False"),
    ({"min_samples_leaf": 0}, "min_samples_leaf must be an integer >= 1, got 0"),
    ({"random_state": -1}, "random_state must be an integer >= 0, got -1"),
    ({"tree_batch_size": 2.0}, "tree_batch_size must be an integer >= 1, got 2.0"),
    ({"task": "ranking"}, "task must be 'classification' or 'regression', got 'ranking'"),
])
def test_shared_fields_are_refused_alike_in_both_settings(params: type[TreeParams], kwargs: dict, message: str) -> None:
    with pytest.raises(ParameterError) as excinfo:
        params(**kwargs)
    assert str(excinfo.value) == message


@pytest.mark.parametrize("params", SETTINGS)
def test_shared_behaviour(params: type[TreeParams]) -> None:
    p = params(n_estimators=7, tree_batch_size=3, max_features=0.5)
    assert p.batches() == [[0, 1, 2], [3, 4, 5], [6]]
    assert params(n_estimators=2).batches() == [[0, 1]]
    assert p.n_candidate_features(10) == 5 and p.depth_limit == DEPTH_UNLIMITED
    assert params(max_depth=4).depth_limit == 4


def test_each_setting_keeps_its_own_criteria() -> None:
    ForestParams(criterion="log_loss")
    with pytest.raises(ParameterError, match=r"criterion for classification must be one of \['gini', 'entropy'\], "
                                             r"got 'log_loss'"):
        ExtraTreesParams(criterion="log_loss")
    with pytest.raises(ParameterError, match="criterion 'gini' does not fit task 'regression'"):
        ForestParams(task="regression")
