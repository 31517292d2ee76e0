"""The one privacy parser (`fedcore.privacy.settings`): every mode's fields, honoured or refused by name."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedcore.algorithms import EXTRA_TREES, FOREST, PPD_ERT
from fedcore.errors import ParameterError
from fedcore.privacy.ldp import LabelLDP
from fedcore.privacy.settings import (
    EncryptedLabels,
    GlobalDP,
    LocalDP,
    NoPrivacy,
    SecureAggregation,
    parse_privacy,
    privacy_with,
)

LDP_FIELDS = "['epsilon', 'estimator', 'mechanism', 'min_leaf_reports', 'mode']"
BLOOM_FIELDS = ("['epsilon', 'estimator', 'keep_probability', 'mechanism', 'min_leaf_reports', 'mode', "
                "'n_bits', 'n_hashes', 'p_one_if_one', 'p_one_if_zero']")


@pytest.mark.parametrize(("raw", "algorithm", "expected"), [
    (None, EXTRA_TREES, NoPrivacy()),
    ("gdp", EXTRA_TREES, GlobalDP(1.0)),
    ({"mode": "gdp", "epsilon": 0.5}, EXTRA_TREES, GlobalDP(0.5)),
    ({"mode": "gdp", "epsilon": 4, "delta": 1e-8}, EXTRA_TREES, GlobalDP(4.0, 1e-8)),
    ({"mode": "ldp"}, EXTRA_TREES, LocalDP(LabelLDP(mechanism="auto", report_epsilon=2.0))),
    ({"mode": "ldp", "mechanism": "krr", "epsilon": 2}, EXTRA_TREES,
     LocalDP(LabelLDP(mechanism="krr", report_epsilon=2.0))),
    ({"mode": "ldp", "mechanism": "oue", "epsilon": 1, "estimator": "lasso", "lasso_alpha": 0.1}, EXTRA_TREES,
     LocalDP(LabelLDP(mechanism="oue", report_epsilon=1.0, estimator="lasso", lasso_alpha=0.1))),
    ({"mode": "ldp", "mechanism": "bloom", "n_bits": 64, "estimator": "lasso", "lasso_alpha": 0.1},
     EXTRA_TREES,
     LocalDP(LabelLDP(mechanism="bloom", n_bits=64, estimator="lasso", lasso_alpha=0.1))),
    (None, PPD_ERT, SecureAggregation("histogram", 16)),
    ({"mode": "secagg", "cells": 64}, PPD_ERT, SecureAggregation("histogram", 64)),
    ({"mode": "secagg", "thresholds": "domain"}, PPD_ERT, SecureAggregation("domain")),
    ("paillier", FOREST, EncryptedLabels("paillier", 2048)),
    ({"mode": "ou"}, FOREST, EncryptedLabels("ou", 3072)),
    ({"mode": "paillier", "key_bits": 3072}, "forest", EncryptedLabels("paillier", 3072)),
])
def test_every_mode_parses_to_its_setting_and_back_from_its_wire_form(raw, algorithm, expected) -> None:
    setting = parse_privacy(raw, algorithm)
    assert setting == expected
    assert parse_privacy(setting.to_dict(), algorithm) == setting  # the master's setup header, read back
    assert parse_privacy(setting, algorithm) is setting


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 3.0, 8.788898309344878])
def test_an_ldp_epsilon_sets_the_bloom_mechanism_to_that_epsilon_never_above_it(epsilon) -> None:
    """`{mode: ldp, mechanism: bloom, epsilon: 0.1}` is honoured: the label mechanism's epsilon is 0.1."""
    setting = parse_privacy({"mode": "ldp", "mechanism": "bloom", "epsilon": epsilon}, EXTRA_TREES)
    assert isinstance(setting, LocalDP) and setting.ldp.mechanism == "bloom"
    permanent = setting.ldp.epsilon()["permanent"]
    assert permanent <= epsilon and permanent == pytest.approx(epsilon, rel=1e-12)
    assert setting.ldp.keep_probability == pytest.approx(np.tanh(epsilon / 16), rel=1e-12)
    with_hashes = parse_privacy({"mode": "ldp", "mechanism": "bloom", "epsilon": epsilon, "n_hashes": 2},
                                EXTRA_TREES)
    assert with_hashes.ldp.epsilon()["permanent"] == pytest.approx(epsilon, rel=1e-12)
    for mechanism in ("krr", "oue", "auto"):  # one report per row, at that epsilon
        one = parse_privacy({"mode": "ldp", "mechanism": mechanism, "epsilon": epsilon}, EXTRA_TREES)
        assert one.ldp.epsilon() == {"permanent": epsilon, "instant": epsilon}


