"""The federation config: defaults, path resolution, and every refused field named with file and key."""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest

from fedcore.agents.data import institution_from_config
from fedcore.config import TrainingSettings, parse_config
from fedcore.errors import ConfigError
from fedcore.privacy.ldp import LabelLDP
from fedcore.privacy.settings import LocalDP, NoPrivacy, SecureAggregation
from fedcore.trees.boosting import BoostingParams

CONFIG = Path("/srv/federation/federation.yaml")


def _raw(**overrides) -> dict:
    raw = {
        "federation": "retail",
        "consortium_key": {"env": "FEDFOREST_CONSORTIUM_KEY"},
        "institutions": [
            {"name": "bank", "data": "data/bank/*.parquet", "id_column": "customer_id", "label": "responded"},
            {"name": "insurer", "data": "/data/insurer.csv", "id_column": "customer_id"},
        ],
    }
    return {**raw, **copy.deepcopy(overrides)}  # cases may share a value (TWO_MEMBERS)


def test_defaults_and_paths_relative_to_the_config_file() -> None:
    config = parse_config(_raw(), CONFIG)
    bank, insurer = config.institutions
    assert bank.data == "/srv/federation/data/bank/*.parquet" and insurer.data == "/data/insurer.csv"
    assert bank.registry == Path("/srv/federation/registry/bank") and insurer.work_pool == "insurer"
    assert config.training == TrainingSettings()
    assert (config.model_name, config.prediction_requester, config.promotion_metric) == ("retail", "bank",
                                                                                         "log_loss")
    assert (config.algorithm, config.privacy, config.alignment) == ("forest", NoPrivacy(), "hash")


def test_predictions_land_beside_the_registry_folder_not_inside_it(tmp_path) -> None:
    config = parse_config(_raw(), CONFIG)
    bank, _ = config.institutions
    assert bank.predictions == Path("/srv/federation/predictions/bank")  # not registry/predictions/bank
    assert not bank.predictions.is_relative_to(bank.registry.parent)
    raw = _raw()
    raw["institutions"][0]["predictions"] = "/data/bank/scores"
    assert parse_config(raw, CONFIG).institutions[0].predictions == Path("/data/bank/scores")
    # the folder the institution's agent writes to
    pd.DataFrame({"customer_id": ["a", "b"], "x": [1.0, 2.0], "responded": [0, 1]}).to_parquet(
        tmp_path / "bank.parquet")
    raw = _raw()
    raw["institutions"][0]["data"] = "bank.parquet"
    data = institution_from_config(parse_config(raw, tmp_path / "federation.yaml"), "bank")
    assert data.predictions_dir == tmp_path / "predictions" / "bank"


def test_a_horizontal_boosting_config_runs_secure_aggregation_on_the_estimators_bins() -> None:
    """`setting: horizontal, algorithm: boosting` (issue #32): XGBoost's names, 64 bins, secagg by default."""
    institutions = [{"name": n, "data": f"{n}.csv", "id_column": "id", "label": "y"} for n in ("a", "b")]
    config = parse_config(_raw(setting="horizontal", algorithm="boosting", institutions=institutions,
                               params={"n_estimators": 7, "colsample_bytree": 0.5}), CONFIG)
    assert (config.setting, config.algorithm, config.privacy) == ("horizontal", "boosting",
                                                                  SecureAggregation())
    assert config.params == BoostingParams(n_estimators=7, max_features=0.5, max_bins=64)
    plain = parse_config(_raw(setting="horizontal", algorithm="boosting", institutions=institutions,
                              privacy="none", params={"max_bins": 32}), CONFIG)
    assert plain.privacy == NoPrivacy() and plain.params.max_bins == 32


