"""Horizontal federations: the institutions' contracts must agree, or a named error says where not."""

from __future__ import annotations

import pytest

from fedcore.contracts.agreement import SharedColumn, shared_schema
from fedcore.contracts.model import parse_contract
from fedcore.errors import ContractMismatch


def _contract(name: str, **changes) -> dict:
    raw = {"name": name, "version": "1", "id_column": "patient_id",
           "label": {"column": "outcome", "classes": ["healthy", "ill"]},
           "columns": [{"name": "age", "dtype": "int", "min": 0, "max": 110},
                       {"name": "bmi", "dtype": "float", "min": 10.0, "max": 60.0},
                       {"name": "smoker", "dtype": "category", "categories": ["no", "yes"]}]}
    raw.update(changes)
    return parse_contract(raw, name)


def test_agreeing_contracts_give_one_schema_with_the_hull_of_their_domains() -> None:
    other = _contract("b", columns=[{"name": "age", "dtype": "int", "min": 18, "max": 120},
                                    {"name": "bmi", "dtype": "float", "min": 12.0, "max": 55.0},
                                    {"name": "smoker", "dtype": "category", "categories": ["yes", "no"]}])
    schema = shared_schema({"a": _contract("a"), "b": other})
    assert schema.label == "outcome" and schema.classes == ("healthy", "ill")
    assert schema.columns == (SharedColumn("age", "int", None, 0, 120),
                              SharedColumn("bmi", "float", None, 10.0, 60.0),
                              SharedColumn("smoker", "category", ("no", "yes")))
    assert schema.feature_ranges() == {"age": (0, 120), "bmi": (10.0, 60.0)}


@pytest.mark.parametrize(("changes", "message"), [
    ({"columns": [{"name": "age", "dtype": "int"},
                  {"name": "smoker", "dtype": "category", "categories": ["no", "yes"]}]},
     "institution 'b': its contract lacks ['bmi'] compared with 'a'; every institution must declare the same "
     "feature columns"),
    ({"columns": [{"name": "age", "dtype": "float"}, {"name": "bmi", "dtype": "float"},
                  {"name": "smoker", "dtype": "category", "categories": ["no", "yes"]}]},
     "institution 'b', column 'age': dtype 'float', but 'a' declares 'int'; declare one dtype everywhere"),
    ({"columns": [{"name": "age", "dtype": "int"}, {"name": "bmi", "dtype": "float"},
                  {"name": "smoker", "dtype": "category", "categories": ["no", "yes", "former"]}]},
     "institution 'b', column 'smoker': categories ['former', 'no', 'yes'], but 'a' declares ['no', 'yes']"),
    ({"label": {"column": "outcome", "classes": ["healthy", "ill", "deceased"]}},
     "institution 'b': label classes differ from 'a' (only at 'a': []; only at 'b': ['deceased']); every "
     "contract must declare every class of the federation"),
    ({"label": {"column": "diagnosis", "classes": ["healthy", "ill"]}},
     "institution 'b': label column 'diagnosis', but 'a' declares 'outcome'"),
    ({"label": None}, "institution 'b': its contract declares no label"),
])
def test_disagreeing_contracts_are_refused_by_institution_and_column(changes, message) -> None:
    with pytest.raises(ContractMismatch) as caught:
        shared_schema({"a": _contract("a"), "b": _contract("b", **changes)})
    assert str(caught.value).startswith(message)


def test_ppd_ert_needs_declared_domains() -> None:
    undeclared = _contract("a", columns=[{"name": "age", "dtype": "int", "min": 0, "max": 110},
                                         {"name": "bmi", "dtype": "float"}])
    with pytest.raises(ContractMismatch, match=r"declare min and max for column\(s\) \['bmi'\] in every"):
        shared_schema({"a": undeclared}).feature_ranges()
