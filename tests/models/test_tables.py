"""Exact round trips of the master's and the parties' tree tables through Arrow."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from fedcore.data.split import split_vertical
from fedcore.errors import ArtifactError
from fedcore.models.tables import master_table, partial_forest_from_table, party_table, structure_from_table
from fedcore.vertical.estimators import FederatedForestClassifier
from tests.conftest import mixed_table

STRUCTURE_FIELDS = ("tree", "node", "left", "right", "depth", "owner", "weight", "value")
PARTIAL_FIELDS = ("tree", "node", "left", "right", "feature", "threshold", "missing_left",
                  "is_categorical", "cat_bits")


@pytest.fixture(scope="module")
def model() -> FederatedForestClassifier:
    """A 5-tree forest over 3 parties on numeric, string/pandas categorical, boolean and NaN columns."""
    frame = mixed_table(n_rows=300, seed=0)
    parties = split_vertical(frame, 3, label="target", seed=0)
    return FederatedForestClassifier(n_estimators=5, max_depth=5).fit(parties, label="target")


def test_master_table_round_trip_is_exact(model) -> None:
    structure = model.master_.structure
    back = structure_from_table(master_table(structure), structure.n_trees)
    for field in STRUCTURE_FIELDS:
        a, b = getattr(structure, field), getattr(back, field)
        assert a.dtype == b.dtype and np.array_equal(a, b), field
    assert back.n_trees == structure.n_trees


def test_master_table_holds_no_features_or_thresholds(model) -> None:
    table = master_table(model.master_.structure)
    assert table.column_names == list(STRUCTURE_FIELDS)
    assert table.schema.field("owner").type == pa.int16()
    assert table.schema.field("value").type == pa.list_(pa.float64(), 3)


def test_party_table_round_trip_is_exact(model) -> None:
    for party in model.parties_:
        original = party.model
        back = partial_forest_from_table(party_table(original))
        for field in PARTIAL_FIELDS:
            a, b = getattr(original, field), getattr(back, field)
            assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=(field == "threshold")), (party.name,
                                                                                                   field)
        assert back.n_trees == original.n_trees
        assert back.column_names == original.column_names
        assert back.column_categories == original.column_categories


def test_party_table_names_features_only_on_its_own_nodes(model) -> None:
    owner = master_table(model.master_.structure).column("owner").to_numpy()
    for index, party in enumerate(model.parties_):
        table = party_table(party.model)
        named = table.column("feature").is_valid().to_numpy(zero_copy_only=False)
        assert np.array_equal(named, owner == index), party.name
        assert set(table.column("feature").drop_null().to_pylist()) <= set(party.model.column_names)
        threshold_set = table.column("threshold").is_valid().to_numpy(zero_copy_only=False)
        assert not np.any(threshold_set & ~named)


def test_categorical_splits_are_stored_as_category_strings(model) -> None:
    found = []
    for party in model.parties_:
        table = party_table(party.model)
        vocabulary = {c["name"]: c["categories"]
                      for c in json.loads(table.schema.metadata[b"fedforest.columns"])}
        rows = table.filter(table.column("categories_left").is_valid()).to_pylist()
        for row in rows:
            assert row["threshold"] is None
            assert set(row["categories_left"]) <= set(vocabulary[row["feature"]])
        found.extend(row["feature"] for row in rows)
    assert {"cat_str", "cat_pd"} & set(found), "the fixture should produce categorical splits"


def test_unknown_category_is_refused(model) -> None:
    party = next(p for p in model.parties_ if p.model.is_categorical.any())
    table = party_table(party.model)
    cats = table.column("categories_left").to_pylist()
    first = next(i for i, c in enumerate(cats) if c is not None)
    cats[first] = ["no-such-category"]
    tampered = table.set_column(table.column_names.index("categories_left"), "categories_left",
                                pa.array(cats, pa.list_(pa.string())))
    with pytest.raises(ArtifactError, match="no-such-category"):
        partial_forest_from_table(tampered)


def test_unknown_feature_name_is_refused(model) -> None:
    table = party_table(model.parties_[0].model)
    names = table.column("feature").to_pylist()
    first = next(i for i, n in enumerate(names) if n is not None)
    names[first] = "not_a_column"
    tampered = table.set_column(table.column_names.index("feature"), "feature", pa.array(names, pa.string()))
    with pytest.raises(ArtifactError, match="not_a_column"):
        partial_forest_from_table(tampered)
