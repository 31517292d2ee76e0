"""`simulate_vertical` and its helpers, and the engine's named errors for malformed vertical parties."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_breast_cancer

from fedcore.data.io import read_table
from fedcore.data.labels import infer_task
from fedcore.data.split import split_horizontal, split_vertical
from fedcore.errors import (
    ColumnNotFoundError,
    DataReadError,
    DuplicateColumnError,
    InputError,
    LabelError,
    LabelHolderError,
    ParameterError,
    PartyShapeError,
)
from fedcore.simulation import (
    build_estimator,
    one_hot,
    pooled_categories,
    prepare_input,
    prepare_table,
    simulate_vertical,
    split_train_test,
)
from fedcore.vertical.estimators import FederatedForestClassifier
from fedcore.vertical.validation import check_label
from tests.conftest import mixed_table, write_any_table


def test_simulate_vertical_on_breast_cancer() -> None:
    table = load_breast_cancer(as_frame=True).frame
    result = simulate_vertical(table, "target", parties=3, trees=10, seed=1)
    assert result["task"] == "classification" and result["parties"] == 3
    assert result["single_party_identical"] is True
    assert result["metrics"]["accuracy"] > 0.85
    assert result["reference"]["metrics"]["accuracy"] > 0.85
    assert result["communication"]["rounds"] > 0 and result["communication"]["bytes"] > 0
    assert result["single_party"]["rounds"] == result["communication"]["rounds"]


def test_simulate_vertical_regression_on_mixed_table() -> None:
    table = mixed_table(n_rows=400, seed=2, task="regression")
    result = simulate_vertical(table, "target", parties=2, trees=8, max_depth=6)
    assert result["task"] == "regression"
    assert result["single_party_identical"] is True
    assert result["metrics"]["r2"] > 0.3 and result["reference"]["metrics"]["r2"] > 0.3


def test_simulate_vertical_drops_the_id_column() -> None:
    table = mixed_table(n_rows=120, seed=6)[["num0", "num1", "cat_str", "target"]]
    table.insert(0, "customer", np.arange(len(table)))
    result = simulate_vertical(table, "target", id_column="customer", parties=3, trees=3, max_depth=3)
    assert result["parties"] == 3  # 3 feature columns: one each, so "customer" was not dealt out
    with pytest.raises(ParameterError, match="^cannot split 3 feature columns into 4 parties$"):
        simulate_vertical(table, "target", id_column="customer", parties=4, trees=3)


def test_simulate_vertical_refuses_an_unknown_task() -> None:
    with pytest.raises(ParameterError,
                       match=r"task must be one of \['auto', 'classification', 'regression'\]"):
        simulate_vertical(mixed_table(n_rows=50), "target", task="ranking")


@pytest.mark.parametrize(("values", "task"), [
    (pd.Series([0, 1, 2, 1] * 5), "classification"),
    (pd.Series([0.0, 1.0, np.nan, 1.0] * 5), "classification"),
    (pd.Series(["a", "b"] * 10), "classification"),
    (pd.Series([True, False] * 10), "classification"),
    (pd.Series(np.arange(21)), "regression"),
    (pd.Series(np.arange(20)), "classification"),
    (pd.Series([0.5, 1.0, 2.0] * 5), "regression"),
])
def test_infer_task(values: pd.Series, task: str) -> None:
    assert infer_task(values) == task


def test_check_label_names_the_problem() -> None:
    with pytest.raises(LabelError, match=r"^label 'y' has 1 missing values; drop or fill those rows$"):
        check_label(pd.Series([1.0, np.nan, 2.0], name="y"), "regression")
    with pytest.raises(LabelError,
                       match=r"^label 'y' has a single class 'yes'; classification needs at least two$"):
        check_label(pd.Series(["yes"] * 4, name="y"), "classification")
    with pytest.raises(LabelError, match=r"^regression label 'y' must be numeric, found dtype bool$"):
        check_label(pd.Series([True, False], name="y"), "regression")


def test_prepare_table_checks_columns_and_rows() -> None:
    table = pd.DataFrame({"x": [1.0, 2.0], "y": [0, 1], "id": [7, 8]})
    assert list(prepare_table(table, "y", "id").columns) == ["x", "y"]
    with pytest.raises(ColumnNotFoundError,
                       match=r"^label column 'z' not in the table; its columns are 'x', 'y', 'id'$"):
        prepare_table(table, "z")
    with pytest.raises(InputError, match="^the id column and the label are the same column 'y'$"):
        prepare_table(table, "y", "y")
    with pytest.raises(InputError, match="^the table has no rows$"):
        prepare_table(table.iloc[:0], "y")
    with pytest.raises(InputError, match="^the table holds no feature column besides the label 'y'$"):
        prepare_table(table[["y", "id"]], "y", "id")
    wide = pd.DataFrame({f"c{i}": [0] for i in range(12)})
    with pytest.raises(ColumnNotFoundError, match=r"'c9', \.\.\. \(12 columns\)$"):
        prepare_table(wide, "y")


def test_prepare_table_drops_the_columns_asked() -> None:
    table = pd.DataFrame({"x": [1.0, 2.0], "note": ["a", "b"], "z": [3, 4], "y": [0, 1], "id": [7, 8]})
    assert list(prepare_table(table, "y", "id", drop=["note", "z"]).columns) == ["x", "y"]
    with pytest.raises(InputError, match="^the label column 'y' cannot be dropped$"):
        prepare_table(table, "y", drop=["y"])
    with pytest.raises(ColumnNotFoundError, match=r"^dropped column 'w' not in the table; its columns are "):
        prepare_table(table, "y", drop=["w"])
    with pytest.raises(InputError, match="^the table holds no feature column besides the label 'y'$"):
        prepare_table(table, "y", "id", drop=["x", "note", "z"])


def _fitted_outputs(table: pd.DataFrame, setting: str) -> np.ndarray:
    """Class probabilities of a small forest of `setting` trained and evaluated on `table`."""
    features = table.drop(columns=["y"])
    if setting == "vertical":
        parties = split_vertical(table, 2, label="y", seed=0)
        model = FederatedForestClassifier(n_estimators=3, max_depth=4, random_state=0).fit(parties, label="y")
        return model.predict_proba([features[[c for c in p.columns if c != "y"]] for p in parties])
    model = build_estimator("extra-trees", "none", "classification", {"n_estimators": 3, "max_depth": 4},
                            categories=pooled_categories(table, "y"))
    return model.fit(split_horizontal(table, 2, seed=0), label="y").predict_proba(features)


@pytest.mark.parametrize("setting", ["vertical", "horizontal"])
def test_csv_iso_strings_and_parquet_datetimes_give_the_same_model(tmp_path, setting: str) -> None:
    csv, parquet = write_any_table(tmp_path)
    from_csv, csv_notes = prepare_input(read_table(csv), "y", "customer_id", drop=["amount"])
    from_parquet, parquet_notes = prepare_input(read_table(parquet), "y", "customer_id", drop=["amount"])
    assert [d["column"] for d in csv_notes["dates"]] == [d["column"] for d in parquet_notes["dates"]]
    outputs = _fitted_outputs(from_csv, setting)
    np.testing.assert_array_equal(outputs, _fitted_outputs(from_parquet, setting))
    assert len(np.unique(outputs, axis=0)) > 1  # the forest learned something


def test_split_is_stratified_and_falls_back_for_rare_classes() -> None:
    table = pd.DataFrame({"x": np.arange(100.0), "y": [0] * 90 + [1] * 10})
    train, test = split_train_test(table, "y", "classification", 0.2, seed=0)
    assert (len(train), len(test)) == (80, 20)
    assert test["y"].sum() == 2 and train["y"].sum() == 8
    rare = table.assign(y=[0] * 99 + [1])  # a class of one row cannot be stratified: plain split instead
    train, test = split_train_test(rare, "y", "classification", 0.2, seed=0)
    assert (len(train), len(test)) == (80, 20)
    with pytest.raises(ParameterError, match=r"^test size must be a fraction in \(0, 1\), got 1\.5$"):
        split_train_test(table, "y", "classification", 1.5, seed=0)


def test_one_hot_fits_categories_on_train() -> None:
    train = pd.DataFrame({"n": [1.0, np.nan, 3.0], "c": ["a", "b", None],
                          "k": pd.Categorical(["u", "v", "u"])})
    test = pd.DataFrame({"n": [np.nan, 2.0], "c": ["b", "z"], "k": pd.Categorical(["v", "w"])})
    train_x, test_x = one_hot(train, test)
    # columns: n, c_a, c_b, k_u, k_v; a missing or unseen category is all zeros
    np.testing.assert_array_equal(train_x, [[1, 1, 0, 1, 0], [np.nan, 0, 1, 0, 1], [3, 0, 0, 1, 0]])
    np.testing.assert_array_equal(test_x, [[np.nan, 0, 1, 0, 1], [2, 0, 0, 0, 0]])


def test_one_hot_takes_booleans_with_missing_values_as_categories() -> None:
    train = pd.DataFrame({"b": pd.Series([True, None, False], dtype=object), "d": [18628.0, np.nan, 18630.5]})
    train_x, test_x = one_hot(train, train.iloc[:1])
    # columns: d, b_False, b_True; a missing boolean is all zeros, a missing number NaN
    np.testing.assert_array_equal(train_x, [[18628.0, 0, 1], [np.nan, 0, 0], [18630.5, 1, 0]])
    np.testing.assert_array_equal(test_x, [[18628.0, 0, 1]])


def test_read_table_wraps_reader_errors(tmp_path) -> None:
    good = tmp_path / "t.parquet"
    pd.DataFrame({"x": [1, 2]}).to_parquet(good)
    assert read_table(good)["x"].tolist() == [1, 2]
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(DataReadError, match=rf"^cannot read '{empty}': EmptyDataError: "):
        read_table(empty)
    with pytest.raises(DataReadError, match=rf"^cannot read '{tmp_path}.csv': no such file$"):
        read_table(f"{tmp_path}.csv")
    folder = tmp_path / "folder.csv"
    folder.mkdir()
    with pytest.raises(DataReadError, match=rf"^cannot read '{folder}': it is a directory$"):
        read_table(folder)


# -- the engine's named errors for malformed parties ----------------------------------------------------

def _parties(n_rows: int = 30) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(0)
    active = pd.DataFrame({"x1": rng.normal(size=n_rows), "y": np.arange(n_rows) % 2})
    passive = pd.DataFrame({"x2": rng.normal(size=n_rows), "x3": rng.normal(size=n_rows)})
    return active, passive


def _fit(parties) -> None:
    FederatedForestClassifier(n_estimators=2, max_depth=2).fit(parties, label="y")


def test_parties_with_different_row_counts() -> None:
    active, passive = _parties()
    with pytest.raises(PartyShapeError, match=r"^parties must hold the same aligned rows, found row counts "
                                              r"\{'party0': 30, 'party1': 29\}$"):
        _fit([active, passive.iloc[:29]])


def test_duplicate_column_across_parties() -> None:
    active, passive = _parties()
    with pytest.raises(DuplicateColumnError,
                       match=r"^column 'x1' is held by both party 'bank' and party 'shop'; "
                             "column names must be unique across parties$"):
        _fit({"bank": active, "shop": passive.rename(columns={"x2": "x1"})})


def test_no_party_holds_the_label() -> None:
    active, passive = _parties()
    with pytest.raises(LabelHolderError, match=r"^no party holds the label column 'y'; parties' columns: "
                                               r"party0: \['x1'\]; party1: \['x2', 'x3'\]$"):
        _fit([active.drop(columns="y"), passive])


def test_two_parties_hold_the_label() -> None:
    active, passive = _parties()
    with pytest.raises(LabelHolderError,
                       match=r"^label column 'y' is held by 2 parties \['party0', 'party1'\]; "
                             "exactly one may hold it$"):
        _fit([active, passive.assign(y=active["y"])])


def test_empty_party() -> None:
    active, passive = _parties()
    with pytest.raises(PartyShapeError, match=r"^party 'party1' has no rows$"):
        _fit([active, passive.iloc[:0]])


def test_party_with_no_columns() -> None:
    active, _ = _parties()
    with pytest.raises(PartyShapeError, match=r"^party 'party1' has no feature columns$"):
        _fit([active, pd.DataFrame(index=active.index)])
