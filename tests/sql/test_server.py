"""The suite's throwaway PostgreSQL server answers, and each test gets its own empty database."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.postgres


def test_the_server_answers_and_each_test_has_its_own_empty_database(postgres, database) -> None:
    assert postgres.execute("SELECT 6 * 7") == [(42,)]
    name = database.rsplit("/", 1)[1]
    assert postgres.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'", name) == [(0,)]
    postgres.execute("CREATE TABLE t (x int)", name)
    assert postgres.execute("SELECT current_database()", name) == [(name,)]
