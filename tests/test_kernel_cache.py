"""One numba kernel cache for every entry point: fedcore sets NUMBA_CACHE_DIR unless the user did."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fedcore

REPO = Path(__file__).resolve().parents[1]


def _cache_dir_seen(env: dict[str, str]) -> str:
    code = "import fedcore, numba.core.config as c; print(c.CACHE_DIR)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                          cwd="/").stdout.strip()


def test_every_entry_point_gets_the_checkout_cache_unless_the_user_chose_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    assert fedcore.default_numba_cache() == REPO / ".numba_cache"  # the tests run from a writable checkout
    assert _cache_dir_seen(env) == str(REPO / ".numba_cache")  # numba reads it: fedcore is imported first
    assert _cache_dir_seen({**env, "NUMBA_CACHE_DIR": str(tmp_path)}) == str(tmp_path)


def test_an_installed_package_uses_the_users_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(fedcore, "__file__", str(tmp_path / "site-packages" / "fedcore" / "__init__.py"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert fedcore.default_numba_cache() == tmp_path / "cache" / "fedforest" / "numba"


def test_the_warm_up_runs_every_engine_mode():
    from fedcore.warmup import warm_up

    assert warm_up() == ["vertical classification", "vertical regression", "horizontal extra-trees none",
                         "horizontal extra-trees gdp", "horizontal extra-trees ldp",
                         "horizontal extra-trees regression", "horizontal ppd-ert"]
