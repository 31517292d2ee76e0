"""One numba kernel cache for every entry point: fedcore sets NUMBA_CACHE_DIR unless the user did."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import fedcore

REPO = Path(__file__).resolve().parents[1]
MODES = ["vertical classification", "vertical regression",
         "horizontal extra-trees none", "horizontal extra-trees gdp", "horizontal extra-trees ldp",
         "horizontal extra-trees regression", "horizontal ppd-ert", "vertical boosting",
         "horizontal boosting", "vertical forest on dask"]


def _cache_dir_seen(env: dict[str, str]) -> str:
    code = "import fedcore, numba.core.config as c; print(c.CACHE_DIR)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                          cwd="/").stdout.strip()


def test_every_entry_point_gets_the_checkout_cache_unless_the_user_chose_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    stamped = REPO / ".numba_cache" / fedcore.source_stamp()
    assert fedcore.default_numba_cache() == stamped  # the tests run from a writable checkout
    assert _cache_dir_seen(env) == str(stamped)  # numba reads it: fedcore is imported first
    assert _cache_dir_seen({**env, "NUMBA_CACHE_DIR": str(tmp_path)}) == str(tmp_path)


def test_an_installed_package_uses_the_users_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(fedcore, "__file__", str(tmp_path / "site-packages" / "fedcore" / "__init__.py"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert fedcore.cache_root() == tmp_path / "cache" / "fedforest" / "numba"


def test_any_change_of_a_source_file_starts_a_new_cache_and_removes_the_old(tmp_path):
    """Numba keeps the compiled callee of another module in a kernel: the cache follows all the sources."""
    package = tmp_path / "package"
    (package / "trees").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    kernel = package / "trees" / "kernels.py"
    kernel.write_text("X = 1\n")
    first = fedcore.source_stamp(package)
    os.utime(kernel, ns=(kernel.stat().st_atime_ns, kernel.stat().st_mtime_ns + 10**9))
    assert fedcore.source_stamp(package) == first  # touched, not changed (a fresh checkout)
    kernel.write_text("X = 2\n")
    second = fedcore.source_stamp(package)
    assert second != first
    root = tmp_path / "cache"
    fedcore.prune_other_caches(root / first)
    (root / first / "index.nbi").write_text("old kernels")
    (root / "loose.nbi").write_text("an unstamped cache's")
    fedcore.prune_other_caches(root / first)  # the same source again: nothing removed
    assert (root / first / "index.nbi").exists()
    fedcore.prune_other_caches(root / second)
    assert [p.name for p in root.iterdir()] == [second] and not any((root / second).iterdir())


def test_the_warm_up_runs_every_engine_mode_and_reports_each_as_it_compiles():
    from fedcore.warmup import warm_up

    reports: list[tuple[int, int, str, float | None]] = []
    assert warm_up(lambda *report: reports.append(report)) == MODES
    assert [r[:3] for r in reports] == [(i, 10, mode) for i, mode in enumerate(MODES, start=1) for _ in "se"]
    assert [r[3] is None for r in reports] == [True, False] * 10  # the name as it starts, then its time
    assert all(r[3] >= 0 for r in reports[1::2])


def test_the_warm_up_splits_the_modes_into_two_groups_each_once_in_order():
    from fedcore.warmup import setting_groups

    vertical, horizontal = setting_groups(MODES)
    assert vertical == ("vertical classification", "vertical regression", "vertical boosting")
    horizontal_modes = tuple(mode for mode in MODES if mode.startswith("horizontal"))
    assert horizontal == (*horizontal_modes, "vertical forest on dask")
    assert sorted(vertical + horizontal) == sorted(MODES)


def test_the_warm_up_command_says_what_it_compiles_and_how_long_it_takes(capfd, monkeypatch):
    from fedcore import warmup

    monkeypatch.setattr(warmup, "warm_processes", lambda: 1)
    assert warmup.main() == 0
    lines = capfd.readouterr().err.splitlines()
    assert lines[0].startswith("fedforest: compiling the numba kernels into ")
    assert ("one after another (the first time only: about 2 minutes on two cores; seconds once cached)"
            in lines[0])
    assert [line.split(" ...")[0] for line in lines[1:-1]] == [
        f"fedforest: [{i}/10] {mode}" for i, mode in enumerate(MODES, start=1)]
    assert all(re.fullmatch(r".* \.\.\. \d+ s", line) for line in lines[1:-1])
    assert re.fullmatch(r"fedforest: kernels ready for 10 engine modes in \d+ s", lines[-1])


def test_on_two_cores_the_warm_up_compiles_the_two_settings_in_two_processes_side_by_side(capfd, monkeypatch):
    """Each process writes a whole line per mode when it is done: the settings interleave, each in order."""
    from fedcore import warmup

    monkeypatch.setattr(warmup, "warm_processes", lambda: 2)
    assert warmup.main() == 0
    lines = capfd.readouterr().err.splitlines()
    assert "the vertical and the horizontal modes side by side (the first time only" in lines[0]
    assert all(re.fullmatch(r"fedforest: \[\d+/10\] [a-z -]+ \.\.\. \d+ s", line) for line in lines[1:-1])
    steps = [line.split(" ...")[0] for line in lines[1:-1]]
    expected = [f"fedforest: [{i}/10] {mode}" for i, mode in enumerate(MODES, start=1)]
    assert sorted(steps) == sorted(expected)
    for group in warmup.setting_groups(MODES):  # each process runs its group's modes in the listed order
        assert ([s for s in steps if s.split("] ")[1] in group]
                == [s for s in expected if s.split("] ")[1] in group])
    assert re.fullmatch(r"fedforest: kernels ready for 10 engine modes in \d+ s", lines[-1])
