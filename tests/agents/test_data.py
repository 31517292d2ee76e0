"""An institution's configured ID column and label are checked against its contract and table at load.

A misspelt label used to pass validation and fail at alignment as a raw pandas KeyError (issue #28).
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from fedcore.agents.data import institution_from_config
from fedcore.config import parse_config
from fedcore.contracts.model import dump_contract, infer_contract
from fedcore.errors import ColumnNotFoundError, ConfigError


def _config(tmp_path: Path, bank: dict, contract: bool = False):
    frame = pd.DataFrame({"customer_id": ["a", "b", "c"], "x": [1.0, 2.0, 3.0], "churned": [0, 1, 0]})
    frame.to_parquet(tmp_path / "bank.parquet")
    pd.DataFrame({"client": ["d"], "x": [4.0]}).to_csv(tmp_path / "new.csv", index=False)
    pd.DataFrame({"customer_id": ["a"], "z": [1.0]}).to_parquet(tmp_path / "telco.parquet")
    if contract:
        (tmp_path / "bank.yaml").write_text(dump_contract(infer_contract(frame, "bank", "customer_id",
                                                                         "churned")))
    raw = {"federation": "f", "consortium_key": {"env": "UNUSED"}, "institutions": [
        {"name": "telco", "data": "telco.parquet", "id_column": "customer_id"},
        {"name": "bank", "data": "bank.parquet", "id_column": "customer_id", "label": "churned",
         **({"contract": "bank.yaml"} if contract else {}), **bank}]}
    return parse_config(raw, tmp_path / "federation.yaml")


def test_a_label_that_is_not_a_column_of_the_table_is_refused_with_the_close_match(tmp_path) -> None:
    config = _config(tmp_path, {"label": "churn"})
    with pytest.raises(ColumnNotFoundError) as refused:
        institution_from_config(config, "bank")
    assert str(refused.value) == ("institution 'bank': label 'churn' is not a column of its table (did you "
                                  f"mean 'churned'?); set institutions[1].label in "
                                  f"{tmp_path}/federation.yaml")
    config = _config(tmp_path, {"id_column": "client"})  # nothing close: no guess
    with pytest.raises(ColumnNotFoundError, match=re.escape(
            "institution 'bank': id_column 'client' is not a column of its table; set "
            "institutions[1].id_column in ")):
        institution_from_config(config, "bank")


def test_a_label_or_id_column_other_than_the_contracts_is_refused_before_validation(tmp_path) -> None:
    config = _config(tmp_path, {"label": "churn"}, contract=True)
    with pytest.raises(ConfigError) as refused:
        institution_from_config(config, "bank")
    assert str(refused.value) == (f"institution 'bank': label 'churn' is not the label of its data contract "
                                  f"'{tmp_path}/bank.yaml' ('churned'); set institutions[1].label in "
                                  f"{tmp_path}/federation.yaml (or correct the contract)")
    config = _config(tmp_path, {"id_column": "customer"}, contract=True)
    with pytest.raises(ConfigError, match=re.escape("institution 'bank': id_column 'customer' is not the "
                                                    "id_column of its data contract")):
        institution_from_config(config, "bank")
    data = institution_from_config(_config(tmp_path, {}, contract=True), "bank")
    assert data.valid and data.label == "churned"


def test_new_rows_without_the_id_column_are_refused_when_read(tmp_path) -> None:
    data = institution_from_config(_config(tmp_path, {"predict_data": "new.csv"}), "bank")
    assert data.load_batch is not None
    with pytest.raises(ColumnNotFoundError) as refused:
        data.load_batch()
    assert str(refused.value) == (f"institution 'bank': id_column 'customer_id' is not a column of its "
                                  f"prediction data '{tmp_path}/new.csv'; set institutions[1].id_column in "
                                  f"{tmp_path}/federation.yaml")