def test_a_horizontal_federation_defaults_to_plain_extra_trees() -> None:
    institutions = [{"name": n, "data": f"{n}.csv", "id_column": "id", "label": "y"} for n in ("a", "b")]
    config = parse_config(_raw(setting="horizontal", institutions=institutions), CONFIG)
    assert (config.setting, config.algorithm, config.privacy) == ("horizontal", "extra-trees", NoPrivacy())
    ppd = parse_config(_raw(setting="horizontal", algorithm="ppd-ert", institutions=institutions), CONFIG)
    assert ppd.privacy == SecureAggregation("histogram", 16)
    assert ppd.privacy.to_dict() == {"mode": "secagg", "thresholds": "histogram", "cells": 16}
    ppd = parse_config(_raw(setting="horizontal", algorithm="ppd-ert", institutions=institutions,
                            privacy={"mode": "secagg", "thresholds": "domain"}), CONFIG)
    assert (ppd.privacy.thresholds, ppd.privacy.cells) == ("domain", None)


def test_a_boosting_config_takes_xgboosts_names_and_round_trips_through_the_manifest() -> None:
    """`algorithm: boosting` with XGBoost's parameter names parses to BoostingParams (issue #32).

    Its `to_dict` (what a manifest stores) reads back to the same parameters.
    """
    names = {"n_estimators": 7, "max_depth": 3, "learning_rate": 0.2, "reg_lambda": 2.0, "gamma": 0.5,
             "min_child_weight": 0.5, "subsample": 0.8, "colsample_bytree": 0.6, "early_stopping_rounds": 3}
    config = parse_config(_raw(algorithm="boosting", params=names), CONFIG)
    assert config.algorithm == "boosting" and isinstance(config.params, BoostingParams)
    p = config.params
    assert (p.n_estimators, p.max_depth, p.learning_rate, p.reg_lambda, p.gamma, p.min_child_weight,
            p.subsample, p.max_features, p.early_stopping_rounds) == (7, 3, 0.2, 2.0, 0.5, 0.5, 0.8, 0.6, 3)
    assert (p.criterion, p.bootstrap, p.feature_sampling, p.privacy) == ("gradient", False, "tree", "none")
    assert BoostingParams.from_dict(p.to_dict()) == p


def test_training_settings_override_the_derived_values() -> None:
    config = parse_config(_raw(training={"model_name": "m", "predict_for": "insurer", "metric": "log_loss",
                                         "holdout": 0.3, "agent_idle_timeout_s": 60}), CONFIG)
    assert (config.model_name, config.prediction_requester, config.promotion_metric) == ("m", "insurer",
                                                                                         "log_loss")
    assert config.training.holdout == 0.3 and config.training.agent_idle_timeout_s == 60
    assert config.training.decision_threshold is None
    for threshold in (0.3, "auto"):
        assert parse_config(_raw(training={"decision_threshold": threshold}),
                            CONFIG).training.decision_threshold == threshold


@pytest.mark.parametrize(("training", "message"), [
    ({"promte_margin": 0.01}, "unknown training setting 'promte_margin'; did you mean 'promote_margin'?"),
    ({"speed": 3}, "unknown training setting 'speed'; known: ['agent_idle_timeout_s', "),
    ({"holdout": 1.0}, "training.holdout must be between 0 and 1 (exclusive), got 1.0"),
    ({"decision_threshold": 1.2},
     "training.decision_threshold must be a number between 0 and 1 or 'auto', got 1.2"),
    ({"decision_threshold": "high"},
     "training.decision_threshold must be a number between 0 and 1 or 'auto', got 'high'"),
    ({"connect_timeout_s": "soon"}, "training.connect_timeout_s must be a non-negative number, got 'soon'"),
    ({"min_overlap": -1}, "training.min_overlap must be a non-negative number, got -1"),
    ({"predict_for": "retailer"},
     "training.predict_for names no institution: 'retailer'; known: ['bank', 'insurer']"),
])
def test_bad_training_settings_are_refused_by_name(training, message) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_raw(training=training), CONFIG)
    assert str(caught.value).startswith(f"{CONFIG}: {message}")


TWO_MEMBERS = [{"name": "a", "data": "a.csv", "id_column": "id", "label": "y"},
               {"name": "b", "data": "b.csv", "id_column": "id", "label": "y"}]
"""Two horizontal institutions holding the same label: the least a horizontal federation lists."""


