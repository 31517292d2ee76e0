"""Splitting one table into simulated parties: horizontal partitions (iid, by column, label-skewed)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedcore.data.split import split_horizontal
from fedcore.errors import ColumnNotFoundError, ParameterError


@pytest.fixture
def table() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    n = 3000
    return pd.DataFrame({"x": rng.normal(size=n), "region": rng.choice(["north", "south", "east"], n),
                         "y": rng.choice(["a", "b", "c", "d"], n, p=[0.4, 0.3, 0.2, 0.1])})


def _rows(parties: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(parties).sort_values("x").reset_index(drop=True)


@pytest.mark.parametrize("partition", ["iid", "column", "dirichlet"])
def test_every_row_goes_to_exactly_one_party(table, partition) -> None:
    parties = split_horizontal(table, 3, partition=partition, label="y", column="region", seed=1)
    assert len(parties) == 3 and all(list(p.columns) == ["x", "region", "y"] for p in parties)
    pd.testing.assert_frame_equal(_rows(parties), table.sort_values("x").reset_index(drop=True))


def test_iid_shares_are_even_and_seeded(table) -> None:
    parties = split_horizontal(table, 4, seed=3)
    assert [len(p) for p in parties] == [750] * 4
    assert split_horizontal(table, 4, seed=3)[0].equals(parties[0])
    assert not split_horizontal(table, 4, seed=4)[0].equals(parties[0])


def test_column_partition_keeps_each_value_at_one_party(table) -> None:
    parties = split_horizontal(table, 3, partition="column", column="region")
    assert sorted(tuple(p["region"].unique()) for p in parties) == [("east",), ("north",), ("south",)]
    by_number = split_horizontal(table, 3, partition="column", column="x")
    assert by_number[0]["x"].max() < by_number[1]["x"].min()
    assert by_number[1]["x"].max() < by_number[2]["x"].min()


def test_small_alpha_skews_labels_large_alpha_does_not(table) -> None:
    def skew(alpha: float) -> float:
        parties = split_horizontal(table, 3, partition="dirichlet", label="y", alpha=alpha, seed=2)
        shares = np.array([p["y"].value_counts(normalize=True).reindex(list("abcd"), fill_value=0)
                           for p in parties])
        return float(np.abs(shares - shares.mean(axis=0)).mean())
    assert skew(0.2) > 4 * skew(100.0)


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"n_parties": 0}, ParameterError, "n_parties must be an integer >= 1, got 0"),
    ({"n_parties": 2, "partition": "random"}, ParameterError,
     "partition must be one of ['iid', 'column', 'dirichlet']"),
    ({"n_parties": 2, "partition": "column"}, ParameterError, "the column partition needs column=..."),
    ({"n_parties": 2, "partition": "column", "column": "zip"}, ColumnNotFoundError,
     "partition column 'zip' not in"),
    ({"n_parties": 4, "partition": "column", "column": "region"}, ParameterError,
     "the column partition leaves parties [3] without rows: column 'region' has fewer distinct values than "
     "parties"),
    ({"n_parties": 2, "partition": "dirichlet", "label": "y", "alpha": 0}, ParameterError,
     "alpha must be a finite number > 0, got 0"),
    ({"n_parties": 5000}, ParameterError, "cannot deal 3000 rows out to 5000 parties"),
])
def test_bad_partitions_are_refused(table, kwargs, error, message) -> None:
    with pytest.raises(error) as caught:
        split_horizontal(table, **kwargs)
    assert str(caught.value).startswith(message)
