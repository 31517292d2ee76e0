"""A database connection string is a secret: read from the environment or a file, masked in every error.

No server needed: these checks run before any connection.
"""

from __future__ import annotations

import pytest

from fedcore.data.sql import SqlSource, connection_string, mask, read_sql
from fedcore.errors import ConfigError


def test_a_password_is_masked_in_url_and_key_value_connection_strings() -> None:
    url = "postgresql://bank:s3cret@db.internal:5432/warehouse"
    assert mask(f"cannot reach {url} (bank:s3cret)", url) == "cannot reach *** (bank:***)"
    keywords = "host=db.internal user=bank password=s3cret dbname=warehouse"
    assert mask("connection to db.internal failed for password=s3cret", keywords) == \
        "connection to db.internal failed for password=***"


def test_quoted_and_percent_encoded_passwords_are_masked_whole() -> None:
    quoted = "host=db user=bank password='s3 cr\\'et' dbname=warehouse"
    masked = mask("auth failed for s3 cr'et (given as s3 cr\\'et)", quoted)
    assert masked == "auth failed for *** (given as ***)"
    encoded = "postgresql://bank:p%40ss@db.internal/warehouse"
    assert mask("password p@ss, or p%40ss, refused", encoded) == "password ***, or ***, refused"


def test_a_connection_string_file_that_is_missing_or_empty_is_one_line(tmp_path) -> None:
    missing = SqlSource(("file", str(tmp_path / "db-url")), table="customers")
    with pytest.raises(ConfigError) as refused:
        connection_string(missing, "institution 'bank'")
    assert str(refused.value) == (f"institution 'bank': cannot read the connection string file "
                                  f"'{tmp_path}/db-url': No such file or directory")
    (tmp_path / "db-url").write_text("\n")
    with pytest.raises(ConfigError) as refused:
        read_sql(missing, "institution 'bank'")
    assert str(refused.value) == (f"institution 'bank': the connection string file '{tmp_path}/db-url' is "
                                  "empty: write the database's connection string in it "
                                  "(postgresql://user:password@host:port/database)")


def test_a_source_never_shows_its_connection_string_in_its_repr() -> None:
    source = SqlSource(("url", "postgresql://bank:s3cret@db/warehouse"), table="customers")
    assert repr(source) == "SqlSource(table='customers', query=None, parameters=(), since=None)"
