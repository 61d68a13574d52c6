"""pypool.embedded against a real PostgreSQL: the cluster every other integration
test stands on must start, enforce SCRAM, survive restarts and clean up after itself."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from pypool.embedded import EmbeddedPostgres, find_pg_bindir, free_port

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def scratch_postgres() -> Iterator[EmbeddedPostgres]:
    """A cluster of this module's own, for tests that restart or crash it."""
    pg = EmbeddedPostgres()
    pg.start()
    yield pg
    pg.stop()


def test_find_pg_bindir_has_server_programs() -> None:
    bindir = find_pg_bindir()
    for program in ("initdb", "pg_ctl", "postgres", "pgbench"):
        assert os.access(os.path.join(bindir, program), os.X_OK), program


def test_find_pg_bindir_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = find_pg_bindir()
    monkeypatch.setenv("PYPOOL_PG_BINDIR", real)
    assert find_pg_bindir() == real
    monkeypatch.setenv("PYPOOL_PG_BINDIR", str(tmp_path))
    with pytest.raises(FileNotFoundError):
        find_pg_bindir()


def test_free_port_is_below_the_ephemeral_range() -> None:
    for _ in range(50):
        assert 15000 <= free_port() <= 32000


def test_starts_on_loopback_with_its_settings(postgres: EmbeddedPostgres) -> None:
    assert postgres.is_running
    assert postgres.host == "127.0.0.1"
    assert postgres.port < 32768
    with psycopg.connect(postgres.dsn(), connect_timeout=10) as conn:
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                (
                    [
                        "listen_addresses",
                        "port",
                        "fsync",
                        "max_connections",
                        "password_encryption",
                        "unix_socket_directories",
                    ],
                ),
            ).fetchall()
        )
        assert conn.info.server_version >= 130000
    assert settings == {
        "listen_addresses": "127.0.0.1",
        "port": str(postgres.port),
        "fsync": "off",
        "max_connections": "300",
        "password_encryption": "scram-sha-256",
        "unix_socket_directories": postgres.socket_dir,
    }
    assert os.path.exists(os.path.join(postgres.socket_dir, f".s.PGSQL.{postgres.port}"))
    assert "database system is ready to accept connections" in postgres.log()


def test_session_fixture_created_app_bench_and_admin(postgres: EmbeddedPostgres) -> None:
    with psycopg.connect(postgres.dsn("app", "app", "app-secret")) as conn:
        assert conn.execute("SELECT current_user, current_database()").fetchone() == (
            "app",
            "app",
        )
    with psycopg.connect(postgres.dsn("bench", "app", "app-secret")) as conn:
        assert conn.execute("SELECT count(*) FROM pgbench_accounts").fetchone() == (100000,)
    rows = postgres.execute(
        "SELECT rolname, rolsuper, rolcanlogin FROM pg_roles"
        " WHERE rolname IN ('app', 'pool_admin') ORDER BY rolname"
    )
    assert rows == [("app", False, True), ("pool_admin", True, True)]
    with psycopg.connect(postgres.dsn("postgres", "pool_admin", "admin-secret")) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_wrong_password_is_refused(postgres: EmbeddedPostgres) -> None:
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(postgres.dsn("app", "app", "not-the-password"), connect_timeout=10)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(postgres.dsn(password="wrong"), connect_timeout=10)


def test_no_password_is_refused_even_on_the_unix_socket(postgres: EmbeddedPostgres) -> None:
    # scram-sha-256 on every pg_hba line: no trust or peer shortcut anywhere
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(
            host=postgres.socket_dir,
            port=postgres.port,
            user=postgres.superuser,
            dbname="postgres",
            password="",
            connect_timeout=10,
        )


