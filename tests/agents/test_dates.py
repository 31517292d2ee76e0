"""Dates through a real federation (issue #30): agents convert them exactly as `fedforest simulate` does.

The same rows with Parquet dates and as a CSV export of ISO strings train the same model (digest) and
predict the same, horizontally (dates declared by the contracts) and vertically (no contracts: the
columns the training table holds dates in), and the agent's converted column is simulate's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcore.agents.data import institution_from_config
from fedcore.config import parse_config
from fedcore.contracts.model import dump_contract, infer_contract
from fedcore.data.datasets import make_waveform
from fedcore.data.split import split_horizontal
from fedcore.errors import InputError
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.session import HorizontalSession
from fedcore.models.artifacts import table_sha256
from fedcore.simulation.table import prepare_input
from tests.federations import horizontal_session_from_config, vertical_session_from_config
from tests.keys import master_public_key

NAMES = ("north", "south")


def dated_table(n_rows: int = 450) -> pd.DataFrame:
    """Waveform rows (6 features, 3 decimals: CSV round-trips them) whose class also shows in two dates."""
    table = make_waveform(n_rows, random_state=3).round(3)[[f"x{i}" for i in range(5, 11)] + ["class"]]
    rng = np.random.default_rng(5)
    offsets = table["class"] * 900 + rng.integers(0, 1200, n_rows)
    opened = pd.Timestamp("2015-01-01") + pd.to_timedelta(offsets, unit="D")
    login = opened + pd.to_timedelta(rng.integers(0, 86_400 * 30, n_rows), unit="s")
    table["opened"] = [d.date() for d in opened]
    table["last_login"] = login.dt.tz_localize("Europe/Berlin")
    table.loc[::17, "opened"] = None
    table["class"] = table["class"].map({0: "a", 1: "b", 2: "c"})
    table.insert(0, "customer_id", [f"C{i:05d}" for i in range(n_rows)])
    return table


def write_both(rows: pd.DataFrame, stem: Path) -> None:
    """`rows` as Parquet (date and timestamp types) and as a CSV export (ISO strings with offsets)."""
    rows.to_parquet(stem.with_suffix(".parquet"))
    rows.to_csv(stem.with_suffix(".csv"), index=False)


def _horizontal_config(root: Path, suffix: str):
    """Files `<name><suffix>`, or (suffix "sql") the tables of the database in $FED_DB_URL."""
    def source(stem: str) -> str | dict:
        if suffix == "sql":
            return {"sql": {"url": {"env": "FED_DB_URL"}, "table": stem}}
        return f"{stem}{suffix}"

    institutions = [{"name": name, "id_column": "customer_id", "label": "class", "contract": "contract.yaml",
                     "data": source(name), "predict_data": source(f"{name}_new"),
                     "registry": f"registry{suffix}/{name}", "predictions": f"predictions{suffix}/{name}"}
                    for name in NAMES]
    raw = {"federation": "dated", "setting": "horizontal", "consortium_key": {"env": "UNUSED"},
           "master": {"public_key": str(master_public_key(root))}, "institutions": institutions}
    return parse_config(raw, root / "federation.yaml")


def _horizontal_session(config) -> HorizontalSession:
    return horizontal_session_from_config(
        config, ExtraTreesParams(n_estimators=8, max_depth=6, random_state=4))


def _write_horizontal(table: pd.DataFrame, root: Path, database: str | None = None) -> None:
    """Each institution's rows and new rows as Parquet, CSV and (with a `database`) PostgreSQL tables."""
    for name, part in zip(NAMES, split_horizontal(table, 2, seed=1), strict=True):
        part = part.reset_index(drop=True)
        new = part.sample(frac=0.3, random_state=2).drop(columns=["class"])
        for rows, stem in ((part, name), (new, f"{name}_new")):
            write_both(rows, root / stem)
            if database is not None:
                from tests.postgres import load_table

                load_table(database, stem, rows)


def _train_and_predict(config) -> tuple[str, dict[str, pd.DataFrame]]:
    """The forest's digest (after checking that it splits on the dates) and each institution's predictions."""
    session = _horizontal_session(config)
    session.agree_schema()
    session.train()
    used = set(session.model.feature.tolist())
    assert {session.schema.names.index(c) for c in ("opened", "last_login")} <= used, "dates split"
    paths = session.predict_locally("flow-run-1")["paths"]
    return table_sha256(session.model.to_table()), {n: pd.read_parquet(p) for n, p in paths.items()}


