"""Infinities are refused the same way everywhere, naming the column; missing values stay accepted.

Everywhere: simulate in both settings, both estimators, an agent's files, prediction batches.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedcore.agents.data import read_files
from fedcore.cli import main
from fedcore.data.numbers import numeric_values
from fedcore.data.split import split_horizontal, split_vertical
from fedcore.errors import InputError
from fedcore.horizontal.estimators import FederatedExtraTreesClassifier
from fedcore.vertical.estimators import FederatedForestClassifier

REFUSAL = "holds 2 infinite values \\(inf or -inf\\): replace them with missing values"


@pytest.fixture
def table() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": rng.normal(size=300), "b": rng.normal(size=300), "y": rng.integers(0, 2, 300)})
    frame.loc[[5, 250], "a"] = [np.inf, -np.inf]
    frame.loc[7, "b"] = np.nan  # a missing value is fine
    return frame


def test_numbers_refuse_infinities_and_keep_missing_values():
    assert np.isnan(numeric_values(pd.Series([1.0, None, 3.0], name="x"))[1])
    with pytest.raises(InputError, match="column 'x' holds 1 infinite value \\(inf or -inf\\)"):
        numeric_values(pd.Series([1.0, np.inf], name="x"))
    assert numeric_values(pd.Series([True, False], name="flag")).tolist() == [1.0, 0.0]


@pytest.mark.parametrize("setting", ["vertical", "horizontal"])
def test_simulate_refuses_with_one_line(table, tmp_path, capsys, setting):
    path = tmp_path / "table.csv"
    table.to_csv(path, index=False)
    assert main(["simulate", "--data", str(path), "--label", "y", "--trees", "3", "--setting", setting]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedforest: error: column 'a' holds 2 infinite values")


def test_the_vertical_estimator_refuses_in_fit_and_in_predict(table):
    with pytest.raises(InputError, match=f"party 'party0' column 'a' {REFUSAL}"):
        FederatedForestClassifier(n_estimators=2).fit(split_vertical(table, 2, label="y"), label="y")
    finite = table.replace([np.inf, -np.inf], np.nan)
    model = FederatedForestClassifier(n_estimators=2).fit(split_vertical(finite, 2, label="y"), label="y")
    with pytest.raises(InputError, match=f"party 'party0' column 'a' {REFUSAL}"):
        model.predict(split_vertical(table.drop(columns=["y"]), 2))


def test_the_horizontal_estimator_refuses(table):
    parties = split_horizontal(table, 2, seed=0)
    first, count = next((f"party{i}", int(np.isinf(f["a"]).sum())) for i, f in enumerate(parties)
                        if np.isinf(f["a"]).any())
    with pytest.raises(InputError, match=f"party '{first}' column 'a' holds {count} infinite value"):
        FederatedExtraTreesClassifier(n_estimators=2).fit(parties, label="y")


def test_an_agent_refuses_its_own_files(table, tmp_path):
    table.assign(customer_id=[f"C{i}" for i in range(len(table))]).to_parquet(tmp_path / "bank.parquet")
    with pytest.raises(InputError, match=f"institution 'bank' column 'a' {REFUSAL}"):
        read_files(str(tmp_path / "bank.parquet"), "institution 'bank'", skip=["customer_id", "y"])
