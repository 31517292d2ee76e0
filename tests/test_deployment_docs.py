"""What deployments/README.md tells an operator to run works.

The template config parses (and names the trusted key), and the worked contract step drafts a contract the
data then passes.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from fedcore.cli import main
from fedcore.config import load_config

DEPLOYMENTS = Path(__file__).resolve().parents[1] / "deployments"


def test_the_template_config_parses_with_the_documented_keys():
    config = load_config(DEPLOYMENTS / "federation.example.yaml")
    assert [i.name for i in config.institutions] == ["bank", "insurer"] and config.label_holder.name == "bank"
    assert config.consortium_key == {"env": "FEDFOREST_CONSORTIUM_KEY"}
    assert config.master_public_key == DEPLOYMENTS / "keys" / "master.key.pub"


def test_the_worked_contract_step_runs_as_written(tmp_path, monkeypatch, capsys):
    readme = (DEPLOYMENTS / "README.md").read_text()
    infer = re.search(r"fedforest (contract infer .*?)\n\s*fedforest (contract check .*?)\n",
                      readme.replace("\\\n", ""), re.S)
    assert infer, "the worked contract step is in deployments/README.md"
    rng = np.random.default_rng(0)
    sample = tmp_path / "data" / "bank" / "train" / "part-0.parquet"
    sample.parent.mkdir(parents=True)
    pd.DataFrame({"customer_id": [f"C{i}" for i in range(200)], "age": rng.integers(18, 90, 200),
                  "balance": rng.normal(1000, 300, 200),
                  "responded": rng.integers(0, 2, 200)}).to_parquet(sample)
    (tmp_path / "contracts").mkdir()
    monkeypatch.chdir(tmp_path)
    for command in infer.groups():
        assert main(command.split()) == 0, capsys.readouterr().err
    assert "responded" in (tmp_path / "contracts" / "bank.yaml").read_text()
