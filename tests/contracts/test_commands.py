"""`fedforest contract infer` then `check`, run in-process.

The draft round trip, exit codes and one-line errors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedcore.cli import main
from fedcore.contracts.model import load_contract
from tests.conftest import mixed_table


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    table = mixed_table(200)
    table.insert(0, "customer_id", np.arange(len(table)))
    path = tmp_path / "bank.parquet"
    table.to_parquet(path)
    return path


def test_infer_then_check_round_trip(capsys, sample: Path, tmp_path: Path) -> None:
    contract_path = tmp_path / "contracts" / "bank.yaml"
    code, out, err = _run(capsys, "contract", "infer", sample, "--label", "target", "--out", contract_path)
    assert (code, err) == (0, "")
    assert "review it before use" in out
    contract = load_contract(contract_path)
    assert (contract.name, contract.id_column, contract.label.column) == ("bank", "customer_id", "target")

    code, out, err = _run(capsys, "contract", "check", sample, "--contract", contract_path,
                          "--institution", "bank")
    assert (code, err) == (0, "")
    rows = out.splitlines()[3:]
    assert out.startswith(f"contract 'bank' version 1, institution 'bank': all {len(rows)} expectations met")
    assert all(row.startswith("ok ") for row in rows)

    broken = sample.with_name("broken.csv")
    table = mixed_table(200).assign(customer_id=np.arange(200))
    table.loc[[3, 8], "cat_str"] = "purple"
    table.to_csv(broken, index=False)
    code, out, err = _run(capsys, "contract", "check", broken, "--contract", contract_path,
                          "--institution", "shop")
    assert code == 1
    assert "FAIL    cat_str" in out
    assert err == ("fedforest: error: institution 'shop', column 'cat_str': "
                   "expect_column_values_to_be_in_set(in ['azure', 'crimson', 'emerald', 'onyx']) failed: 2 "
                   "unexpected values, e.g. ['purple']\n")


def test_infer_prints_to_stdout_and_refuses_to_overwrite(capsys, sample: Path, tmp_path: Path) -> None:
    code, out, _ = _run(capsys, "contract", "infer", sample, "--name", "retail", "--id", "customer_id")
    assert code == 0 and "# Data contract 'retail' version 1, drafted from bank.parquet (200 rows)." in out
    existing = tmp_path / "kept.yaml"
    existing.write_text("mine\n")
    code, out, err = _run(capsys, "contract", "infer", sample, "--out", existing)
    assert code == 1 and err == f"fedforest: error: {str(existing)!r} exists; pass --force to overwrite it\n"
    assert existing.read_text() == "mine\n"


def test_check_errors_are_one_line(capsys, sample: Path, tmp_path: Path) -> None:
    code, _, err = _run(capsys, "contract", "check", sample, "--contract", tmp_path / "none.yaml")
    assert code == 1 and err.startswith("fedforest: error: cannot read data contract")
    assert err.count("\n") == 1
    code, _, err = _run(capsys, "contract", "check", tmp_path / "no.csv", "--contract",
                        tmp_path / "none.yaml")
    assert code == 1 and err.count("\n") == 1
