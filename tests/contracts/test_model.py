"""Data contracts as YAML: round trip, refused fields (ConfigError naming file and field), inference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from fedcore.contracts.model import (
    ColumnSpec,
    DataContract,
    LabelSpec,
    dump_contract,
    infer_contract,
    load_contract,
    parse_contract,
    widen_range,
)
from fedcore.errors import ConfigError, InputError

CONTRACT = DataContract(
    name="bank", version="2.10", id_column="customer_id",
    label=LabelSpec("responded", classes=["no", "yes", "on", 1, True, 2.5]),
    row_count=(100, None),
    columns=[
        ColumnSpec("age", "int", nullable=False, min=18, max=120),
        ColumnSpec("income", "float", nullable=True, min=0.0, max=1.5e6),
        ColumnSpec("ratio", "float", nullable=True, min=-0.125, max=None),
        ColumnSpec("region", "category", nullable=True, categories=["north", "south", "1", "null"]),
        ColumnSpec("segment", "category", nullable=False),
        ColumnSpec("vip", "bool", nullable=False),
        ColumnSpec("note", "string", nullable=True),
    ],
)


def test_dump_then_load_gives_the_same_contract(tmp_path: Path) -> None:
    text = dump_contract(CONTRACT, source="bank.csv")
    assert text.startswith("# Data contract 'bank' version 2.10, drafted from bank.csv.\n# REVIEW BEFORE USE")
    path = tmp_path / "bank.yaml"
    path.write_text(text)
    assert load_contract(path) == CONTRACT


def test_round_trip_of_a_regression_label_and_extra_columns_allowed() -> None:
    contract = DataContract(name="claims", version="1", id_column="id", columns=[ColumnSpec("x", "float")],
                            label=LabelSpec("amount", min=0, max=None), allow_extra_columns=True)
    assert parse_contract(yaml.safe_load(dump_contract(contract))) == contract


def test_a_contract_without_label_or_row_count() -> None:
    raw = {"name": "shop", "version": 3, "id_column": "id", "columns": [{"name": "x", "dtype": "float"}]}
    contract = parse_contract(raw)
    assert contract.version == "3" and contract.label is None and contract.row_count is None
    assert contract.columns == [ColumnSpec("x", "float", nullable=True)]
    assert contract.column_names == ["id", "x"]


BASE = {"name": "bank", "version": "1", "id_column": "id", "columns": [{"name": "age", "dtype": "int"}]}


@pytest.mark.parametrize(("change", "message"), [
    ({"version": 1.1}, "version: must be a string such as \"1\" (quote it), found 1.1"),
    ({"colums": []}, "the contract: unknown field(s) ['colums']"),
    ({"columns": [{"name": "age", "dtype": "integer"}]},
     "columns[0] ('age').dtype: must be one of float, int, string, category, bool, date, timestamp, found "
     "'integer'"),
    ({"columns": [{"name": "age", "dtype": "int", "min": 5, "max": 1}]},
     "columns[0] ('age'): min 5 is greater than max 1"),
    ({"columns": [{"name": "age", "dtype": "int", "min": "ten"}]},
     "columns[0] ('age').min: must be a number or null"),
    ({"columns": [{"name": "age", "dtype": "float", "categories": ["a"]}]},
     "columns[0] ('age'): categories apply to dtype category, not to dtype float"),
    ({"columns": [{"name": "r", "dtype": "category", "categories": ["a", "a"]}]},
     "columns[0] ('r').categories: values must be unique, found duplicates 'a'"),
    ({"columns": [{"name": "age", "dtype": "int", "nulable": False}]},
     "columns[0] ('age'): unknown field(s) ['nulable']"),
    ({"columns": [{"name": "id", "dtype": "int"}]},
     "columns[0] ('id'): the name is already used by id_column"),
    ({"label": {"column": "y", "classes": [0, 1], "min": 0}}, "label: give either classes"),
    ({"label": {"column": "id", "classes": [0, 1]}}, "label.column: 'id' is also the id column"),
    ({"row_count": {"min": -1}}, "row_count.min: must be a whole number >= 0 or null, found -1"),
    ({"id_column": ""}, "id_column: must be a non-empty string, found ''"),
])
def test_bad_fields_are_config_errors_naming_file_and_field(tmp_path: Path, change: dict,
                                                            message: str) -> None:
    path = tmp_path / "bank.yaml"
    path.write_text(yaml.safe_dump({**BASE, **change}))
    with pytest.raises(ConfigError) as caught:
        load_contract(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read data contract .*nope.yaml"):
        load_contract(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_contract(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="bad.yaml: expected a mapping at the top level, found list"):
        load_contract(bad)


def _sample(n_rows: int = 60) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({
        "customer_id": [f"c{i:03d}" for i in range(n_rows)],
        "amount": np.linspace(0.5, 12.25, n_rows),
        "temp": np.linspace(-3.2, 3.5, n_rows),
        "age": np.linspace(18, 95, n_rows).round().astype(np.int64),
        "region": rng.choice(["south", "north", "east"], n_rows).astype(object),
        "grade": pd.Categorical(rng.choice(["b", "a"], n_rows), categories=["a", "b", "c"]),
        "vip": rng.random(n_rows) < 0.5,
        "note": [f"free text {i}" for i in range(n_rows)],
        "y": rng.integers(0, 2, n_rows),
    })
    frame.loc[[3, 7], "amount"] = np.nan
    frame.loc[5, "region"] = None
    return frame


def test_infer_drafts_dtypes_nullability_ranges_and_categories() -> None:
    contract = infer_contract(_sample(), "bank", label="y")
    assert (contract.name, contract.version, contract.id_column) == ("bank", "1", "customer_id")
    assert contract.label == LabelSpec("y", classes=[0, 1])
    assert contract.row_count is None and contract.allow_extra_columns is False
    assert contract.columns == [
        ColumnSpec("amount", "float", nullable=True, min=0.0, max=20.0),
        ColumnSpec("temp", "float", nullable=False, min=-4.0, max=5.0),
        ColumnSpec("age", "int", nullable=False, min=10, max=110),
        ColumnSpec("region", "category", nullable=True, categories=["east", "north", "south"]),
        ColumnSpec("grade", "category", nullable=False, categories=["a", "b", "c"]),
        ColumnSpec("vip", "bool", nullable=False),
        ColumnSpec("note", "string", nullable=False),
    ]
    assert all(type(v) is int for v in (contract.columns[2].min, contract.columns[2].max,
                                        *contract.label.classes))
    assert parse_contract(yaml.safe_load(dump_contract(contract))) == contract


def test_infer_with_a_regression_label_and_pandas_string_dtype() -> None:
    frame = _sample()
    frame["y"] = np.linspace(-0.3, 0.77, len(frame))
    frame["region"] = frame["region"].astype("str")
    contract = infer_contract(frame, "bank", id_column="customer_id", label="y")
    assert contract.label == LabelSpec("y", min=-1.0, max=1.0)
    assert contract.columns[3] == ColumnSpec("region", "category", nullable=True,
                                             categories=["east", "north", "south"])


def test_infer_refuses_unknown_columns_and_a_missing_id() -> None:
    frame = _sample()
    with pytest.raises(InputError, match="label column 'target' not in the table"):
        infer_contract(frame, "bank", label="target")
    with pytest.raises(InputError, match="no id column given and none found"):
        infer_contract(frame.drop(columns=["customer_id"]), "bank")
    with pytest.raises(InputError, match="column 'span' has dtype timedelta64"):
        infer_contract(frame.assign(span=pd.Timedelta(days=1)), "bank")


@pytest.mark.parametrize(("values", "integer", "bounds"), [
    ([18, 95], True, (10, 110)),
    ([-3.2, 3.5], False, (-4.0, 5.0)),
    ([0.012, 0.0385], False, (0.0, 0.05)),
    ([-7.0, -2.0], False, (-8.0, -1.0)),
    ([-7.0, -0.5], False, (-8.0, 0.0)),
    ([0, 1], True, (0, 2)),
    ([0, 0], True, (0, 0)),
    ([5.0, 5.0], False, (4.0, 6.0)),
    ([], False, (None, None)),
])
def test_widen_range_pads_ten_percent_and_rounds_outward(values: list, integer: bool, bounds: tuple) -> None:
    assert widen_range(pd.Series(values, dtype="float64"), integer=integer) == bounds