def test_server_asks_for_scram(postgres: EmbeddedPostgres) -> None:
    # libpq refuses any other method when told to require SCRAM
    dsn = postgres.dsn("app", "app", "app-secret") + "?require_auth=scram-sha-256"
    if psycopg.pq.version() < 160000:
        pytest.skip("require_auth needs libpq 16")
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_scram_verifier(postgres: EmbeddedPostgres) -> None:
    verifier = postgres.scram_verifier("app")
    assert verifier.startswith("SCRAM-SHA-256$")
    iterations_salt, keys = verifier.removeprefix("SCRAM-SHA-256$").split("$")
    assert iterations_salt.split(":")[0].isdigit()
    assert len(keys.split(":")) == 2
    with pytest.raises(KeyError):
        postgres.scram_verifier("no_such_role")


def test_create_role_quotes_names_and_passwords(scratch_postgres: EmbeddedPostgres) -> None:
    name, password = 'odd "Name"', "it's a \\ pass"
    scratch_postgres.create_role(name, password)
    assert scratch_postgres.scram_verifier(name).startswith("SCRAM-SHA-256$")
    with psycopg.connect(scratch_postgres.dsn(user=name, password=password)) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (name,)


def test_dsn_quotes_its_parts() -> None:
    pg = EmbeddedPostgres(port=15432, password="p@ss/w:rd")
    try:
        assert (
            pg.dsn("my db", "u@x") == "postgresql://u%40x:p%40ss%2Fw%3Ard@127.0.0.1:15432/my%20db"
        )
        assert pg.dsn() == "postgresql://postgres:p%40ss%2Fw%3Ard@127.0.0.1:15432/postgres"
    finally:
        pg.stop()  # never started: only removes the directory


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_restart_keeps_data_and_port(scratch_postgres: EmbeddedPostgres, mode: str) -> None:
    pg = scratch_postgres
    table = f"kept_{mode}"
    pg.execute(f"CREATE TABLE {table} (v int)")
    pg.execute(f"INSERT INTO {table} VALUES (1), (2)")
    port = pg.port
    held = psycopg.connect(pg.dsn(), autocommit=True)
    try:
        pg.restart(mode)  # type: ignore[arg-type]
        assert pg.is_running
        assert pg.port == port
        with pytest.raises(psycopg.OperationalError):
            held.execute("SELECT 1")  # connections from before the restart are gone
    finally:
        held.close()
    assert pg.execute(f"SELECT sum(v) FROM {table}") == [(3,)]


def test_context_manager_starts_stops_and_cleans_up() -> None:
    with EmbeddedPostgres() as pg:
        assert pg.is_running
        assert pg.execute("SELECT 1") == [(1,)]
        basedir = pg.basedir
    assert not pg.is_running
    assert not os.path.exists(basedir)
    with pytest.raises(RuntimeError):
        pg.start()


def test_given_basedir_is_kept() -> None:
    # not pytest's tmp_path: that is mode 0700, and as root the postgres OS user
    # running the server must be able to reach the directory
    with tempfile.TemporaryDirectory(prefix="pypool-test-") as parent:
        os.chmod(parent, 0o755)
        pg = EmbeddedPostgres(basedir=os.path.join(parent, "cluster"))
        pg.start()
        pg.execute("CREATE TABLE kept (v int)")
        pg.stop()
        assert os.path.exists(os.path.join(pg.datadir, "PG_VERSION"))
        pg.start()  # and it starts again from the same files
        try:
            assert pg.execute("SELECT count(*) FROM kept") == [(0,)]
        finally:
            pg.stop()


def test_pg_activity_counts_server_connections(
    postgres: EmbeddedPostgres, pg_activity: Callable[..., int]
) -> None:
    before = pg_activity(postgres, "app", "app")
    conns = [psycopg.connect(postgres.dsn("app", "app", "app-secret")) for _ in range(3)]
    try:
        assert pg_activity(postgres, "app", "app") == before + 3
        assert pg_activity(postgres, dbname="bench", usename="app") == 0
    finally:
        for conn in conns:
            conn.close()
