"""One parameter check for both settings: the shared fields are refused with the same messages."""

from __future__ import annotations

import pytest

from fedcore.errors import ParameterError
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.trees.params import DEPTH_UNLIMITED, ForestParams, TreeParams

SETTINGS = [ForestParams, ExtraTreesParams]


@pytest.mark.parametrize("params", SETTINGS)
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_features": True},
     "max_features must be 'sqrt', 'log2', an int, a float in (0, 1] or None, got True"),
    ({"max_features": "half"},
     "max_features must be 'sqrt', 'log2', an int, a float in (0, 1] or None, got 'half'"),
    ({"max_features": [2]},
     "max_features must be 'sqrt', 'log2', an int, a float in (0, 1] or None, got [2]"),
    ({"max_features": 1.5}, "max_features as a fraction must be in (0, 1], got 1.5"),
    ({"max_features": 0}, "max_features must be >= 1, got 0"),
    ({"n_estimators": True}, "n_estimators must be an integer >= 1, got True"),
    ({"max_depth": False}, "max_depth must be an integer >= 1, got False"),
    ({"min_samples_leaf": 0}, "min_samples_leaf must be an integer >= 1, got 0"),
    ({"random_state": -1}, "random_state must be an integer >= 0, got -1"),
    ({"tree_batch_size": 2.0}, "tree_batch_size must be an integer >= 1, got 2.0"),
    ({"task": "ranking"}, "task must be 'classification' or 'regression', got 'ranking'"),
    ({"n_estimators": 2**31 + 1},
     "n_estimators must be at most 2147483648 (tree numbers are int32 in the model tables and messages), got "
     "2147483649"),
    ({"n_estimators": 10**12}, "n_estimators must be at most 2147483648 (tree numbers are int32 in the model "
                               "tables and messages), got 1000000000000"),
    ({"max_depth": 2**15},
     "max_depth must be at most 32767 (node depths are int16 in the model tables), got 32768"),
])
def test_shared_fields_are_refused_alike_in_both_settings(params: type[TreeParams], kwargs: dict,
                                                          message: str) -> None:
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
    with pytest.raises(ParameterError,
                       match=r"criterion for classification must be one of \['gini', 'entropy'\], "
                             r"got 'log_loss'"):
        ExtraTreesParams(criterion="log_loss")
    with pytest.raises(ParameterError, match="criterion 'gini' does not fit task 'regression'"):
        ForestParams(task="regression")


def test_the_bounds_themselves_are_accepted() -> None:
    for params in SETTINGS:
        # nothing is allocated yet
        assert params(n_estimators=2**31, max_depth=2**15 - 1).n_estimators == 2**31
    # horizontal parties have no cap
    assert ExtraTreesParams(tree_batch_size=100_001).tree_batch_size == 100_001


def test_vertical_batches_stay_within_what_a_party_accepts() -> None:
    with pytest.raises(ParameterError) as excinfo:
        ForestParams(tree_batch_size=100_001)
    assert str(excinfo.value) == ("tree_batch_size must be at most 100000 (a vertical party refuses larger "
                                  "batches), got 100001")
    # a memory plan larger than a party accepts (a machine with much free memory) is cut to its limit
    p = ForestParams(n_estimators=250_001, max_depth=1)
    assert [len(b) for b in p.batches()] == [100_000, 100_000, 50_001]
    assert [len(b) for b in p.batches(10**9)] == [100_000, 100_000, 50_001]
    assert [len(b) for b in p.batches(60_000)] == [60_000] * 4 + [10_001]
    assert [len(b) for b in ExtraTreesParams(n_estimators=250_001).batches()] == [250_001]


def test_max_bins_and_max_samples_say_why() -> None:
    for bad in (1, 256, 2.5, True):
        with pytest.raises(ParameterError) as excinfo:
            ForestParams(max_bins=bad)
        assert str(excinfo.value) == ("max_bins must be an integer between 2 and 255 (bin codes are uint8 "
                                      f"and code 255 marks missing values), got {bad!r}")
    p = ForestParams(max_samples=500)
    assert p.n_draws(500) == 500
    with pytest.raises(ParameterError) as excinfo:
        p.n_draws(499)
    assert str(excinfo.value) == ("max_samples must be at most the 499 training rows (a bootstrap sample "
                                  "draws from them), got 500; pass a fraction to scale with the data")


def test_parameters_written_before_the_okamoto_uchiyama_option_still_read() -> None:
    """Manifests of earlier versions hold `paillier_key_bits` (2048 even in plain mode); they still load."""
    plain = ForestParams(n_estimators=3).to_dict()
    old_plain = {**{k: v for k, v in plain.items() if k != "key_bits"}, "paillier_key_bits": 2048}
    assert ForestParams.from_dict(old_plain) == ForestParams(n_estimators=3)
    old_paillier = {**old_plain, "privacy": "paillier", "paillier_key_bits": 3072}
    assert ForestParams.from_dict(old_paillier) == ForestParams(n_estimators=3, privacy="paillier",
                                                                key_bits=3072)
    assert ForestParams.from_dict(ForestParams(privacy="ou").to_dict()).key_bits == 3072