@pytest.mark.parametrize(("overrides", "message"), [
    ({"consortium_key": "0123456789abcdef0123"},
     "consortium_key must be {env: VARIABLE} or {file: path}, never the key itself"),
    ({"setting": "diagonal"}, "setting must be one of ('vertical', 'horizontal'), got 'diagonal'"),
    ({"institutions": [{"name": "bank", "data": "x.csv", "id_column": "id", "label": "y"},
                       {"name": "bank", "data": "y.csv", "id_column": "id"}]},
     "institution names must be unique, got ['bank', 'bank']"),
    ({"institutions": [{"name": "bank", "data": "x.csv", "id_column": "id"}]},
     "a vertical federation needs exactly one institution with 'label', found []"),
    ({"institutions": [{"name": "bank", "id_column": "id", "label": "y"}]},
     "institution 'bank' needs 'data'"),
    ({"params": {"n_trees": 5}}, "params: "),
    ({"algorithm": "extra-trees"},
     "the vertical setting offers algorithms ['forest', 'boosting'], got 'extra-trees'"),
    ({"algorithm": "boosting", "params": {"max_features": 0.5}},
     "params: boosting takes XGBoost's 'colsample_bytree', not 'max_features'"),
    ({"algorithm": "boosting", "params": {"early_stopping_rounds": 0}},
     "params: early_stopping_rounds must be"),
    ({"algorithm": "boosting", "privacy": "ldp"},
     "algorithm 'boosting' supports privacy ['none', 'paillier', 'ou'], got 'ldp'"),
    ({"alignment": "sha"},
     "alignment must be 'hash' (keyed hashes) or 'psi' (ECDH private set intersection), got 'sha'"),
    ({"setting": "horizontal"},
     "in a horizontal federation every institution holds the same label column; set 'label' for ['insurer']"),
    ({"setting": "horizontal", "algorithm": "extra-trees", "privacy": "secagg",
      "institutions": TWO_MEMBERS},
     "algorithm 'extra-trees' supports privacy ['none', 'ldp', 'gdp'], got 'secagg'"),
    ({"setting": "horizontal", "algorithm": "ppd-ert", "privacy": {"mode": "secagg", "cells": 3},
      "institutions": TWO_MEMBERS},
     "privacy: PPD-ERT histogram cells must be one of [4, 8, 16, 32, 64], got 3"),
    ({"setting": "horizontal", "algorithm": "ppd-ert",
      "privacy": {"mode": "secagg", "thresholds": "quantile"},
      "institutions": TWO_MEMBERS},
     "privacy: PPD-ERT thresholds must be one of ['histogram', 'domain'], got 'quantile'"),
    ({"setting": "horizontal", "algorithm": "boosting", "params": {"subsample": 0.5},
      "institutions": TWO_MEMBERS},
     "horizontal boosting takes subsample=1.0 only so far: a row's draw would depend on which party holds "
     "it, and 1, 2, 3 parties must grow the same model"),
    ({"setting": "horizontal", "algorithm": "boosting", "params": {"early_stopping_rounds": 3},
      "institutions": TWO_MEMBERS},
     "horizontal boosting has no early stopping yet: remove early_stopping_rounds"),
    ({"setting": "horizontal", "algorithm": "boosting", "privacy": {"mode": "secagg", "cells": 8},
      "institutions": TWO_MEMBERS},
     "privacy: Federated gradient boosting (horizontal) runs mode 'secagg' without fields, got ['cells']: "
     "they configure another algorithm's engine"),
    ({"setting": "horizontal", "algorithm": "boosting",  # the default value configures nothing either
      "privacy": {"mode": "secagg", "thresholds": "histogram", "cells": 16}, "institutions": TWO_MEMBERS},
     "privacy: Federated gradient boosting (horizontal) runs mode 'secagg' without fields, got ['cells', "
     "'thresholds']: they configure another algorithm's engine"),
    ({"setting": "horizontal", "algorithm": "boosting", "privacy": "ldp",
      "institutions": TWO_MEMBERS},
     "algorithm 'boosting' supports privacy ['secagg', 'none'], got 'ldp'"),
    ({"setting": "horizontal", "privacy": {"mode": "gdp", "thresholds": "domain"},
      "institutions": TWO_MEMBERS},
     "privacy: mode 'gdp' does not use field(s) ['thresholds']; valid: ['delta', 'epsilon', 'mode', 'plan', "
     "'split_levels']"),
    ({"setting": "horizontal", "privacy": {"mode": "gdp", "epsilon": 1, "delta": 1e-6, "plan": "splits"},
      "institutions": TWO_MEMBERS},
     "privacy 'gdp' needs a bounded depth: set params.max_depth (the model's budget is spread over trees x "
     "levels)"),
    ({"setting": "horizontal", "privacy": {"mode": "gdp", "epsilon": 0},
      "institutions": TWO_MEMBERS},
     "privacy: epsilon must be a finite number > 0, got 0: smaller epsilon = more noise and stronger "
     "privacy, larger = less noise (typical values 0.1 to 10)"),
])
def test_bad_federation_fields_are_refused_by_name(overrides, message) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_raw(**overrides), CONFIG)
    assert str(caught.value).startswith(f"{CONFIG}: {message}")


