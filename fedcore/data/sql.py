"""Tables in a PostgreSQL database: a table or a query read into Arrow through ADBC, the connection secret.

The connection string comes from an environment variable or a file (`{env: BANK_DB_URL}`, `{file: path}`),
never from federation.yaml, and is masked in every error this module raises. Rows arrive as Arrow record
batches (ADBC's PostgreSQL driver reads the binary COPY format), never row by row in Python, and become the
pandas frame `pd.read_parquet` gives for the same Arrow table. A prediction batch's query may use `:since`
and `:until` (`BATCH_PARAMETERS`): the agent binds their values (`fedcore.agents.batches`), ADBC sends them
as query parameters ($1, $2), never as SQL text.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlsplit

import pandas as pd

from fedcore.data.batch_frame import GROUP_BYTES, returning_pool
from fedcore.data.sql_text import numbered, placeholders
from fedcore.errors import ConfigError, DataReadError

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?")
"""A table name a config may give: `name` or `schema.name` (letters, digits, underscores)."""
URL_KINDS = ("env", "file")
MISSING_TABLE = "42P01"
"""PostgreSQL's SQLSTATE for an undefined table."""


@dataclass(frozen=True)
class SqlSource:
    """Where rows live in a database: a table or a query, and where its connection string is kept.

    `url` is ("env", VARIABLE) or ("file", absolute path) in a config, or ("url", the string itself) for a
    command-line argument (then a secret: left out of its repr). A predictions sink is a source with a
    `table`.
    """

    url: tuple[str, str] = field(repr=False)
    table: str | None = None
    query: str | None = None
    parameters: tuple[str, ...] = ()
    """The query's placeholders (`:since`, `:until`) in the order `select` numbers them ($1, $2, ...)."""
    since: datetime | None = None
    """`:since` of the first batch (`sql.since`), before the agent has delivered any."""

    def describe(self) -> str:
        """What it names, without the connection string: `table 'customers'` or `a query`."""
        return f"table {self.table!r}" if self.table else "a query"

    def connection_ref(self) -> str:
        """Where the connection string is kept, as a person would look for it (never the string itself)."""
        kind, value = self.url
        return {"env": f"environment variable {value}", "file": f"file {value!r}"}.get(kind, "the --data URL")

    def option(self, name: str) -> str:
        """Where a user sets `name` (table, query): `sql.<name>` in the config, `--<name>` with --data."""
        return f"--{name}" if self.url[0] == "url" else f"sql.{name}"

    def select(self, order_by: str | None = None) -> str:
        """The statement that reads it, in `order_by`'s order if given.

        A table's name is quoted as identifiers; a query's placeholders become $1, $2, ... (`bound` gives
        their values). Without ORDER BY PostgreSQL returns rows in whatever order its plan gives (a VACUUM
        or an UPDATE can change it), and the rows' order is part of a trained model: the agents read in the
        ID column's order.
        """
        if self.query is None:
            select = f"SELECT * FROM {quote_table(str(self.table))}"
        else:  # another `:name` (not from a config) stays as written
            select = numbered(self.query.strip().rstrip(";"), self.parameters)
        if order_by is None:
            return select
        return f"SELECT * FROM (\n{select}\n) AS source ORDER BY {quote_identifier(order_by)}"

    def bound(self, values: Mapping[str, datetime] | None) -> tuple[datetime, ...]:
        """The values of its placeholders, in `select`'s order (bound by the driver, never formatted in)."""
        return tuple((values or {})[name] for name in self.parameters)


BATCH_PARAMETERS = ("since", "until")
"""The placeholders a `predict_data` query may use: the agent binds them per scheduled batch."""


def quote_table(name: str) -> str:
    """`schema.table` as quoted identifiers (`"schema"."table"`); names were checked against IDENTIFIER."""
    return ".".join(f'"{part}"' for part in name.split("."))