def test_a_horizontal_federation_trains_the_same_model_from_parquet_dates_and_csv_iso_strings(
        tmp_path) -> None:
    table = dated_table()
    contract = infer_contract(table, "dated", "customer_id", "class")
    assert {c.name: c.dtype for c in contract.columns if c.dtype in ("date", "timestamp")} == {
        "opened": "date", "last_login": "timestamp"}
    (tmp_path / "contract.yaml").write_text(dump_contract(contract))
    _write_horizontal(table, tmp_path)
    north = institution_from_config(_horizontal_config(tmp_path, ".csv"), "north")
    assert north.valid and north.dates == ("opened", "last_login")
    simulated, _ = prepare_input(pd.read_parquet(tmp_path / "north.parquet"), "class", "customer_id")
    for column in ("opened", "last_login"):  # simulate's numbers, bit for bit, from the CSV's strings
        np.testing.assert_array_equal(north.frame[column].to_numpy(), simulated[column].to_numpy())

    (digest, predictions), (csv_digest, csv_predictions) = (
        _train_and_predict(_horizontal_config(tmp_path, suffix)) for suffix in (".parquet", ".csv"))
    assert csv_digest == digest
    for name in NAMES:
        pd.testing.assert_frame_equal(csv_predictions[name], predictions[name], check_exact=True)


@pytest.mark.postgres
def test_date_and_timestamptz_columns_in_postgresql_train_the_parquet_model(database, tmp_path,
                                                                            monkeypatch) -> None:
    monkeypatch.setenv("FED_DB_URL", database)
    table = dated_table()
    (tmp_path / "contract.yaml").write_text(dump_contract(infer_contract(table, "dated", "customer_id",
                                                                         "class")))
    _write_horizontal(table, tmp_path, database)
    from fedcore.data.sql import SqlSource, read_arrow

    types = read_arrow(SqlSource(("url", database), table="north"), "test").schema
    assert (str(types.field("opened").type), str(types.field("last_login").type)) == (
        "date32[day]", "timestamp[us, tz=UTC]")
    (digest, predictions), (sql_digest, sql_predictions) = (
        _train_and_predict(_horizontal_config(tmp_path, suffix)) for suffix in (".parquet", "sql"))
    assert sql_digest == digest
    for name in NAMES:  # a database's batch is read in ID order
        pd.testing.assert_frame_equal(sql_predictions[name],
                                      predictions[name].sort_values("customer_id", ignore_index=True),
                                      check_exact=True)


def test_a_batch_that_breaks_the_declared_dates_is_one_line_naming_the_column(tmp_path) -> None:
    table = dated_table(60)
    (tmp_path / "contract.yaml").write_text(dump_contract(infer_contract(table, "dated", "customer_id",
                                                                         "class")))
    for name in NAMES:
        write_both(table, tmp_path / name)
        new = table.drop(columns=["class"]).astype({"opened": "str"})
        new.loc[4, "opened"] = "2021-02-30"
        new.to_csv(tmp_path / f"{name}_new.csv", index=False)
    north = institution_from_config(_horizontal_config(tmp_path, ".csv"), "north")
    with pytest.raises(InputError) as refused:
        north.load_batch()
    assert str(refused.value) == (
        "institution 'north' prediction data: column 'opened' holds ISO dates, but 1 values are not valid "
        "dates ('2021-02-30'); correct or blank them")


def _vertical_config(root: Path, suffix: str):
    institutions = [{"name": name, "id_column": "customer_id", "data": f"{name}{suffix}",
                     "predict_data": f"{name}_new{suffix}", "registry": f"registry{suffix}/{name}",
                     "predictions": f"predictions{suffix}/{name}", **({"label": "class"} if label else {})}
                    for name, label in (("bank", True), ("shop", False))]
    raw = {"federation": "dated", "consortium_key": {"env": "UNUSED"},
           "master": {"public_key": str(master_public_key(root))}, "institutions": institutions}
    return parse_config(raw, root / "federation.yaml")


def test_a_vertical_federation_without_contracts_trains_the_same_model_from_parquet_and_csv(tmp_path) -> None:
    from fedcore.models.registry import ModelRegistry
    from tests.keys import master_key

    table = dated_table()
    shop = ["opened", "last_login", "x8", "x9", "x10"]
    parts = {"bank": table.drop(columns=shop), "shop": table[["customer_id", *shop]]}
    for name, rows in parts.items():
        write_both(rows, tmp_path / name)
        write_both(rows.drop(columns=["class"], errors="ignore").sample(frac=0.3, random_state=2),
                   tmp_path / f"{name}_new")
    digests, delivered = [], []
    for suffix in (".parquet", ".csv"):
        config = _vertical_config(tmp_path, suffix)
        assert institution_from_config(config, "shop").dates == ("opened", "last_login")
        session = vertical_session_from_config(config)
        session.align()
        session.train()
        entries = session.manifest_entries()["parties"]
        master = table_sha256(session.master_tables()["master"])
        digests.append([p["table_sha256"] for p in entries] + [master])
        registry = ModelRegistry(tmp_path / f"master{suffix}", signing_key=master_key(tmp_path))
        version = registry.register("dated", {"parties": entries}, session.master_tables())
        session.store_at_institutions("dated", version, registry.read_manifest("dated", version))
        delivered.append(pd.read_parquet(session.batch_predict("bank", run_id="flow-run-2")["path"]))
    assert digests[0] == digests[1]
    pd.testing.assert_frame_equal(delivered[1], delivered[0], check_exact=True)
