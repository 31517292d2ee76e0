"""CSV files as real exports write them (issue #30): separator, decimal mark, encoding, quotes, null markers.

A European export (`;`, decimal `,`, latin-1, `'` quotes, "n/a" for missing) reads into the frame its
Parquet twin gives, through `read_table`, an institution's `{csv: ...}` data and `fedforest contract`;
a `;` file read with the default separator is refused with one line naming the separator to set.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcore.agents.data import institution_from_config
from fedcore.cli import main
from fedcore.config import parse_config
from fedcore.data.dialect import CsvDialect
from fedcore.data.io import read_table
from fedcore.errors import ConfigError, DataReadError

EUROPEAN = CsvDialect(sep=";", decimal=",", encoding="latin-1", quotechar="'", na_values=("n/a",))
EXPORT = """customer_id;city;income;age;note
c1;Zürich;1234,5;41;'a;b'
c2;Malmö;n/a;35;plain
c3;Köln;-0,25;29;'x'
"""


@pytest.fixture
def export(tmp_path: Path) -> tuple[Path, Path]:
    """The export (latin-1 bytes) and its Parquet twin."""
    csv = tmp_path / "customers.csv"
    csv.write_bytes(EXPORT.encode("latin-1"))
    twin = pd.DataFrame({"customer_id": ["c1", "c2", "c3"], "city": ["Zürich", "Malmö", "Köln"],
                         "income": [1234.5, np.nan, -0.25], "age": [41, 35, 29],
                         "note": ["a;b", "plain", "x"]})
    parquet = tmp_path / "customers.parquet"
    twin.to_parquet(parquet)
    return csv, parquet


def test_a_european_export_reads_as_its_parquet_twin(export) -> None:
    csv, parquet = export
    pd.testing.assert_frame_equal(read_table(csv, EUROPEAN), read_table(parquet), check_exact=True)


def test_a_semicolon_file_read_with_the_default_separator_is_one_line_naming_it(export, capsys) -> None:
    csv, _ = export
    csv.write_text(EXPORT.replace("'a;b'", "ab").replace("Zürich", "Zurich").replace("Malmö", "Malmo")
                   .replace("Köln", "Koln"))
    with pytest.raises(DataReadError) as refused:
        read_table(csv)
    line = (f"cannot read {str(csv)!r}: it reads as one column 'customer_id;city;income;age;note' with the "
            "separator ','; the separator is probably ';': pass --sep ';', or in federation.yaml write data "
            "as {csv: {path: ..., sep: ';'}}")
    assert str(refused.value) == line
    assert main(["contract", "infer", str(csv), "--id", "customer_id"]) == 1
    assert capsys.readouterr().err.strip() == f"fedforest: error: {line}"
    tabbed = csv.with_name("tabbed.csv")
    tabbed.write_text("a\tb\n1\t2\n")
    with pytest.raises(DataReadError, match=r"the separator is probably '\\t': pass --sep '\\t'"):
        read_table(tabbed)
    assert list(read_table(tabbed, CsvDialect(sep="\t")).columns) == ["a", "b"]


def _config(root: Path, data) -> object:
    raw = {"federation": "f", "consortium_key": {"env": "UNUSED"},
           "institutions": [{"name": "bank", "data": data, "id_column": "customer_id", "label": "age"},
                            {"name": "shop", "data": "shop.parquet", "id_column": "customer_id"}]}
    return parse_config(raw, root / "federation.yaml")


def test_an_institutions_csv_data_with_its_dialect_is_the_parquet_twins_table(export, tmp_path) -> None:
    csv, parquet = export
    data = {"csv": {"path": csv.name, "sep": ";", "decimal": ",", "encoding": "latin-1", "quotechar": "'",
                    "na_values": ["n/a"]}}
    config = _config(tmp_path, data)
    assert config.institutions[0].data.path == str(csv) and config.institutions[0].data.dialect == EUROPEAN
    frame = institution_from_config(config, "bank").frame
    twin = institution_from_config(_config(tmp_path, parquet.name), "bank").frame
    pd.testing.assert_frame_equal(frame, twin, check_exact=True)


@pytest.mark.parametrize(("csv", "message"), [
    ({"path": "a.csv", "separator": ";"},
     "unknown csv setting 'separator'; known: ['path', 'sep', 'decimal', 'encoding', 'quotechar', "
     "'na_values']"),
    ({"path": "a.csv", "sep": ";;"}, "csv: sep must be one character (for a tab: \"\\t\"), found ';;'"),
    ({"path": "a.csv", "sep": ",", "decimal": ","},
     "csv: sep and decimal are both ','; a file cannot use one character for both"),
    ({"path": "a.csv", "encoding": "latin-9x"},
     "csv: unknown encoding 'latin-9x'; use one such as utf-8, latin-1 or cp1252"),
    ({"path": "a.parquet"}, "csv.path must name .csv files (a path or glob), found 'a.parquet'"),
    ({"path": "a.csv", "na_values": "n/a"}, "csv.na_values must be a list of strings, found 'n/a'"),
])
def test_a_bad_csv_setting_is_one_config_error(tmp_path, csv: dict, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        _config(tmp_path, {"csv": csv})
    assert str(refused.value) == f"{tmp_path / 'federation.yaml'}: institution 'bank': data: {message}"


def test_contract_infer_and_check_take_the_dialect_flags(export, tmp_path, capsys) -> None:
    csv, parquet = export
    flags = ["--sep", ";", "--decimal", ",", "--encoding", "latin-1", "--quotechar", "'", "--na-value", "n/a"]
    drafts = []
    for data, extra in ((parquet, []), (csv, flags)):
        out = tmp_path / f"{data.suffix[1:]}.yaml"
        assert main(["contract", "infer", str(data), "--id", "customer_id", "--out", str(out), *extra]) == 0
        drafts.append(out.read_text().split("\n", 1)[1])  # the header's first line names the file
    assert drafts[0] == drafts[1]
    assert main(["contract", "check", str(csv), "--contract", str(tmp_path / "parquet.yaml"), *flags]) == 0
    assert main(["contract", "check", str(csv), "--contract", str(tmp_path / "parquet.yaml")]) == 1
    assert capsys.readouterr().err.strip() == (
        f"fedforest: error: cannot read {str(csv)!r}: it is not utf-8 text (byte 0xfc): set its encoding: "
        "pass --encoding latin-1 (or cp1252, ...), or in federation.yaml write data as {csv: {path: ..., "
        "encoding: latin-1}}")
    assert main(["contract", "check", str(csv), "--contract", str(tmp_path / "parquet.yaml"),
                 "--encoding", "latin-1"]) == 1
    assert "the separator is probably ';'" in capsys.readouterr().err


def test_simulate_reads_a_european_export_as_its_parquet_twin(tmp_path, capsys) -> None:
    import json

    from tests.conftest import mixed_table

    table = mixed_table(300, seed=2).round(3).astype({"cat_pd": "str"})
    days = pd.Timestamp("2020-01-01") + pd.to_timedelta(np.arange(300), unit="D")
    table["opened"] = [d.date() for d in days]
    table.to_parquet(tmp_path / "twin.parquet")
    table.to_csv(tmp_path / "export.csv", sep=";", decimal=",", encoding="latin-1", index=False)
    results = []
    for data, extra in (("twin.parquet", []), ("export.csv", ["--sep", ";", "--decimal", ",",
                                                               "--encoding", "latin-1"])):
        argv = ["simulate", "--data", str(tmp_path / data), "--label", "target", "--parties", "2", "--trees",
                "4", "--max-depth", "4", "--seed", "3", "--json", *extra]
        assert main(argv) == 0
        results.append(json.loads(capsys.readouterr().out))
    assert results[1]["metrics"] == results[0]["metrics"] and results[0]["single_party_identical"] is True
    assert [d["column"] for d in results[1]["columns"]["dates"]] == ["opened"]