HORIZONTAL = [{"name": n, "data": f"{n}.csv", "id_column": "id", "label": "y"} for n in ("a", "b")]


def test_an_ldp_epsilon_is_honoured_not_ignored() -> None:
    """`{mode: ldp, epsilon: 0.1}` used to load and train at the Bloom defaults' epsilon 8.79 (issue #27)."""
    config = parse_config(_raw(setting="horizontal", institutions=HORIZONTAL,
                               privacy={"mode": "ldp", "mechanism": "bloom", "epsilon": 0.1}), CONFIG)
    assert isinstance(config.privacy, LocalDP)
    assert config.privacy.epsilon == pytest.approx(0.1, rel=1e-12) and config.privacy.epsilon <= 0.1
    krr = parse_config(_raw(setting="horizontal", institutions=HORIZONTAL,
                            privacy={"mode": "ldp", "mechanism": "krr", "epsilon": 4}), CONFIG)
    assert krr.privacy == LocalDP(LabelLDP(mechanism="krr", report_epsilon=4.0))


@pytest.mark.parametrize(("privacy", "params", "message"), [
    ({"mode": "ldp", "mechanism": "bloom", "n_bit": 32}, {},
     "privacy: unknown field(s) ['n_bit'] for mode 'ldp'; valid: ['epsilon', 'estimator', "
     "'keep_probability', 'mechanism', 'min_leaf_reports', 'mode', 'n_bits', 'n_hashes', 'p_one_if_one', "
     "'p_one_if_zero']"),
    ({"mode": "ldp", "n_bits": 32}, {},
     "privacy: mode 'ldp' with mechanism 'auto' and estimator 'nnls' does not use field(s) ['n_bits']; "
     "valid: ['epsilon', 'estimator', 'mechanism', 'min_leaf_reports', 'mode']"),
    ({"mode": "none", "epsilon": 0.1}, {},
     "privacy: mode 'none' does not use field(s) ['epsilon']; valid: ['mode']"),
    ({"mode": "ldp", "mechanism": "krr", "epsilon": 2, "keep_probability": 0.5}, {},
     "privacy: mode 'ldp' with mechanism 'krr' and estimator 'nnls' does not use field(s) "
     "['keep_probability']; valid: ['epsilon', 'estimator', 'mechanism', 'min_leaf_reports', 'mode']"),
    ("ldp", {"task": "regression", "criterion": "squared_error"},
     "privacy 'ldp' randomizes class labels and works for classification only; use 'gdp' (Gaussian noise) or "
     "'none' for a regression label"),
])
def test_a_privacy_field_is_refused_when_the_config_loads(privacy, params, message) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_raw(setting="horizontal", institutions=HORIZONTAL, privacy=privacy, params=params),
                     CONFIG)
    assert str(caught.value) == f"{CONFIG}: {message}"


