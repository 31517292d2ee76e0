"""README's "A short tour", run top to bottom as written, in an empty folder, as a new user would.

Every command exits 0 and does what its comment says. Each command runs as its own process with the user's
environment minus any Prefect home or server, so the demos and the tour's runs share the federation's own
`.prefect` (as the README says).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
README = Path(__file__).resolve().parents[1] / "README.md"
FEDFOREST = Path(sys.executable).parent / "fedforest"


def tour_commands() -> list[list[str]]:
    """The tour's commands: its first bash block, continuation lines joined, comments dropped."""
    section = README.read_text().split("## A short tour", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands = [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines()]
    return [command for command in commands if command]


def test_the_tour_reads_as_commands_of_this_checkout() -> None:
    commands = tour_commands()
    assert len(commands) >= 8 and all(c[0] == ".venv/bin/fedforest" for c in commands)
    assert commands[0][1] == "demo" and any(c[1] == "sample-table" for c in commands)


def test_the_tour_works_as_written(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_HOME", "PREFECT_API_URL")}
    said = []
    for command in tour_commands():
        done = subprocess.run([str(FEDFOREST), *command[1:]], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{shlex.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}"
        said.append((command, done.stdout))
    by_step = {" ".join(command[1:3]): stdout for command, stdout in said}
    retrained = json.loads(by_step["retrain --config"])
    assert retrained["version"] == "v0002" and retrained["promoted"]  # "again: a new version"
    assert json.loads(by_step["predict --config"])["version"] == "v0001"  # the version asked for, no training
    assert "v0001" in by_step["models list"] and "promote  production  v0002" in by_step["models list"]
    shown = [out for command, out in said if command[1:3] == ["models", "show"]]
    assert "importance_share" in shown[0] and "importances of" not in shown[0]  # the master: shares only
    assert "importances of this institution's own features (they never left it)" in shown[1]  # ecommerce
    regression = json.loads(next(out for command, out in said if "--json" in command))
    assert regression["task"] == "regression" and regression["single_party_identical"] is True
    assert by_step["models export"].startswith("readmission v0001: wrote work/readmission.onnx (onnx;")
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["customers.csv", "demo", "demo-boosting",
                                                                     "demo-ppd-ert", "pictures",
                                                                     "readmission.onnx"]
    runs = tmp_path / "work" / "demo" / ".prefect"
    assert runs.is_dir() and any(runs.iterdir())  # the tour's runs are where the demo's UI hint looks
