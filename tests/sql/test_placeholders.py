"""A batch query's `:name` placeholders: none in comments, quotes or dollar-quoted strings; numbered in order.

A `:since` written in a `-- comment`, a nested `/* comment */`, a `$$`/`$tag$` string or an `E'...'` string
is text the server keeps as written, never a value the agent binds (`fedcore.data.sql_text`).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd
import pytest

from fedcore.data.sql import SqlSource, parse_sql, read_sql
from fedcore.data.sql_text import numbered, placeholders
from tests.postgres import load_table

SINCE = datetime(2026, 3, 1, tzinfo=UTC)
UNTIL = datetime(2026, 3, 3, tzinfo=UTC)


@pytest.mark.parametrize("hidden", [
    "-- rows after :until\n",
    "/* rows after :until */",
    "/* outer /* nested :since */ still a comment :until */",
    "$$ :until $$",
    "$body$ :until $ $$ :since $body$",
    "E'it\\'s :until'",
    "':until'",
    '":until"',
    "x::until",
])
def test_a_placeholder_hidden_in_sql_text_is_not_one(hidden: str) -> None:
    query = f"SELECT {hidden} FROM t WHERE a > :since"
    assert placeholders(query) == ("since",)
    assert numbered(query, ("since",)) == f"SELECT {hidden} FROM t WHERE a > $1"


def test_placeholders_after_comments_and_dollar_quotes_keep_their_numbers() -> None:
    query = ("SELECT $f$ :since $f$, a$b$c /* :x /* :y */ */ FROM t -- :z\n"
             "WHERE u <= :until AND t > :since AND $1$ = 0 AND v <= :until")
    assert placeholders(query) == ("until", "since")
    assert numbered(query, ("until", "since")) == (
        "SELECT $f$ :since $f$, a$b$c /* :x /* :y */ */ FROM t -- :z\n"
        "WHERE u <= $1 AND t > $2 AND $1$ = 0 AND v <= $1")
    assert placeholders("SELECT 1 /* :since never closed") == ()
    assert placeholders("SELECT $$ :since") == ()


@pytest.mark.postgres
def test_only_the_placeholder_outside_comments_and_dollar_quotes_is_bound_by_the_server(database) -> None:
    times = pd.to_datetime(["2026-02-28T12:00:00Z", "2026-03-02T00:00:00Z", "2026-03-04T00:00:00Z"])
    load_table(database, "new_customers", pd.DataFrame({"id": ["a", "b", "c"], "signup_at": times}))
    query = ("SELECT id, $$ :since $$ AS dollar, $tag$ :until $tag$ AS tagged, E'\\':until' AS escaped\n"
             "FROM new_customers -- only those after :until\n"
             "/* the window: /* nested */ :since < signup_at <= :until */\n"
             "WHERE signup_at > :since AND signup_at <= :until ORDER BY id")
    source = parse_sql({"sql": {"url": {"env": "DB"}, "query": query, "since": SINCE.isoformat()}},
                       "predict_data", str, parameters=("since", "until"))
    assert source.parameters == ("since", "until")
    rows = read_sql(SqlSource(("url", database), query=query, parameters=source.parameters), "test",
                    values={"since": SINCE, "until": UNTIL})
    assert rows.to_dict("records") == [
        {"id": "b", "dollar": " :since ", "tagged": " :until ", "escaped": "':until"}]
