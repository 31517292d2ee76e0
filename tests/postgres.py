"""A throwaway PostgreSQL server for the tests that need one (marked `postgres`; tests/conftest.py shares it).

`initdb` + `pg_ctl` into a temporary folder, on a free port of 127.0.0.1, stopped at the end of the session.
As root the server runs as the `postgres` user (PostgreSQL refuses root). Without PostgreSQL a developer's
run skips these tests with one line saying how to get it; in CI (`CI` set, as `.ci/run` does) it fails.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

MISSING = (
    "PostgreSQL is not installed: apt-get install postgresql (Debian) to run the postgres tests")
PG_LIB = os.environ.get("FEDFOREST_TEST_PG_LIB", "/usr/lib/postgresql")
"""Where Debian installs PostgreSQL's versions (<version>/bin); the missing-server tests point it away."""


class ServerMissing(RuntimeError):
    """PostgreSQL's initdb/pg_ctl are not installed here."""


@dataclass(frozen=True)
class Server:
    """A running server: its superuser URL and a fresh database per test (`database`)."""

    port: int
    user: str

    def url(self, database: str = "postgres", user: str | None = None, password: str | None = None) -> str:
        """A libpq URL to `database` as `user` (default: the superuser)."""
        auth = f"{user or self.user}" + (f":{password}" if password else "")
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}"

    def execute(self, sql: str, database: str = "postgres") -> list[tuple]:
        """Run `sql` as the superuser (autocommit); the rows of its last statement."""
        import adbc_driver_postgresql.dbapi as pg

        with pg.connect(self.url(database), autocommit=True) as conn, conn.cursor() as cursor:
            cursor.execute(sql)
            return list(cursor.fetchall()) if cursor.description else []


def _binary(name: str) -> str | None:
    """`name` on PATH, else in Debian's /usr/lib/postgresql/<version>/bin (newest version)."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"{PG_LIB}/*/bin/{name}"),
                      key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    return versions[-1] if versions else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run(command: list[str], as_postgres: bool) -> None:
    """Run a server command (as the `postgres` user when we are root); its output in the error if it fails."""
    if as_postgres:
        command = ["runuser", "-u", "postgres", "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stdout}{done.stderr}")


@contextmanager
def throwaway_server() -> Iterator[Server]:
    """A PostgreSQL server in a temporary folder (trust authentication on 127.0.0.1 only), stopped after.

    Raises `ServerMissing` when initdb/pg_ctl are not installed. Also used by benchmarks/bench_sql.py.
    """
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        raise ServerMissing(MISSING)
    as_postgres = os.geteuid() == 0
    root = Path(tempfile.mkdtemp(prefix="fedforest-pg-"))
    data, sockets = root / "data", root / "sockets"
    sockets.mkdir()
    if as_postgres:
        shutil.chown(root, "postgres")
        shutil.chown(sockets, "postgres")
    port = _free_port()
    try:
        _run([initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync",
              "--no-locale"], as_postgres)
        _run([pg_ctl, "-D", str(data), "-l", str(root / "server.log"), "-w", "-o",
              f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off", "start"], as_postgres)
        yield Server(port=port, user="postgres")
    finally:
        if (data / "postmaster.pid").exists():
            _run([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"], as_postgres)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Server]:
    """A PostgreSQL server for the whole session (`throwaway_server`)."""
    try:
        with throwaway_server() as server:
            yield server
    except ServerMissing as missing:
        if os.environ.get("CI"):
            pytest.fail(str(missing))
        pytest.skip(str(missing))


@pytest.fixture
def database(postgres: Server, request: pytest.FixtureRequest) -> Iterator[str]:
    """A new empty database for one test; its superuser URL."""
    name = "t_" + "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:55]
    postgres.execute(f'DROP DATABASE IF EXISTS "{name}"')
    postgres.execute(f'CREATE DATABASE "{name}"')
    yield postgres.url(name)
    postgres.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def load_table(url: str, name: str, frame) -> None:
    """Create table `name` in the database at `url` with `frame`'s rows (ADBC ingestion, as Arrow)."""
    import adbc_driver_postgresql.dbapi as pg
    import pyarrow as pa

    with pg.connect(url) as conn:
        with conn.cursor() as cursor:
            cursor.adbc_ingest(name, pa.Table.from_pandas(frame, preserve_index=False), mode="create")
        conn.commit()
