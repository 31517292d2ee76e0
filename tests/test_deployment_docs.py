"""What deployments/README.md tells an operator to run works.

The template config parses (and names the trusted key), the worked contract step drafts a contract the
data then passes, and the walk-through's steps 2 to 5 (certificates, keys, data, contracts, federation.yaml),
run as written in an empty folder, make a federation of the reader's names that `fedforest deploy` would
deploy. tests/e2e/test_deployments.py runs its `weekly_report` flow against a real Prefect server.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
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


def _walk_through() -> str:
    readme = (DEPLOYMENTS / "README.md").read_text()
    start = readme.index("## Walk-through")
    return readme[start:readme.index("\n## ", start + 1)]


def _contract_commands(text: str) -> tuple[str, str]:
    found = re.search(r"fedforest (contract infer .*?)\n\s*fedforest (contract check .*?)\n",
                      text.replace("\\\n", ""), re.S)
    assert found, "the worked contract step is in deployments/README.md"
    return found.group(1), found.group(2)


def test_the_worked_contract_step_runs_as_written(tmp_path, monkeypatch, capsys):
    infer, check = _contract_commands((DEPLOYMENTS / "README.md").read_text())
    words = infer.split()
    sample, out = tmp_path / words[2], words[words.index("--out") + 1]
    label = words[words.index("--label") + 1]
    rng = np.random.default_rng(0)
    sample.parent.mkdir(parents=True)
    pd.DataFrame({"customer_id": [f"C{i}" for i in range(200)], "age": rng.integers(18, 90, 200),
                  "balance": rng.normal(1000, 300, 200),
                  label: rng.integers(0, 2, 200)}).to_parquet(sample)
    (tmp_path / "contracts").mkdir()
    monkeypatch.chdir(tmp_path)
    for command in (infer, check):
        assert main(command.split()) == 0, capsys.readouterr().err
    assert label in (tmp_path / out).read_text()


def test_the_walk_through_makes_a_federation_of_the_readers_names_in_an_empty_folder(tmp_path, monkeypatch,
                                                                                        capsys):
    """Steps 2 to 5 as written: certificates, keys, the sample data split, contracts and federation.yaml."""
    from flows.deployments import deploy_settings, planned_deployments

    text = _walk_through()
    monkeypatch.chdir(tmp_path)
    commands = re.findall(r"^\s+fedforest ((?:certs|models keygen|sample-table) .*)$", text, re.M)
    assert len(commands) == 7, commands
    for command in commands:
        assert main(command.split()) == 0, (command, capsys.readouterr().err)
    split = re.search(r"python - <<'PY'\n(.*?)\n\s*PY\n", text, re.S)
    assert split, "the walk-through splits the sample table"
    done = subprocess.run([sys.executable, "-"], input=textwrap.dedent(split.group(1)), text=True,
                          capture_output=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    infer, _ = _contract_commands(text)  # checking a table against it: the test above
    names = sorted(p.name for p in (tmp_path / "data").iterdir())
    (tmp_path / "contracts").mkdir()
    for name in names:  # the lender's as written, "the telco and the grocer likewise, without --label"
        words = infer.replace("lender", name).split()
        if name != "lender":
            del words[words.index("--label"):words.index("--label") + 2]
        assert main(words) == 0, (words, capsys.readouterr().err)
    config_text = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert config_text, "the walk-through shows federation.yaml"
    (tmp_path / "federation.yaml").write_text(textwrap.dedent(config_text.group(1)))
    config = load_config(tmp_path / "federation.yaml")
    institutions = [i.name for i in config.institutions]
    assert sorted(institutions) == names  # the folders the split made
    assert not {"bank", "ecommerce", "insurer"} & set(institutions), "names of the reader's choosing"
    named = [config.master_public_key, config.master_signing_key, *config.tls.values(),
             *(path for i in config.institutions for path in (i.contract, i.cert, i.key))]
    assert [p for p in named if not p.exists()] == []
    assert [i.name for i in config.institutions if not Path(i.data).exists()
            or not Path(str(i.predict_data)).exists()] == []
    # what step 6 deploys from it
    plan = planned_deployments(config, deploy_settings(config))
    assert [p.full_name for p in plan] == [*(f"institution-agent/{n}" for n in institutions),
                                           "retrain/weekly", "batch-predict/on-demand"]
    assert plan[-2].schedule.describe() == "0 3 * * 1 (Europe/Zurich)"
    assert plan[-2].env == {"PREFECT_LOCAL_STORAGE_PATH": str(tmp_path / ".prefect-results")}


def test_the_callers_flow_triggers_retrain_weekly_and_reads_its_result() -> None:
    found = re.search(r"```python\n(.*?def weekly_report\(.*?)```", _walk_through(), re.S)
    assert found, "the walk-through shows a flow that calls run_deployment"
    code = textwrap.dedent(found.group(1))
    compile(code, "weekly_report.py", "exec")
    assert 'run_deployment("retrain/weekly"' in code and "run.state.result()" in code