def test_the_default_ldp_setting_is_auto_at_epsilon_2_for_every_one_report_mechanism() -> None:
    for raw in ("ldp", {"mode": "ldp"}, *({"mode": "ldp", "mechanism": m} for m in ("krr", "oue"))):
        setting = parse_privacy(raw, EXTRA_TREES)
        assert isinstance(setting, LocalDP) and setting.epsilon == 2.0
        assert setting.to_dict()["epsilon"] == 2.0
    assert parse_privacy("ldp", EXTRA_TREES).to_dict() == {"mode": "ldp", "mechanism": "auto", "epsilon": 2.0,
                                                           "estimator": "nnls"}


@pytest.mark.parametrize(("epsilon", "n_classes", "mechanism"), [
    (2.0, 24, "krr"), (2.0, 25, "oue"),  # 3 e^2 = 22.17: GRR while C - 2 < 22.17
    (1.0, 10, "krr"), (1.0, 11, "oue"),  # 3 e = 8.15
    (0.1, 5, "krr"), (0.1, 6, "oue"),  # 3 e^0.1 = 3.32
])
def test_auto_resolves_to_grr_or_oue_by_variance_for_the_agreed_classes(epsilon, n_classes,
                                                                          mechanism) -> None:
    """GRR when C - 2 < 3 e^eps (its variance (e^eps + C - 2) below OUE's 4 e^eps), else OUE.

    On the wire and read back as the resolved mechanism, which resolves to itself (a master and a party
    agree).
    """
    setting = parse_privacy({"mode": "ldp", "epsilon": epsilon}, EXTRA_TREES)
    resolved = setting.for_classes(n_classes)
    assert resolved == LocalDP(LabelLDP(mechanism=mechanism, report_epsilon=epsilon))
    assert resolved.to_dict()["mechanism"] == mechanism
    assert parse_privacy(resolved.to_dict(), EXTRA_TREES).for_classes(n_classes) == resolved
    assert resolved.budget() == {"mechanism": mechanism, "epsilon": epsilon, "epsilon_total": epsilon,
                                 "delta": 0.0}
    bloom = parse_privacy({"mode": "ldp", "mechanism": "bloom"}, EXTRA_TREES)
    assert bloom.for_classes(n_classes) == bloom
    assert parse_privacy("gdp", EXTRA_TREES).for_classes(3) == GlobalDP()


