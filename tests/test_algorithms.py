"""The algorithm registry: canonical ids in, old spellings only when reading stored models."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedcore.algorithms import (
    ALGORITHMS,
    BOOSTING,
    EXTRA_TREES,
    FOREST,
    HORIZONTAL_BOOSTING,
    PPD_ERT,
    algorithm,
    in_setting,
    load,
    read_algorithm,
)
from fedcore.errors import ParameterError


def test_each_setting_lists_its_algorithms_default_first() -> None:
    assert in_setting("vertical") == (FOREST, BOOSTING)
    assert in_setting("horizontal") == (EXTRA_TREES, PPD_ERT, HORIZONTAL_BOOSTING)
    with pytest.raises(ParameterError,
                       match=r"unknown setting 'diagonal': choose one of \['vertical', 'horizontal'\]"):
        in_setting("diagonal")


def test_input_takes_canonical_ids_only() -> None:
    assert algorithm("ppd-ert", "horizontal") is PPD_ERT
    with pytest.raises(ParameterError, match=r"the vertical setting offers algorithms "
                                             r"\['forest', 'boosting'\], got 'ppd-ert'"):
        algorithm("ppd-ert", "vertical")
    with pytest.raises(ParameterError,
                       match=r"the horizontal setting offers algorithms \['extra-trees', 'ppd-ert', "
                             r"'boosting'\], got 'fet'"):
        algorithm("fet", "horizontal")


def test_stored_models_may_use_the_old_spellings() -> None:
    assert [read_algorithm(old).id for old in ("federated-forest", "fet", "ppdert")] == [
        "forest", "extra-trees", "ppd-ert"]
    assert all(read_algorithm(a).id == a for a in ALGORITHMS)
    with pytest.raises(ParameterError,
                       match=r"unknown algorithm 'xgboost': fedforest has \['forest', 'extra-trees', "
                             r"'ppd-ert', 'boosting'\]"):
        read_algorithm("xgboost")


def test_privacy_modes_are_checked_per_algorithm() -> None:
    defaults = (FOREST.default_privacy, EXTRA_TREES.default_privacy, PPD_ERT.default_privacy)
    assert defaults == ("none", "none", "secagg")
    assert FOREST.check_privacy("ou") == "ou"
    with pytest.raises(ParameterError,
                       match=r"algorithm 'ppd-ert' supports privacy \['secagg', 'secagg-dp'\], got 'ldp'"):
        PPD_ERT.check_privacy("ldp")


def test_one_id_lives_in_both_settings_told_apart_by_setting() -> None:
    """Boosting is vertical (SecureBoost, plain) and horizontal (histograms under secure aggregation)."""
    assert algorithm("boosting", "vertical") is BOOSTING
    assert BOOSTING.privacy_modes == ("none", "paillier", "ou")
    assert algorithm("boosting", "horizontal") is HORIZONTAL_BOOSTING
    assert HORIZONTAL_BOOSTING.privacy_modes == ("secagg", "none") and HORIZONTAL_BOOSTING.deployable
    assert list(ALGORITHMS) == ["forest", "extra-trees", "ppd-ert", "boosting"]  # by id: manifests, titles
    # a manifest names its setting beside the id: the card and the flows read that setting's entry
    assert read_algorithm("boosting") is BOOSTING
    assert read_algorithm("boosting", "horizontal") is HORIZONTAL_BOOSTING
    assert read_algorithm("fet", "horizontal") is EXTRA_TREES


def test_boosting_is_deployable_with_plain_or_encrypted_gradients() -> None:
    """Configs, agents and flows run it (tests/vertical/test_boosting_session.py), plain or SecureBoost."""
    assert FOREST.deployable and BOOSTING.deployable and BOOSTING.privacy_modes == ("none", "paillier", "ou")


def test_importing_the_registry_and_the_config_imports_no_engine() -> None:
    """Each entry names its implementation by import path: the config sits below the settings."""
    engines = ("fedcore.horizontal", "fedcore.vertical", "fedcore.trees", "fedcore.simulation")
    code = f"import sys, fedcore.config; print(sorted(m for m in sys.modules if m.startswith({engines!r})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_each_entry_loads_its_implementation() -> None:
    """Params class and parser, simulator and reference; deployable ones: the session and agent factories."""
    from fedcore.horizontal.boosting import HorizontalBoostingClassifier
    from fedcore.horizontal.estimators import FederatedExtraTreesClassifier, PPDERTClassifier
    from fedcore.horizontal.params import ExtraTreesParams
    from fedcore.privacy.settings import parse_privacy
    from fedcore.trees.boosting import BoostingParams
    from fedcore.trees.params import ForestParams
    from fedcore.vertical.boosting_estimators import FederatedBoostingClassifier
    from fedcore.vertical.estimators import FederatedForestClassifier

    classifiers = {FOREST: FederatedForestClassifier, EXTRA_TREES: FederatedExtraTreesClassifier,
                   PPD_ERT: PPDERTClassifier, BOOSTING: FederatedBoostingClassifier,
                   HORIZONTAL_BOOSTING: HorizontalBoostingClassifier}
    expected = {FOREST: ForestParams, EXTRA_TREES: ExtraTreesParams, PPD_ERT: ExtraTreesParams,
                BOOSTING: BoostingParams, HORIZONTAL_BOOSTING: BoostingParams}
    for entry, cls in expected.items():
        assert entry.params_class() is cls
        assert callable(load(entry.simulate)) and callable(load(entry.reference))
        assert entry.estimator_class("classification") is classifiers[entry]
        if entry.deployable:
            assert callable(load(entry.session or "")) and callable(load(entry.agent or ""))
            parsed = entry.params_from_config({"n_estimators": 3}, parse_privacy(None, entry))
            assert type(parsed) is cls and parsed.n_estimators == 3
    assert all(entry.deployable for entry in expected), "every algorithm runs from a federation config"
    with pytest.raises(ParameterError, match=r"^PPD-ERT has no regression estimator$"):
        PPD_ERT.estimator_class("regression")
    with pytest.raises(ParameterError, match=r"^set label protection in the 'privacy:' section"):
        FOREST.params_from_config({"key_bits": 2048}, parse_privacy(None, FOREST))