def test_key_bits_belong_to_the_encrypted_label_modes(tmp_path) -> None:
    import yaml

    from fedcore.config import load_config
    from tests.federations import small_federation

    config_path, _ = small_federation(tmp_path, 200, seed=1, params={"n_estimators": 2})
    raw = yaml.safe_load(config_path.read_text())

    def load(privacy):
        raw["privacy"] = privacy
        config_path.write_text(yaml.safe_dump(raw))
        return load_config(config_path)

    with pytest.raises(ConfigError, match=r"privacy: mode 'none' does not use field\(s\) \['key_bits'\]; "
                                          r"valid: \['mode'\]"):
        load({"mode": "none", "key_bits": 3072})
    assert load({"mode": "paillier", "key_bits": 3072}).params.key_bits == 3072
    assert load({"mode": "paillier"}).params.key_bits == 2048
    assert (load({"mode": "ou"}).params.privacy, load({"mode": "ou"}).params.key_bits) == ("ou", 3072)
    with pytest.raises(ConfigError, match=r"privacy: key_bits must be one of \(2048, 3072\) for privacy 'ou' "
                                          r"\(Okamoto-Uchiyama modulus sizes\), got 1024"):
        load({"mode": "ou", "key_bits": 1024})


def test_an_institution_may_bound_its_agents_memory() -> None:
    from fedcore.agents.data import InstitutionData
    from fedcore.trees.budget import MIB

    raw = _raw()
    raw["institutions"][1]["memory_budget_mb"] = 2048
    bank, insurer = parse_config(raw, CONFIG).institutions
    assert (bank.memory_budget_mb, insurer.memory_budget_mb) == (None, 2048)
    data = InstitutionData("insurer", None, "customer_id", None, Path("r"), Path("p"), memory_budget_mb=2048)
    assert data.memory_budget == 2048 * MIB  # what its party reports to the master for the batch plan
    for bad in (0, -5, 1.5, True, "2G"):
        raw["institutions"][1]["memory_budget_mb"] = bad
        with pytest.raises(ConfigError,
                           match=f"institution 'insurer': memory_budget_mb must be a positive integer "
                                 rf"\(MiB\), got {bad!r}"):
            parse_config(raw, CONFIG)


SAFE_RULE = ("is not a safe name: it becomes a file or folder name, so it must start with a letter or digit "
             "and hold only letters, digits, '.', '_' or '-' (at most 128 characters)")


@pytest.mark.parametrize(("overrides", "field"), [
    ({"training": {"model_name": "../../x"}}, "training.model_name '../../x'"),
    ({"training": {"model_name": "/etc/cron.d/x"}}, "training.model_name '/etc/cron.d/x'"),
    ({"federation": ".hidden"}, "federation (the default model name) '.hidden'"),
    ({"institutions": [{"name": "../bank", "data": "b.csv", "id_column": "id", "label": "y"}]},
     "institutions[0].name '../bank'"),
])
def test_names_that_become_paths_are_refused_when_the_config_loads(overrides, field) -> None:
    """A bad model or institution name is refused before any work, not after a whole training run."""
    with pytest.raises(ConfigError) as refusal:
        parse_config(_raw(**overrides), CONFIG)
    assert str(refusal.value) == f"{CONFIG}: {field} {SAFE_RULE}"


@pytest.mark.parametrize("run_id", ["../x", ".hidden", "a/b", "", "run\n"])
def test_a_run_id_follows_the_same_name_rule(tmp_path, run_id) -> None:
    """A checkpoint folder's run id is a name like any other (`fedcore.names`): one rule, one message."""
    from fedcore.checkpoints import CheckpointStore
    from fedcore.errors import ArtifactError

    with pytest.raises(ArtifactError) as refusal:
        CheckpointStore(tmp_path, run_id, "context")
    assert str(refusal.value) == f"run id {run_id!r} {SAFE_RULE}"
    dotted = "flow-run.2026-11-27"
    assert CheckpointStore(tmp_path, dotted, "context").folder == tmp_path / dotted