@pytest.mark.parametrize(("raw", "algorithm", "message"), [
    ({"mode": "ldp", "n_bit": 32}, EXTRA_TREES,
     f"privacy: unknown field(s) ['n_bit'] for mode 'ldp'; valid: {LDP_FIELDS}"),
    ({"mode": "ldp", "ldp": {"n_bits": 32}}, EXTRA_TREES,
     f"privacy: unknown field(s) ['ldp'] for mode 'ldp'; valid: {LDP_FIELDS} (ldp: the LabelLDP fields now "
     "go directly under privacy:)"),
    ({"mode": "ldp", "mechanism": "krr", "epsilon_krr": 4}, EXTRA_TREES,
     "privacy: unknown field(s) ['epsilon_krr'] for mode 'ldp'; valid: ['epsilon', 'estimator', 'mechanism', "
     "'min_leaf_reports', 'mode'] (epsilon_krr: each row's label epsilon is privacy.epsilon)"),
    ({"mode": "ldp", "mechanism": "oue", "report_epsilon": 4}, EXTRA_TREES,
     "privacy: unknown field(s) ['report_epsilon'] for mode 'ldp'; valid: ['epsilon', 'estimator', "
     "'mechanism', 'min_leaf_reports', 'mode'] (report_epsilon: each row's label epsilon is "
     "privacy.epsilon)"),
    ({"mode": "none", "epsilon": 0.5}, EXTRA_TREES,
     "privacy: mode 'none' does not use field(s) ['epsilon']; valid: ['mode']"),
    ({"epsilon": 0.5}, EXTRA_TREES,  # no mode: the default, none
     "privacy: mode 'none' does not use field(s) ['epsilon']; valid: ['mode']"),
    ({"mode": "gdp", "n_bits": 32}, EXTRA_TREES,
     "privacy: mode 'gdp' does not use field(s) ['n_bits']; valid: ['delta', 'epsilon', 'mode', 'plan', "
     "'split_levels']"),
    ({"mode": "gdp", "plan": "trees"}, EXTRA_TREES,
     "privacy: gdp's plan must be one of ['auto', 'splits', 'leaves', 'marginals'], got 'trees'"),
    ({"mode": "gdp", "plan": "splits", "split_levels": 2}, EXTRA_TREES,
     "privacy: gdp's split_levels applies to plans 'leaves' and 'marginals' only, not 'splits'"),
    ({"mode": "gdp", "plan": "leaves", "split_levels": -1}, EXTRA_TREES,
     "privacy: gdp's split_levels must be an integer >= 0, got -1"),
    ({"mode": "ldp", "mechanism": "krr", "epsilon": 2, "n_hashes": 2}, EXTRA_TREES,
     "privacy: mode 'ldp' with mechanism 'krr' and estimator 'nnls' does not use field(s) ['n_hashes']; "
     "valid: ['epsilon', 'estimator', 'mechanism', 'min_leaf_reports', 'mode']"),
    ({"mode": "ldp", "mechanism": "oue", "epsilon": 2, "keep_probability": 0.5}, EXTRA_TREES,
     "privacy: mode 'ldp' with mechanism 'oue' and estimator 'nnls' does not use field(s) "
     "['keep_probability']; valid: ['epsilon', 'estimator', 'mechanism', 'min_leaf_reports', 'mode']"),
    ({"mode": "ldp", "n_bits": 32}, EXTRA_TREES,  # no mechanism: the default, auto
     "privacy: mode 'ldp' with mechanism 'auto' and estimator 'nnls' does not use field(s) ['n_bits']; "
     f"valid: {LDP_FIELDS}"),
    ({"mode": "ldp", "lasso_alpha": 0.1}, EXTRA_TREES,
     "privacy: mode 'ldp' with mechanism 'auto' and estimator 'nnls' does not use field(s) "
     f"['lasso_alpha']; valid: {LDP_FIELDS}"),
    ({"mode": "ldp", "mechanism": "bloom", "lasso_alpha": 0.1}, EXTRA_TREES,
     "privacy: mode 'ldp' with mechanism 'bloom' and estimator 'nnls' does not use field(s) "
     f"['lasso_alpha']; valid: {BLOOM_FIELDS}"),
    ({"mode": "ldp", "mechanism": "bloom", "epsilon": 1, "keep_probability": 0.5}, EXTRA_TREES,
     "privacy: give epsilon or keep_probability, not both: under mode 'ldp' with mechanism 'bloom', epsilon "
     "sets keep_probability to tanh(epsilon / (4 n_hashes))"),
    ({"mode": "ldp", "mechanism": "oue", "epsilon": 0}, EXTRA_TREES,
     "privacy: epsilon must be a finite number > 0, got 0: smaller epsilon = more noise and stronger "
     "privacy, larger = less noise (typical values 0.1 to 10)"),
    ({"mode": "ldp", "mechanism": "rappor"}, EXTRA_TREES,
     "privacy: mechanism must be one of ['auto', 'krr', 'oue', 'bloom'], got 'rappor'"),
    ({"mode": "ldp", "mechanism": "bloom", "n_bits": 1}, EXTRA_TREES,
     "privacy: n_bits must be an integer >= 2, got 1: use a larger Bloom filter (e.g. n_bits=32), or leave "
     "it unset to size it to the classes"),
    ({"mode": "ldp", "epsilon": -1}, EXTRA_TREES,
     "privacy: epsilon must be a finite number > 0, got -1: smaller epsilon = more noise and stronger "
     "privacy, larger = less noise (typical values 0.1 to 10)"),
    ({"mode": "gdp", "delta": 0.1}, EXTRA_TREES,
     "privacy: delta must be a number in (0, 0.01], got 0.1: the probability that the epsilon guarantee "
     "fails for a row; keep it far below 1 / rows (default 1e-06)"),
    ({"mode": "gdp", "epsilon": True}, EXTRA_TREES,
     "privacy: epsilon must be a finite number > 0, got True: smaller epsilon = more noise and stronger "
     "privacy, larger = less noise (typical values 0.1 to 10)"),
    ({"mode": "secagg", "thresholds": "domain", "cells": 16}, PPD_ERT,
     "privacy: mode 'secagg' with thresholds 'domain' does not use field(s) ['cells']; valid: ['mode', "
     "'thresholds']"),
    ({"mode": "secagg", "cells": 10}, PPD_ERT,
     "privacy: PPD-ERT histogram cells must be one of [4, 8, 16, 32, 64], got 10"),
    ({"mode": "none", "key_bits": 2048}, FOREST,
     "privacy: mode 'none' does not use field(s) ['key_bits']; valid: ['mode']"),
    ({"mode": "ou", "key_bits": None}, FOREST,
     "privacy: key_bits must be one of (2048, 3072) for privacy 'ou' (Okamoto-Uchiyama modulus sizes), got "
     "None"),
    ({"mode": "gdp"}, FOREST, "algorithm 'forest' supports privacy ['none', 'paillier', 'ou'], got 'gdp'"),
    (3, FOREST, "privacy must be a mode name, a mapping with 'mode' or a PrivacySetting, got 3"),
    (GlobalDP(0.5), PPD_ERT, "algorithm 'ppd-ert' supports privacy ['secagg', 'secagg-dp'], got 'gdp'"),
])
def test_unknown_unused_and_bad_fields_are_refused_by_name(raw, algorithm, message) -> None:
    with pytest.raises(ParameterError) as caught:
        parse_privacy(raw, algorithm)
    assert str(caught.value) == message


