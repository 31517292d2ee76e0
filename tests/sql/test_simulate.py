"""`fedforest simulate --data postgresql://... --table T` (or --query): one database table tried alone."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from sklearn.datasets import load_breast_cancer

from fedcore.cli import main
from tests.postgres import load_table

pytestmark = pytest.mark.postgres
ARGS = ("--label", "target", "--parties", "2", "--trees", "5", "--json")


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_table_or_query_simulates_as_the_same_rows_from_a_file(capsys, database, tmp_path) -> None:
    frame = load_breast_cancer(as_frame=True).frame.head(150)
    frame.columns = [c.replace(" ", "_") for c in frame.columns]
    load_table(database, "tumours", frame)
    frame.to_parquet(tmp_path / "tumours.parquet")
    results = []
    for source in (("--data", tmp_path / "tumours.parquet"), ("--data", database, "--table", "tumours"),
                   ("--data", database, "--query", "SELECT * FROM tumours")):
        code, out, err = _run(capsys, "simulate", *source, *ARGS)
        assert code == 0, err
        results.append(json.loads(out))
    for result in results[1:]:
        assert result["metrics"] == results[0]["metrics"]
        assert result["rows_train"] == results[0]["rows_train"] == 120


def test_a_database_url_needs_a_table_or_query_and_a_wrong_one_is_one_masked_line(capsys, postgres,
                                                                                   tmp_path) -> None:
    code, out, err = _run(capsys, "simulate", "--data", postgres.url(), *ARGS)
    assert (code, out, err) == (1, "", "fedforest: error: a PostgreSQL --data URL needs --table NAME or "
                                       "--query \"SELECT ...\"\n")
    pd.DataFrame({"x": [1]}).to_csv(tmp_path / "t.csv", index=False)
    code, out, err = _run(capsys, "simulate", "--data", tmp_path / "t.csv", "--table", "t", *ARGS)
    assert (code, err) == (1, "fedforest: error: --table and --query apply to a PostgreSQL --data URL "
                              "(postgresql://user@host/db), not a file\n")
    code, out, err = _run(capsys, "simulate", "--data", postgres.url(), "--table", "missing", *ARGS)
    assert (code, err) == (1, "fedforest: error: --data: table 'missing' does not exist in the database of "
                              "the --data URL: create it, or name the right table in --table\n")
    code, out, err = _run(capsys, "simulate", "--data", postgres.url(), "--query", "SELECT nothing", *ARGS)
    assert code == 1 and err.startswith("fedforest: error: --data: cannot read ") and \
        err.endswith("; correct --query\n")
    url = postgres.url("postgres", user="nobody", password="s3cret-pw")
    code, out, err = _run(capsys, "simulate", "--data", url, "--table", "missing", *ARGS)
    assert code == 1 and out == "" and err.count("\n") == 1 and "s3cret-pw" not in err
    assert err == ("fedforest: error: --data: cannot connect to the database: Failed to connect: connection "
                   f"to server at \"127.0.0.1\", port {postgres.port} failed: FATAL: role \"nobody\" does "
                   "not exist; correct the connection string in the --data URL (server, port, database, user "
                   "and password)\n")
