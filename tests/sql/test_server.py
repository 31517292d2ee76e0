"""The suite's throwaway PostgreSQL server answers, and each test gets its own empty database."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.postgres


def test_the_server_answers_and_each_test_has_its_own_empty_database(postgres, database) -> None:
    assert postgres.execute("SELECT 6 * 7") == [(42,)]
    name = database.rsplit("/", 1)[1]
    assert postgres.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'", name) == [(0,)]
    postgres.execute("CREATE TABLE t (x int)", name)
    assert postgres.execute("SELECT current_database()", name) == [(name,)]


@pytest.mark.parametrize("ci", [False, True])
def test_without_postgresql_a_developer_gets_one_line_and_ci_fails(tmp_path, ci) -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(PATH=str(tmp_path), FEDFOREST_TEST_PG_LIB=str(tmp_path), **({"CI": "1"} if ci else {}))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "answers",
                           "tests/sql/test_server.py"], env=env, cwd=root, capture_output=True, text=True,
                          timeout=300)
    line = "PostgreSQL is not installed: apt-get install postgresql (Debian) to run the postgres tests"
    lines = [x for x in done.stdout.splitlines() if line in x]
    if ci:
        assert done.returncode == 1 and "1 error" in done.stdout and lines, done.stdout
    else:
        assert done.returncode == 0 and "1 skipped" in done.stdout
        assert len(lines) == 1 and lines[0].startswith("SKIPPED [1] "), done.stdout
