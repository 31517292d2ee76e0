"""The `fedforest` command run in-process: JSON and table output, exit codes and one-line error messages."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes

from fedcore.cli import main
from fedcore.data.columns import DAYS
from tests.conftest import mixed_table, write_any_table

TOP_KEYS = {"setting", "algorithm", "task", "parties", "rows_train", "rows_test", "metrics", "reference",
            "single_party_identical", "timing", "communication"}


@pytest.fixture
def breast_cancer_csv(tmp_path: Path) -> Path:
    path = tmp_path / "breast_cancer.csv"
    load_breast_cancer(as_frame=True).frame.to_csv(path, index=False)
    return path


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _run_json(capsys, *argv: str) -> dict:
    code, out, err = _run(capsys, "simulate", *argv, "--json")
    assert code == 0, err
    return json.loads(out)  # stdout holds exactly one JSON object (progress goes to stderr)


def _readme_json_keys() -> set[str]:
    """The top-level keys the README says `simulate --json` prints (vertical)."""
    import re

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    listed = re.search(r"`--json` prints one object: `(.*?)`, where", readme, re.S).group(1)
    listed = re.sub(r"\{[^}]*\}", "", listed)  # nested keys
    return {key.strip() for key in listed.replace("\n", " ").split(",")}


def _error_line(capsys, *argv: str, code: int = 1) -> str:
    got, out, err = _run(capsys, *argv)
    assert got == code
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, f"expected one line, got {err!r}"
    return err.rstrip("\n")


def test_simulate_json_on_breast_cancer(capsys, breast_cancer_csv: Path) -> None:
    result = _run_json(capsys, "--data", breast_cancer_csv, "--label", "target", "--parties", 3,
                       "--trees", 20)
    assert TOP_KEYS <= set(result)
    assert (result["setting"], result["algorithm"], result["task"], result["parties"]) == (
        "vertical", "forest", "classification", 3)
    assert result["rows_train"] + result["rows_test"] == 569 and result["rows_test"] == 114
    assert set(result["metrics"]) == {"accuracy", "f1_macro", "balanced_accuracy", "base_rate", "roc_auc",
                                      "average_precision", "log_loss"}
    assert result["metrics"]["accuracy"] > 0.85 and result["metrics"]["f1_macro"] > 0.85
    assert result["metrics"]["roc_auc"] > 0.9 and result["metrics"]["log_loss"] < 0.5
    assert result["metrics"]["base_rate"] == 72 / 114  # stratified split: 357 of 569 rows are benign
    reference = result["reference"]
    assert set(reference["metrics"]) == set(result["single_party"]["metrics"]) == set(result["metrics"])
    assert set(reference) == {"name", "metrics", "train_s", "predict_s"}
    assert reference["name"] == "sklearn.RandomForestClassifier"
    assert reference["metrics"]["accuracy"] > 0.85
    assert result["single_party_identical"] is True
    assert set(result) == _readme_json_keys()  # the README documents exactly what --json prints
    assert set(result["single_party"]) == {"metrics", "train_s", "predict_s", "rounds", "bytes"}
    assert set(result["timing"]) == {"train_s", "predict_s"}
    assert all(isinstance(v, float) and v > 0 for v in result["timing"].values())
    assert set(result["communication"]) == {"rounds", "bytes"}
    assert isinstance(result["communication"]["rounds"], int) and result["communication"]["rounds"] > 0
    assert isinstance(result["communication"]["bytes"], int) and result["communication"]["bytes"] > 0


def test_simulate_json_on_mixed_parquet_with_id(capsys, tmp_path: Path) -> None:
    table = mixed_table(n_rows=400, seed=5)
    table.insert(0, "row_id", np.arange(len(table)))
    path = tmp_path / "mixed.parquet"
    table.to_parquet(path)
    result = _run_json(capsys, "--data", path, "--label", "target", "--id", "row_id", "--parties", 2,
                       "--trees", 10, "--max-depth", 6, "--seed", 3)
    assert result["task"] == "classification"
    assert result["single_party_identical"] is True
    assert result["metrics"]["accuracy"] > 0.5
    assert result["rows_test"] == 80


def test_simulate_json_regression_on_diabetes(capsys, tmp_path: Path) -> None:
    path = tmp_path / "diabetes.csv"
    load_diabetes(as_frame=True).frame.to_csv(path, index=False)
    result = _run_json(capsys, "--data", path, "--label", "target", "--parties", 2, "--trees", 15)
    assert result["task"] == "regression"
    assert set(result["metrics"]) == {"rmse", "r2", "mae"}
    assert set(result["reference"]["metrics"]) == {"rmse", "r2", "mae"}
    assert 0 < result["metrics"]["mae"] <= result["metrics"]["rmse"]
    assert result["reference"]["name"] == "sklearn.RandomForestRegressor"
    assert result["metrics"]["r2"] > 0.2 and 0 < result["metrics"]["rmse"] < 80
    assert result["single_party_identical"] is True


@pytest.mark.parametrize(("algorithm", "privacy", "exact"), [
    ("extra-trees", "none", True), ("extra-trees", "ldp", None), ("extra-trees", "gdp", None),
    ("ppd-ert", "secagg", True),
])
def test_simulate_json_horizontal(capsys, breast_cancer_csv: Path, algorithm: str, privacy: str,
                                  exact) -> None:
    budget = ("--epsilon", 8, "--max-depth", 4) if privacy == "gdp" else ()  # the whole model's budget
    result = _run_json(capsys, "--data", breast_cancer_csv, "--label", "target", "--setting", "horizontal",
                       "--algorithm", algorithm, "--privacy", privacy, "--parties", 3, "--trees", 10,
                       "--partition", "dirichlet", "--alpha", 1.0, *budget)
    assert TOP_KEYS | {"privacy", "partition", "local_only", "privacy_report"} <= set(result)
    assert (result["setting"], result["algorithm"], result["privacy"], result["parties"]) == (
        "horizontal", algorithm, privacy, 3)
    assert result["reference"]["name"] == "sklearn.ExtraTreesClassifier"
    assert result["single_party_identical"] is exact
    assert result["partition"]["kind"] == "dirichlet"
    assert sum(result["partition"]["rows"]) == result["rows_train"]
    assert len(result["local_only"]["per_party"]) == 3 and 0 < result["local_only"]["mean"]["accuracy"] <= 1
    assert result["metrics"]["accuracy"] > 0.85
    assert set(result["metrics"]) == set(result["local_only"]["mean"]) >= {"roc_auc", "average_precision",
                                                                           "log_loss", "balanced_accuracy",
                                                                           "base_rate"}
    assert result["privacy_report"]["mode"] == privacy
    # thresholds from declared domains (PPD-ERT, FET's DP modes): the simulator reads them off the rows
    assert ("feature_ranges" in result) is (privacy != "none")
    if algorithm == "extra-trees":  # no party's extremes cross in a DP mode
        assert (result["privacy_report"]["min_max"] is None) is (privacy != "none")
    if privacy == "gdp":  # what the accountant says the busiest row of each party spent, within the budget
        report = result["privacy_report"]
        assert 0 < report["epsilon_total"] <= 8 and report["delta"] == 1e-6
        assert report["epsilon_total"] == max(p["epsilon_total"] for p in report["parties"].values())


def test_simulate_gdp_with_only_a_budget_runs_the_default_leaf_plan(capsys, breast_cancer_csv: Path) -> None:
    """--privacy gdp --epsilon 2 without --max-depth: plan auto releases leaves, within the budget."""
    result = _run_json(capsys, "--data", breast_cancer_csv, "--label", "target", "--setting", "horizontal",
                       "--algorithm", "extra-trees", "--privacy", "gdp", "--epsilon", 2, "--parties", 3)
    report = result["privacy_report"]
    assert 1.99 < report["epsilon_total"] <= 2 and report["delta"] == 1e-6
    plan = report["plan"]
    assert (plan["plan"], plan["split_levels"], plan["n_estimators"]) == ("leaves", 0, 100)
    assert plan["max_depth"] == math.ceil(math.log2(plan["noisy_rows"]))  # 455 training rows: depth 9
    for spent in report["parties"].values():  # a row: 100 leaf releases, the marginals and the count
        assert spent["releases_per_row"] == spent["planned_releases_per_row"] == 100 + 12 + 1
    assert result["metrics"]["accuracy"] > 0.85


def test_simulate_json_vertical_paillier_is_exactly_the_plain_single_party_run(
        capsys, breast_cancer_csv: Path) -> None:
    result = _run_json(capsys, "--data", breast_cancer_csv, "--label", "target", "--privacy", "paillier",
                       "--trees", 3, "--max-depth", 3)
    assert (result["setting"], result["algorithm"], result["privacy"]) == ("vertical", "forest", "paillier")
    assert result["single_party_identical"] is True  # encrypted labels, 2 parties == plain, 1 party
    assert result["metrics"]["accuracy"] > 0.85


def test_simulate_horizontal_regression_with_ldp_is_refused(capsys, tmp_path: Path) -> None:
    path = tmp_path / "diabetes.csv"
    load_diabetes(as_frame=True).frame.to_csv(path, index=False)
    line = _error_line(capsys, "simulate", "--data", path, "--label", "target", "--setting", "horizontal",
                       "--privacy", "ldp", code=1)
    assert line == ("fedforest: error: privacy 'ldp' (randomized labels) is for classification only; use "
                    "--algorithm extra-trees with privacy none or gdp for a regression label")


def test_simulate_table_output(capsys, breast_cancer_csv: Path) -> None:
    code, out, err = _run(capsys, "simulate", "--data", breast_cancer_csv, "--label", "target",
                          "--trees", 5, "--max-depth", 4, "--max-features", "log2")
    assert code == 0
    for text in ("federated (M=2)", "reference", "single-party (M=1)", "accuracy", "f1_macro", "train s",
                 "predict s", "rounds", "MB", "single-party identical (same trees, same predictions): yes"):
        assert text in out
    assert "trees 5/5" in err  # the progress bar goes to stderr


def test_version(capsys) -> None:
    code, out, _ = _run(capsys, "--version")
    assert code == 0
    assert out.startswith("fedforest ")


def test_simulate_json_vertical_boosting(capsys, breast_cancer_csv: Path) -> None:
    """Boosting against HistGradientBoosting (same rounds, depth, learning rate, L2), and its M = 1 run."""
    result = _run_json(capsys, "--data", breast_cancer_csv, "--label", "target", "--parties", 3,
                       "--algorithm", "boosting", "--trees", 10, "--max-depth", 3)
    assert (result["algorithm"], result["privacy"], result["task"]) == ("boosting", "none", "classification")
    assert result["reference"]["name"] == "sklearn.HistGradientBoostingClassifier"
    assert result["single_party_identical"] is True
    assert result["metrics"]["accuracy"] > 0.9
    assert result["metrics"]["accuracy"] > result["reference"]["metrics"]["accuracy"] - 0.05


def test_simulate_json_horizontal_boosting(capsys, breast_cancer_csv: Path) -> None:
    """Horizontal boosting under secure aggregation: its M = 1 run identical, HistGradientBoosting beside."""
    result = _run_json(capsys, "--data", breast_cancer_csv, "--label", "target", "--setting", "horizontal",
                       "--parties", 3, "--algorithm", "boosting", "--trees", 10, "--max-depth", 3)
    assert (result["algorithm"], result["privacy"]) == ("boosting", "secagg")
    assert result["reference"]["name"] == "sklearn.HistGradientBoostingClassifier"
    assert result["single_party_identical"] is True
    assert result["privacy_report"]["label_statistics"].startswith("only the sum over all parties")
    assert result["metrics"]["accuracy"] > result["reference"]["metrics"]["accuracy"] - 0.05
    plain = _run_json(capsys, "--data", breast_cancer_csv, "--label", "target", "--setting", "horizontal",
                      "--parties", 3, "--algorithm", "boosting", "--privacy", "none", "--trees", 10,
                      "--max-depth", 3)
    assert (plain["privacy"], plain["privacy_report"]["mode"]) == ("none", "none")
    assert plain["privacy_report"]["label_statistics"].startswith("plain per-party histograms")
    assert plain["metrics"] == result["metrics"]  # the masks change what the master reads, not the model


@pytest.mark.slow  # an Okamoto-Uchiyama-3072 key and its encryptions (simulate takes the default size)
def test_simulate_json_vertical_boosting_with_encrypted_gradients(capsys, breast_cancer_csv: Path) -> None:
    """SecureBoost (Okamoto-Uchiyama): the same model as the single-party run, byte for byte."""
    result = _run_json(capsys, "--data", breast_cancer_csv, "--label", "target", "--parties", 2,
                       "--algorithm", "boosting", "--privacy", "ou", "--trees", 2,
                       "--max-depth", 2)
    assert (result["algorithm"], result["privacy"]) == ("boosting", "ou")
    assert result["single_party_identical"] is True
    assert result["metrics"]["accuracy"] > 0.85


@pytest.mark.parametrize(("options", "message"), [
    (("--setting", "diagonal"), "unknown setting 'diagonal': choose one of ['vertical', 'horizontal']"),
    (("--algorithm", "gbdt"), "unknown algorithm 'gbdt': the vertical setting offers 'forest' "
                              "(Federated Forest), 'boosting' (Federated gradient boosting)"),
    (("--algorithm", "boosting", "--privacy", "ldp"),
     "algorithm 'boosting' supports privacy 'none', 'paillier', 'ou', got 'ldp'"),
    (("--algorithm", "boosting", "--max-features", "0.5"),
     "--max-features applies to --algorithm forest only: boosting takes every feature in every tree"),
    (("--setting", "horizontal", "--algorithm", "forest"),
     "unknown algorithm 'forest': the horizontal setting offers 'extra-trees' (Federated Extra-Trees), "
     "'ppd-ert' (PPD-ERT), 'boosting' (Federated gradient boosting)"),
    (("--setting", "horizontal", "--algorithm", "boosting", "--privacy", "ldp"),
     "algorithm 'boosting' supports privacy 'secagg', 'none', got 'ldp'"),
    (("--setting", "horizontal", "--algorithm", "boosting", "--max-features", "0.5"),
     "--max-features applies to the forests only: boosting takes every feature in every tree"),
    (("--setting", "horizontal", "--privacy", "secagg"),
     "algorithm 'extra-trees' supports privacy 'none', 'ldp', 'gdp', got 'secagg'"),
    (("--setting", "horizontal", "--algorithm", "ppd-ert", "--privacy", "ldp"),
     "algorithm 'ppd-ert' supports privacy 'secagg', 'secagg-dp', got 'ldp'"),
    (("--privacy", "ldp"), "algorithm 'forest' supports privacy 'none', 'paillier', 'ou', got 'ldp'"),
    (("--setting", "horizontal", "--thresholds", "domain"),
     "--thresholds applies to --algorithm ppd-ert only, not 'extra-trees'"),
    (("--setting", "horizontal", "--epsilon", "0.5"),
     "--epsilon applies to privacy 'ldp' and 'gdp' only, not 'none'"),
    (("--epsilon", "0.5"), "--epsilon applies to --algorithm extra-trees only, not 'forest'"),
    (("--setting", "horizontal", "--algorithm", "ppd-ert", "--privacy", "secagg-dp"),
     "--privacy secagg-dp needs --max-depth: the model's budget is spread over trees x levels"),
    (("--setting", "horizontal", "--delta", "1e-6"), "--delta applies to privacy 'gdp' only, not 'none'"),
    (("--setting", "horizontal", "--privacy", "gdp", "--max-depth", "3", "--delta", "0.5"),
     "privacy: delta must be a number in (0, 0.01], got 0.5: the probability that the epsilon guarantee "
     "fails for a row; keep it far below 1 / rows (default 1e-06)"),
    (("--setting", "horizontal", "--privacy", "gdp", "--epsilon", "0", "--max-depth", "3"),
     "privacy: epsilon must be a finite number > 0, got 0.0: smaller epsilon = more noise and stronger "
     "privacy, larger = less noise (typical values 0.1 to 10)"),
])
def test_unknown_setting_algorithm_or_privacy_is_bad_input(capsys, breast_cancer_csv: Path, options: tuple,
                                                            message: str) -> None:
    line = _error_line(capsys, "simulate", "--data", breast_cancer_csv, "--label", "target", *options)
    assert line == f"fedforest: error: {message}"


def test_simulate_ldp_trains_at_the_epsilon_given(capsys, breast_cancer_csv: Path) -> None:
    """`--privacy ldp --epsilon 3` randomizes each row's label once at epsilon 3: the model's total.

    The mechanism is "auto" resolved for the 2 classes (k-RR), and the report names it.
    """
    result = _run_json(capsys, "--data", breast_cancer_csv, "--label", "target", "--setting", "horizontal",
                       "--privacy", "ldp", "--epsilon", "3", "--trees", "3", "--max-depth", "4")
    report = result["privacy_report"]
    assert (report["mechanism"], report["epsilon"], report["epsilon_total"], report["delta"]) == \
        ("krr", 3.0, 3.0, 0.0)
    assert report["setting"] == {"mode": "ldp", "mechanism": "krr", "epsilon": 3.0, "estimator": "nnls"}


@pytest.mark.parametrize("thresholds", ["histogram", "domain"])
def test_simulate_ppd_ert_with_either_threshold_mode(capsys, breast_cancer_csv: Path,
                                                     thresholds: str) -> None:
    result = _run_json(capsys, "--data", breast_cancer_csv, "--label", "target", "--setting", "horizontal",
                       "--algorithm", "ppd-ert", "--thresholds", thresholds, "--trees", "5")
    assert result["single_party_identical"] is True
    said = result["privacy_report"]["thresholds"]
    expected = "within the populated cells" if thresholds == "histogram" else "uniform in the declared"
    assert said.startswith(expected)
    code, out, _ = _run(capsys, "simulate", "--data", breast_cancer_csv, "--label", "target", "--setting",
                        "horizontal", "--algorithm", "ppd-ert", "--thresholds", thresholds, "--trees", "3")
    assert code == 0 and f"privacy: thresholds: {said}" in out


def test_simulate_gdp_prints_what_the_accountant_says_was_spent(capsys, breast_cancer_csv: Path) -> None:
    options = ("--data", breast_cancer_csv, "--label", "target", "--setting", "horizontal", "--privacy",
               "gdp", "--trees", "3", "--max-depth", "3", "--epsilon", "2", "--delta", "1e-7")
    report = _run_json(capsys, *options)["privacy_report"]
    assert report["setting"] == {"mode": "gdp", "epsilon": 2.0, "delta": 1e-7, "plan": "auto",
                                 "split_levels": 0}
    assert 0 < report["epsilon_total"] <= 2.0 and report["delta"] == 1e-7
    code, out, _ = _run(capsys, "simulate", *options)
    assert code == 0 and (f"privacy: global DP, epsilon {report['epsilon_total']:.4g} (delta 1e-07) spent by "
                          "the busiest row of the most charged party, of the model's budget 2") in out


# -- one convention: a usage error is bad input too (one line, exit 1, no usage block) ----------------------

@pytest.mark.parametrize(("argv", "message"), [
    (("simulate", "--label", "y"),
     "the following arguments are required: --data (see 'fedforest simulate --help')"),
    (("simulate", "--data", "t.csv", "--label", "y", "--trees", "1.5"),
     "argument --trees: invalid int value: '1.5' (see 'fedforest simulate --help')"),
    (("simulate", "--data", "t.csv", "--label", "y", "--max-features", "banana"),
     "argument --max-features: expected sqrt, log2, none, default, a count >= 1 or a fraction in (0, 1], got "
     "'banana' (see 'fedforest simulate --help')"),
    (("simulate", "--data", "t.csv", "--label", "y", "--max-features", "1.5"),
     "argument --max-features: max_features as a fraction must be in (0, 1], got 1.5 "
     "(see 'fedforest simulate --help')"),
    (("simulate", "--data", "t.csv", "--label", "y", "--task", "ranking"),
     "argument --task: invalid choice: 'ranking' (choose from 'auto', 'classification', 'regression') "
     "(see 'fedforest simulate --help')"),
    (("simulate", "--data", "t.csv", "--label", "y", "--seed", "4294967296"),
     "argument --seed: the seed must be between 0 and 4294967295 (the train/test split and scikit-learn's "
     "reference forests take 32-bit seeds), got 4294967296 (see 'fedforest simulate --help')"),
    (("simulate", "--data", "t.csv", "--label", "y", "--colour", "red"),
     "unrecognized arguments: --colour red (see 'fedforest --help')"),
    ((), "the following arguments are required: COMMAND (see 'fedforest --help')"),
    (("certs",), "the following arguments are required: ACTION (see 'fedforest certs --help')"),
    (("certs", "issue", "bank", "--role", "admin"),
     "argument --role: invalid choice: 'admin' (choose from 'master', 'institution') "
     "(see 'fedforest certs issue --help')"),
])
def test_usage_errors_are_one_line_and_exit_1(capsys, argv: tuple, message: str) -> None:
    line = _error_line(capsys, *argv)
    assert line == f"fedforest: error: {message}"


def test_pipeline_commands_follow_the_same_convention(capsys) -> None:
    code = main(["retrain"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err == ("fedforest: error: the following arguments are required: --config (see 'fedforest retrain "
                   "--help')\n")
    assert main(["predict", "--config", "f.yaml", "--agents", "cloud"]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["predict", "--config", "f.yaml", "--until", "2026-11-27T06:00:00"]) == 1
    assert capsys.readouterr().err == (
        "fedforest: error: argument --until: '2026-11-27T06:00:00' is not a time with a time zone, like "
        "2026-11-27T06:00:00Z (see 'fedforest predict --help')\n")


@pytest.mark.parametrize("argv", [("--help",), ("simulate", "--help"), ("certs", "issue", "--help")])
def test_help_still_prints_help_and_exits_0(capsys, argv: tuple) -> None:
    code, out, err = _run(capsys, *argv)
    assert code == 0 and err == ""
    assert out.startswith("usage: fedforest")


# -- bad input: exit code 1 and one line naming the offending thing --------------------------------------

def _small_table(tmp_path: Path, name: str = "small.csv", **columns) -> Path:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": rng.normal(size=40), "b": rng.normal(size=40), **columns})
    path = tmp_path / name
    frame.to_csv(path, index=False)
    return path


def test_missing_file(capsys, tmp_path: Path) -> None:
    path = tmp_path / "absent.csv"
    line = _error_line(capsys, "simulate", "--data", path, "--label", "y")
    assert line == f"fedforest: error: cannot read {str(path)!r}: no such file"


def test_corrupt_file(capsys, tmp_path: Path) -> None:
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"this is not parquet")
    line = _error_line(capsys, "simulate", "--data", path, "--label", "y")
    assert line.startswith(f"fedforest: error: cannot read {str(path)!r}: ")


def test_unsupported_suffix(capsys, tmp_path: Path) -> None:
    path = tmp_path / "table.xlsx"
    path.write_bytes(b"")
    line = _error_line(capsys, "simulate", "--data", path, "--label", "y")
    assert line == (f"fedforest: error: cannot read {str(path)!r}: expected a .parquet or .csv file, "
                    "found suffix '.xlsx'")


def test_label_not_in_file(capsys, tmp_path: Path) -> None:
    path = _small_table(tmp_path, y=np.arange(40) % 2)
    line = _error_line(capsys, "simulate", "--data", path, "--label", "outcome")
    assert line == "fedforest: error: label column 'outcome' not in the table; its columns are 'a', 'b', 'y'"


def test_id_not_in_file(capsys, tmp_path: Path) -> None:
    path = _small_table(tmp_path, y=np.arange(40) % 2)
    line = _error_line(capsys, "simulate", "--data", path, "--label", "y", "--id", "customer")
    assert line == "fedforest: error: id column 'customer' not in the table; its columns are 'a', 'b', 'y'"


def test_label_with_one_class(capsys, tmp_path: Path) -> None:
    path = _small_table(tmp_path, y=np.ones(40, dtype=int))
    line = _error_line(capsys, "simulate", "--data", path, "--label", "y")
    assert line == "fedforest: error: label 'y' has a single class 1; classification needs at least two"


def test_label_with_missing_values(capsys, tmp_path: Path) -> None:
    y = (np.arange(40) % 2).astype(float)
    y[[3, 17, 30]] = np.nan
    path = _small_table(tmp_path, y=y)
    line = _error_line(capsys, "simulate", "--data", path, "--label", "y")
    assert line == "fedforest: error: label 'y' has 3 missing values; drop or fill those rows"


def test_text_label_with_regression_task(capsys, tmp_path: Path) -> None:
    path = _small_table(tmp_path, y=np.where(np.arange(40) % 2 == 0, "low", "high"))
    dtype = pd.read_csv(path)["y"].dtype
    line = _error_line(capsys, "simulate", "--data", path, "--label", "y", "--task", "regression")
    assert line == f"fedforest: error: regression label 'y' must be numeric, found dtype {dtype}"


def test_too_many_parties(capsys, tmp_path: Path) -> None:
    path = _small_table(tmp_path, y=np.arange(40) % 2)
    line = _error_line(capsys, "simulate", "--data", path, "--label", "y", "--parties", 3)
    assert line == "fedforest: error: cannot split 2 feature columns into 3 parties"


def test_bad_parameter(capsys, tmp_path: Path) -> None:
    path = _small_table(tmp_path, y=np.arange(40) % 2)
    line = _error_line(capsys, "simulate", "--data", path, "--label", "y", "--trees", 0)
    assert line == "fedforest: error: n_estimators must be an integer >= 1, got 0"


# -- any table: strings, booleans and missing values, ISO dates and datetimes, an id column --------------

DATE_SOURCES = {"csv": ["ISO date strings", "ISO datetime strings"],
                "parquet": ["datetime values", "datetime values in Europe/Paris"]}


@pytest.fixture
def any_tables(tmp_path: Path) -> dict[str, Path]:
    csv, parquet = write_any_table(tmp_path)
    return {"csv": csv, "parquet": parquet}


def _any_table_options(label: str, *options) -> list:
    """Train on `label`, leave the other label out (--drop) and the customer id too (--id-column)."""
    other = "amount" if label == "y" else "y"
    return ["--label", label, "--drop", other, "--id-column", "customer_id", "--trees", 3, "--max-depth",
            4, *options]


@pytest.mark.parametrize(("setting", "algorithm", "privacy", "label", "file"), [
    ("vertical", "forest", "none", "y", "csv"),
    ("vertical", "forest", "none", "amount", "parquet"),
    ("horizontal", "extra-trees", "none", "y", "parquet"),
    ("horizontal", "extra-trees", "none", "amount", "csv"),
    ("horizontal", "extra-trees", "gdp", "y", "csv"),
    ("horizontal", "extra-trees", "gdp", "amount", "parquet"),
    ("horizontal", "extra-trees", "ldp", "y", "parquet"),
    ("horizontal", "ppd-ert", "secagg", "y", "csv"),
])
def test_simulate_any_table(capsys, any_tables: dict, setting: str, algorithm: str, privacy: str, label: str,
                            file: str) -> None:
    result = _run_json(capsys, "--data", any_tables[file], *_any_table_options(label), "--setting", setting,
                       "--algorithm", algorithm, "--privacy", privacy)
    assert (result["setting"], result["algorithm"], result["privacy"]) == (setting, algorithm, privacy)
    assert result["task"] == ("classification" if label == "y" else "regression")
    columns = result["columns"]
    assert (columns["id"], columns["dropped"]) == ("customer_id", ["amount" if label == "y" else "y"])
    assert columns["dates"] == [{"column": name, "from": source, "to": DAYS}
                                for name, source in zip(("signup", "last_seen"), DATE_SOURCES[file],
                                                        strict=True)]
    if setting == "horizontal":
        # booleans with missing values: categories
        assert columns["categories"] == {"plan": 3, "newsletter": 2}
    assert result["single_party_identical"] is (True if privacy in ("none", "secagg") else None)
    assert set(result["reference"]["metrics"]) == set(result["metrics"])  # scikit-learn ran on the same table


@pytest.mark.parametrize("setting", ["vertical", "horizontal"])
def test_simulate_any_table_output_names_the_conversions(capsys, any_tables: dict, setting: str) -> None:
    code, out, err = _run(capsys, "simulate", "--data", any_tables["csv"], *_any_table_options("y"),
                          "--setting", setting)
    assert code == 0, err
    lines = out.splitlines()
    assert "not features: id column 'customer_id'; dropped 'amount'" in lines
    assert (f"dates converted to {DAYS}: 'signup' (ISO date strings), 'last_seen' (ISO "
            "datetime strings)") in lines
    categories = ("category lists from the pooled table (a data contract declares them in production): "
                  "'plan' (3), 'newsletter' (2)")
    assert (categories in lines) is (setting == "horizontal")


@pytest.mark.parametrize("setting", ["vertical", "horizontal"])
def test_a_string_column_too_wide_for_categories_is_refused(capsys, tmp_path: Path, setting: str) -> None:
    csv, _ = write_any_table(tmp_path, n_rows=300)  # 300 distinct customer ids, and no --id-column
    line = _error_line(capsys, "simulate", "--data", csv, "--label", "y", "--setting", setting)
    assert line == ("fedforest: error: column 'customer_id' holds 300 distinct strings that are not ISO "
                    "dates: too many for a categorical feature (at most 255); if it identifies rows pass it "
                    "as the id column (--id-column customer_id), else leave it out (--drop customer_id)")


def test_an_impossible_iso_date_is_refused(capsys, tmp_path: Path) -> None:
    path = _small_table(tmp_path, when=["2021-02-28"] * 39 + ["2021-02-30"], y=np.arange(40) % 2)
    line = _error_line(capsys, "simulate", "--data", path, "--label", "y", "--setting", "horizontal")
    assert line == ("fedforest: error: column 'when' holds ISO dates, but 1 values are not valid dates "
                    "('2021-02-30'); correct or blank them")


@pytest.mark.parametrize(("drop", "message"), [
    ("y", "the label column 'y' cannot be dropped"),
    ("c", "dropped column 'c' not in the table; its columns are 'a', 'b', 'y'"),
])
def test_bad_drop(capsys, tmp_path: Path, drop: str, message: str) -> None:
    path = _small_table(tmp_path, y=np.arange(40) % 2)
    line = _error_line(capsys, "simulate", "--data", path, "--label", "y", "--drop", drop)
    assert line == f"fedforest: error: {message}"


# -- one registration mechanism: the `fedforest.commands` entry points; fedcore never imports Prefect -----

def test_every_command_is_registered_through_the_entry_point_group() -> None:
    from importlib.metadata import entry_points

    from fedcore.cli import COMMANDS_GROUP, build_parser

    listed = {entry.name for entry in entry_points(group=COMMANDS_GROUP)}
    assert {"simulate", "agent", "certs", "contract", "models", "sample-table", "demo", "retrain",
            "predict"} <= listed
    commands = next(a for a in build_parser()._actions if a.dest == "command")
    assert list(commands.choices) == sorted(listed)


def test_missing_entry_points_are_one_line(capsys, monkeypatch) -> None:
    from fedcore import cli

    monkeypatch.setattr(cli, "entry_points", lambda group: [])
    line = _error_line(capsys, "simulate", "--help")
    assert line.startswith("fedforest: error: no commands are registered (the 'fedforest.commands' entry "
                           "points")


def test_help_and_simulate_import_neither_prefect_nor_another_settings_engine(tmp_path: Path) -> None:
    """One fresh process (a second costs seconds of imports and kernel loading, issue #34).

    `--help` and a horizontal simulate import no vertical engine module (their modules and numba kernels
    cost first-use seconds a horizontal run never needs); neither they nor a vertical simulate after them
    import Prefect.
    """
    import subprocess
    import sys

    path = _small_table(tmp_path, y=np.arange(40) % 2)
    vertical = ("'fedcore.vertical.party', 'fedcore.vertical.estimators', 'fedcore.simulation.vertical', "
                "'fedcore.trees.splitting'")
    script = ("import sys; from fedcore.cli import main; "
              f"codes = [main(['--help']), main(['simulate', '--data', {str(path)!r}, '--label', 'y', "
              "'--setting', 'horizontal', '--parties', '2', '--trees', '1', '--json'])]; "
              f"print(codes, sorted(m for m in sys.modules if m.startswith(({vertical}))), file=sys.stderr); "
              f"codes.append(main(['simulate', '--data', {str(path)!r}, '--label', 'y', '--trees', '1', "
              "'--json'])); "
              "print(codes, sorted(m for m in sys.modules if m.split('.')[0] == 'prefect'), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    printed = [line for line in done.stderr.splitlines() if line.startswith("[")]  # not the progress lines
    assert printed[-2:] == ["[0, 0] []", "[0, 0, 0] []"]