def test_ldp_is_refused_for_a_regression_label() -> None:
    with pytest.raises(ParameterError, match="^privacy 'ldp' randomizes class labels and works for "
                                             "classification only; use 'gdp' \\(Gaussian noise\\) or 'none' "
                                             "for a regression label$"):
        parse_privacy("ldp", EXTRA_TREES, "regression")
    assert parse_privacy("gdp", EXTRA_TREES, "regression") == GlobalDP()


def test_an_estimators_own_arguments_are_fields_of_its_privacy_given_once() -> None:
    assert privacy_with("gdp", EXTRA_TREES, epsilon=0.5, ldp=None) == GlobalDP(0.5)
    assert privacy_with({"mode": "secagg"}, PPD_ERT, thresholds="domain") == SecureAggregation("domain")
    for raw, message in (
            ({"mode": "gdp", "epsilon": 0.5},
             "privacy: ['epsilon'] given both in privacy= and as an argument of its own; give each once"),
            (GlobalDP(0.5), "privacy: ['epsilon'] given beside a GlobalDP, which carries all its fields: set "
                            "them in the setting")):
        with pytest.raises(ParameterError) as caught:
            privacy_with(raw, EXTRA_TREES, epsilon=2.0)
        assert str(caught.value) == message


def _frames() -> list[pd.DataFrame]:
    rng = np.random.default_rng(0)
    return [pd.DataFrame({"a": rng.normal(size=60), "b": rng.normal(size=60),
                          "y": np.where(rng.random(60) < 0.5, "yes", "no")}) for _ in range(2)]