def quote_identifier(name: str) -> str:
    """`name` as one quoted SQL identifier (a column name from a config: any text, quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'


def parse_sql(value: Any, where: str, resolve_file: Any, sink: bool = False,
              parameters: tuple[str, ...] = ()) -> SqlSource:
    """`{sql: {url: {env: VAR} | {file: path}, table: T}}` (or `query:` for a source), checked.

    `where` names the config entry in errors; `resolve_file` makes a `{file: path}` absolute. A connection
    string written into the config is refused: it would be a secret in federation.yaml. A query may use
    the placeholders `parameters` allows (`BATCH_PARAMETERS` for prediction batches; `:since` needs
    `since:`, the first batch's start).
    """
    body = value.get("sql") if isinstance(value, dict) and set(value) == {"sql"} else None
    if not isinstance(body, dict):
        raise ConfigError(f"{where}: expected a path or glob, or {{sql: {{url: {{env: VARIABLE}}, table: "
                          "name}}, or {{csv: {{path: files.csv, sep: ';'}}}}")
    allowed = ("url", "table") if sink else ("url", "table", "query") + (("since",) if parameters else ())
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}: unknown sql setting {unknown[0]!r}; known: {list(allowed)}")
    url = body.get("url")
    if not isinstance(url, dict) or len(url) != 1 or next(iter(url)) not in URL_KINDS:
        raise ConfigError(f"{where}: sql.url must be {{env: VARIABLE}} or {{file: path}}, never the "
                          "connection string itself")
    kind, ref = next(iter(url.items()))
    ref = str(resolve_file(ref)) if kind == "file" else str(ref)
    table, query = body.get("table"), body.get("query")
    if (table is None) == (query is None):
        raise ConfigError(f"{where}: sql needs 'table'" + ("" if sink else " or 'query' (one of them)"))
    if table is not None and not IDENTIFIER.fullmatch(str(table)):
        raise ConfigError(f"{where}: sql.table {table!r} is not a table name like 'customers' or "
                          "'bank.customers' (letters, digits, underscores)")
    used = placeholders(str(query)) if query is not None else ()
    unknown = [name for name in used if name not in parameters]
    if unknown:
        known = ", ".join(f":{p}" for p in parameters) or "none here (only predict_data binds :since, :until)"
        raise ConfigError(f"{where}: sql.query has an unknown placeholder :{unknown[0]}; known: {known}")
    since = _since(body.get("since"), where) if "since" in used or "since" in body else None
    if since is None and "since" in used:
        raise ConfigError(f"{where}: sql.query uses :since, so set sql.since, the start of the first batch "
                          "(e.g. since: '2026-01-01T00:00:00Z')")
    return SqlSource(url=(kind, ref), table=None if table is None else str(table),
                     query=None if query is None else str(query), parameters=used, since=since)


def _since(value: Any, where: str) -> datetime | None:
    """`sql.since` as a UTC timestamp (a YAML timestamp or an ISO 8601 string with a time zone)."""
    if value is None:
        return None
    stamp = timestamp(value)
    if stamp is None:
        raise ConfigError(f"{where}: sql.since {str(value)[:40]!r} is not a timestamp with a time zone, like "
                          "'2026-01-01T00:00:00Z'")
    return stamp


def timestamp(value: Any) -> datetime | None:
    """`value` (a datetime or an ISO 8601 string) as an aware UTC datetime; None unless it has a time zone."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        return None
    return value.astimezone(UTC)


def connection_string(source: SqlSource, what: str) -> str:
    """The connection string from where `source` keeps it; an unset variable or unreadable file is refused."""
    kind, ref = source.url
    if kind == "url":
        return ref
    if kind == "env":
        value = os.environ.get(ref, "").strip()
        if not value:
            raise ConfigError(f"{what}: environment variable {ref} is not set: export it with the database's "
                              "connection string (postgresql://user:password@host:port/database)")
        return value
    try:
        with open(ref) as handle:
            value = handle.read().strip()
    except OSError as error:
        raise ConfigError(f"{what}: cannot read the connection string file {ref!r}: "
                          f"{error.strerror or error}") from None
    if not value:
        raise ConfigError(f"{what}: the connection string file {ref!r} is empty: write the database's "
                          "connection string in it (postgresql://user:password@host:port/database)")
    return value


def mask(text: str, url: str) -> str:
    """`text` without the connection string or its password (a libpq error may repeat either)."""
    secrets = [url]
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    secrets += [password, unquote(password)] if password else []  # as written, and percent-decoded
    # key=value connection strings: a quoted value may hold spaces and escaped quotes
    for quoted, bare in re.findall(r"password\s*=\s*(?:'((?:[^'\\]|\\.)*)'|(\S+))", url):
        secrets += [quoted, re.sub(r"\\(.)", r"\1", quoted)] if quoted else [bare]
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def reason(error: BaseException, url: str) -> str:
    """An ADBC error's message as one masked line, without the driver's `IO: [libpq]` prefixes."""
    text = " ".join(str(error).split())
    text = re.sub(r"^[A-Z_]+: (\[libpq\] )?", "", text)
    text = re.sub(r"^Failed to (prepare query|execute prepared statement|execute query): ", "", text)
    text = re.sub(r"^(PGRES_FATAL_ERROR )?(ERROR: )?", "", text)
    text = re.sub(r"( LINE \d+: .*| Query was: .*| ?\. SQLSTATE: \w+)$", "", text)
    return mask(text.strip(), url)


@contextmanager
def connect(source: SqlSource, what: str, url: str | None = None) -> Iterator[Any]:
    """An ADBC connection to `source`'s database; a failure to connect is one line naming where to fix it.

    `url`: the connection string when the caller already read it (read once per operation: a file
    rewritten meanwhile cannot give two).
    """
    import adbc_driver_manager
    import adbc_driver_postgresql.dbapi as pg

    url = url if url is not None else connection_string(source, what)
    try:
        conn = pg.connect(url)
    except adbc_driver_manager.Error as error:
        raise DataReadError(f"{what}: cannot connect to the database: {reason(error, url)}; correct the "
                            f"connection string in {source.connection_ref()} (server, port, database, user "
                            "and password)") from None
    try:
        yield conn
    finally:
        conn.close()


def read_arrow(source: SqlSource, what: str, order_by: str | None = None,
               values: Mapping[str, datetime] | None = None, statement: str | None = None,
               parameters: tuple = (), into: Callable[[Any], Any] | None = None) -> Any:
    """`source`'s rows as one Arrow table (record batches from the server, no Python loop over rows).

    In `order_by`'s order if given; `values`: its placeholders' values (`SqlSource.bound`), bound through
    ADBC's parameter binding. `statement` (with `parameters` bound as $1, $2, ...) reads instead of
    `source.select()` (a block's range of rows: `read_range`). `into`: what is made of the stream of record
    batches instead (`read_sql`: the frame, batch by batch).
    """
    import adbc_driver_manager

    url = connection_string(source, what)
    with connect(source, what, url) as conn:
        try:
            with conn.cursor() as cursor:
                if statement is None:
                    statement, parameters = source.select(order_by), source.bound(values)
                cursor.execute(statement, parameters or None)
                if into is not None:
                    return into(cursor.fetch_record_batch())
                return cursor.fetch_arrow_table()
        except adbc_driver_manager.Error as error:
            if source.table is not None and getattr(error, "sqlstate", None) == MISSING_TABLE:
                raise DataReadError(f"{what}: table {source.table!r} does not exist in the database of "
                                    f"{source.connection_ref()}: create it, or name the right table in "
                                    f"{source.option('table')}") from None
            fix = f"correct {source.option('table' if source.table is not None else 'query')}"
            raise DataReadError(f"{what}: cannot read {source.describe()}: {reason(error, url)}; "
                                f"{fix}") from None


def read_sql(source: SqlSource, what: str, order_by: str | None = None,
             values: Mapping[str, datetime] | None = None) -> pd.DataFrame:
    """`source`'s rows as the pandas frame `pd.read_parquet` gives for the same Arrow table.

    Made batch by batch as the rows arrive (`fedcore.data.batch_frame`; a pandas block per column): the
    read peaks near one copy of the values instead of the Arrow table and the frame side by side.
    """
    from fedcore.data.batch_frame import frame_of_batches

    def frame(reader: Any) -> pd.DataFrame:
        check_types(reader.schema, what)
        return frame_of_batches(reader, owned_batches)

    return read_arrow(source, what, order_by, values, into=frame)


def owned_batches(reader: Any) -> Any:
    """`reader`'s record batches as one Arrow table in memory that is handed back to the system per column.

    ADBC's batches arrive through Arrow's C data interface, where a batch's memory is released only with
    all of its columns, and Arrow's default allocator keeps freed memory for a while. So each batch is
    copied (a buffer per column) from a pool that returns freed memory at once (`returning_pool`) and let
    go as it arrives (the driver then reuses its memory for the next), and every GROUP_BYTES of copies are
    gathered into one chunk per column: converting a column then frees its memory.
    """
    import pyarrow as pa

    pool, chunks, pending, size = returning_pool(), [], [], 0
    for batch in reader:
        pending.append(_contiguous([batch], reader.schema, pool))
        size += pending[-1].nbytes
        del batch
        if size >= GROUP_BYTES:
            chunks.append(_contiguous(pending, reader.schema, pool))
            pending, size = [], 0
    if len(pending) > 1:
        pending = [_contiguous(pending, reader.schema, pool)]
    return pa.Table.from_batches([b for chunk in chunks + pending for b in chunk.to_batches()],
                                 schema=reader.schema)


def _contiguous(batches: list, schema: Any, pool: Any) -> Any:
    """Record batches or tables copied into one table of one chunk per column allocated from `pool`."""
    import pyarrow as pa

    table = pa.concat_tables(batches) if isinstance(batches[0], pa.Table) else pa.Table.from_batches(
        batches, schema=schema)
    return pa.table([pa.concat_arrays(column.chunks, memory_pool=pool) for column in table.columns],
                    schema=schema)


@dataclass(frozen=True)
class SqlBlock:
    """One block of a source's rows in `key`'s order, and how many rows it held when the blocks were cut.

    Its rows have key > `after` (None: from the first row) and key <= `upto` (None: to the last row). A Dask
    worker reads it with its own connection (`read_range`): the source names where the connection string is
    kept, never the string itself, so no secret travels in a task. `values`: the query's bound placeholders
    (a scheduled batch's `:since`, `:until`), $1, $2, ... before the range's own.
    """

    source: SqlSource
    key: str
    after: Any
    upto: Any
    n_rows: int
    values: tuple = ()


def sql_schema(source: SqlSource, what: str, values: Mapping[str, datetime] | None = None) -> Any:
    """The Arrow schema of `source`'s rows, asked of the server without reading a row.

    `values`: its placeholders' values. One lookup per operation: its callers pass the schema on.
    """
    return read_arrow(source, what, statement=f"SELECT * FROM (\n{source.select()}\n) AS source LIMIT 0",
                      parameters=source.bound(values)).schema


def key_blocks(source: SqlSource, what: str, key: str, block_rows: int,
               values: Mapping[str, datetime] | None = None,
               schema: Any = None) -> tuple[list[SqlBlock], Any]:
    """`source`'s rows cut into blocks of `block_rows` in `key`'s order, and the rows' Arrow schema.

    The server numbers the rows in key order and returns every `block_rows`-th key (the agent receives one
    key per block, never the rows); a null key is refused, since no range holds it. `values`: the query's
    placeholders' values; `schema`: the rows' schema when the caller asked for it already (`sql_schema`).
    """
    column = quote_identifier(key)
    select, bound = source.select(), source.bound(values)
    counted = read_arrow(source, what, statement=f"SELECT count(*) AS n, count({column}) AS keyed, "
                                                 f"count(DISTINCT {column}) AS keys "
                                                 f"FROM (\n{select}\n) AS source", parameters=bound)
    n, keyed, keys = (counted[c][0].as_py() for c in ("n", "keyed", "keys"))
    if keyed != n:
        raise DataReadError(f"{what}: {n - keyed} rows of {source.describe()} have no {key!r}: the rows are "
                            f"read in blocks of that column's order, so it may hold no null")
    if keys != keyed:
        raise DataReadError(f"{what}: {keyed - keys} rows of {source.describe()} repeat another row's "
                            f"{key!r}: the rows are read in blocks between two of its values, so each must "
                            "be unique")
    ends = read_arrow(source, what, statement=(
        f"SELECT key FROM (SELECT {column} AS key, row_number() OVER (ORDER BY {column}) AS n "
        f"FROM (\n{select}\n) AS source) AS numbered WHERE n % ${len(bound) + 1} = 0 ORDER BY n"),
        parameters=(*bound, block_rows))
    uppers = ends["key"].to_pylist()
    starts = [None, *uppers]
    blocks = [SqlBlock(source, key, after, upto, block_rows, bound)
              for after, upto in zip(starts, uppers, strict=False)]
    if n % block_rows:
        blocks.append(SqlBlock(source, key, starts[-1], None, n % block_rows, bound))
    schema = schema if schema is not None else sql_schema(source, what, values)
    check_types(schema, what)
    return blocks, schema


def read_range(block: SqlBlock, what: str, columns: list[str] | None = None) -> pd.DataFrame:
    """One block's rows (of `columns`, default all), in key order: what a Dask worker reads.

    Built batch by batch as `read_sql` builds a party's frame, so a worker holds one copy of the block.

    Refused if the block no longer holds the rows counted when the blocks were cut (the table changed).
    """
    source, column = block.source, quote_identifier(block.key)
    wanted = ", ".join(quote_identifier(c) for c in columns) if columns is not None else "*"
    conditions, values = [], list(block.values)
    for operator, value in ((">", block.after), ("<=", block.upto)):
        if value is not None:
            values.append(value)
            conditions.append(f"{column} {operator} ${len(values)}")
    where = " WHERE " + " AND ".join(conditions) if conditions else ""
    statement = f"SELECT {wanted} FROM (\n{source.select()}\n) AS source{where} ORDER BY {column}"
    from fedcore.data.batch_frame import frame_of_batches

    frame = read_arrow(source, what, statement=statement, parameters=tuple(values),
                       into=lambda reader: frame_of_batches(reader, owned_batches))
    if len(frame) != block.n_rows:
        raise DataReadError(f"{what}: {source.describe()} changed while it was read: a block holds "
                            f"{len(frame)} rows, not the {block.n_rows} counted when it was opened; "
                            "read from a table or snapshot that does not change during the run")
    return frame


def check_types(schema: Any, what: str) -> None:
    """Refuse a column ADBC can only hand over as opaque text (numeric, money, ...), naming the cast to use.

    Read as strings, a numeric column would become a categorical feature with one category per value.
    """
    for column in schema:
        kind = getattr(column.type, "type_name", None)
        if kind is not None:
            raise DataReadError(f"{what}: column {column.name!r} has PostgreSQL type {kind}, which is read "
                                f"as text: read it through sql.query with a cast, e.g. SELECT "
                                f"{column.name}::float8 AS {column.name}, ...")