def test_the_estimators_take_a_mode_a_mapping_or_a_setting_and_run_what_they_are_given() -> None:
    from fedcore.horizontal import FederatedExtraTreesClassifier, PPDERTClassifier

    pooled = {"max_depth": 3, "allow_data_ranges": True}
    by_mapping = FederatedExtraTreesClassifier(2, **pooled, privacy={"mode": "ldp", "epsilon": 2.0}).fit(
        _frames(), "y")
    by_argument = FederatedExtraTreesClassifier(2, **pooled, privacy="ldp", epsilon=2.0).fit(_frames(), "y")
    by_setting = FederatedExtraTreesClassifier(2, **pooled, privacy=by_mapping.privacy_setting_).fit(
        _frames(), "y")
    for model in (by_mapping, by_argument, by_setting):
        assert model.privacy_setting_ == by_mapping.privacy_setting_
        for party in model.parties_:  # the mechanism each party randomizes its labels with
            assert party.label_ldp().epsilon()["permanent"] == 2.0
            assert party.label_ldp().mechanism == "krr"  # "auto" for 2 classes
        report = model.privacy_report_
        assert (report["mechanism"], report["epsilon"], report["epsilon_total"], report["delta"]) == \
            ("krr", 2.0, 2.0, 0.0)
        assert report["setting"] == {"mode": "ldp", "mechanism": "krr", "epsilon": 2.0, "estimator": "nnls"}
    assert by_mapping.model_.same_as(by_argument.model_) and by_mapping.model_.same_as(by_setting.model_)
    ppd = PPDERTClassifier(2, max_depth=3, allow_data_ranges=True,
                           privacy={"mode": "secagg", "thresholds": "domain"}).fit(_frames(), "y")
    assert ppd.privacy_setting_ == SecureAggregation("domain")
    assert ppd.privacy_report_["thresholds"].startswith("uniform in the declared domains")


@pytest.mark.parametrize(("make", "message"), [
    (lambda c: c(2, privacy="none", epsilon=0.5),
     "privacy: mode 'none' does not use field(s) ['epsilon']; valid: ['mode']"),
    (lambda c: c(2, privacy="gdp", ldp=LabelLDP()),
     "privacy: ldp= (the label mechanism) applies to mode 'ldp' only, not 'gdp'"),
    (lambda c: c(2, privacy="ldp", epsilon=2.0, ldp=LabelLDP(mechanism="krr", report_epsilon=4.0)),
     "privacy: epsilon given both as epsilon= and in ldp=; give it once"),
    (lambda c: c(2, privacy="ldp", ldp=LabelLDP(mechanism="krr", report_epsilon=4.0, n_hashes=2)),
     "privacy: mode 'ldp' with mechanism 'krr' and estimator 'nnls' does not use field(s) ['n_hashes']; "
     "valid: ['epsilon', 'estimator', 'mechanism', 'min_leaf_reports', 'mode']"),
])
def test_an_estimator_refuses_a_privacy_field_its_mode_does_not_use(make, message) -> None:
    from fedcore.horizontal import FederatedExtraTreesClassifier

    with pytest.raises(ParameterError) as caught:
        make(FederatedExtraTreesClassifier).fit(_frames(), "y")
    assert str(caught.value) == message


def test_gdp_carries_its_delta_on_the_wire_and_in_messages() -> None:
    setting = parse_privacy({"mode": "gdp", "epsilon": 2, "delta": 1e-7}, EXTRA_TREES)
    assert setting.to_dict() == {"mode": "gdp", "epsilon": 2.0, "delta": 1e-7, "plan": "auto",
                                 "split_levels": 0}
    hybrid = parse_privacy({"mode": "gdp", "epsilon": 2, "plan": "leaves", "split_levels": 2},
                           EXTRA_TREES)
    assert parse_privacy(hybrid.to_dict(), EXTRA_TREES) == hybrid == GlobalDP(2.0, plan="leaves",
                                                                              split_levels=2)
    assert parse_privacy(setting.to_dict(), EXTRA_TREES) == setting
    assert setting.describe() == "'gdp' (epsilon 2, delta 1e-07)"
    assert GlobalDP().to_dict() == {"mode": "gdp", "epsilon": 1.0, "delta": 1e-6, "plan": "auto",
                                    "split_levels": 0}
