"""Replication connections through the pooler, against a real PostgreSQL and its own tools.

A client that logs in with `replication` set must reach a walsender of its own for its whole
session, whatever pool_mode says (the fixture's pooler runs transaction mode): the walsender
is asked for with the client's `replication` value, application_name and `options`, the
bytes in between are PostgreSQL's (CopyBoth streaming of pg_receivewal and pg_basebackup),
the server counts against pool_size, and it is closed, never pooled, when its client leaves.

Walsenders are counted in pg_stat_activity (backend_type = 'walsender'), PostgreSQL's own
view. The roles: `pool_admin` is a superuser (may replicate); `app` is not, so its
replication logins fail at the server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import psycopg.errors
import pytest

from pypool.embedded import EmbeddedPostgres
from tests.admin.console_client import console
from tests.conftest import ADMIN_PASSWORD, ADMIN_USER, PoolerFactory
from tests.integration.app_client import connect
from tests.integration.polling import sampling, wait_for
from tests.integration.tls_ca import Certificates, certs, tls_settings  # noqa: F401

pytestmark = pytest.mark.timeout(60)


def walsenders(postgres: EmbeddedPostgres, usename: str = ADMIN_USER) -> int:
    rows = postgres.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'"
        " AND usename = %s", params=(usename,))
    assert rows is not None
    return int(rows[0][0])


def backends(postgres: EmbeddedPostgres, dbname: str, usename: str = ADMIN_USER) -> int:
    rows = postgres.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
        " AND datname = %s AND usename = %s AND pid <> pg_backend_pid()",
        params=(dbname, usename))
    assert rows is not None
    return int(rows[0][0])


@pytest.fixture(autouse=True)
def no_walsenders_left(postgres: EmbeddedPostgres) -> Iterator[None]:
    """Each test starts and ends with no walsender of ours."""
    assert wait_for(lambda: walsenders(postgres) == 0, 10), "walsenders of an earlier test"
    yield
    assert wait_for(lambda: walsenders(postgres) == 0, 10), "a walsender outlived its client"


def replication(dsn: str, kind: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """A replication connection: `kind` "database" (logical) or "true" (physical)."""
    return connect(dsn, replication=kind, **kwargs)


def simple(conn: psycopg.Connection[Any], command: str) -> list[tuple[Any, ...]]:
    """Run `command` with the simple query protocol, which is all a walsender takes
    (a physical one types its SHOW column so that psycopg reads bytes: decoded here)."""
    rows = psycopg.ClientCursor(conn).execute(command).fetchall()
    return [tuple(v.decode() if isinstance(v, bytes) else v for v in row) for row in rows]


def tool(postgres: EmbeddedPostgres, name: str) -> str:
    return postgres.tool(name)


def with_replication_database(pooler: PoolerFactory, postgres: EmbeddedPostgres) -> Any:
    """A pooler whose [databases] has `replication`: the name pg_basebackup and
    pg_receivewal log into (libpq sends database=replication for physical replication).
    Its sockets get tiny buffers (tcp_socket_buffer = 4096, as PgBouncer's own suite sets):
    a replication stream must still flow at full speed through them."""
    server = f"host={postgres.host} port={postgres.port}"
    databases = {"app": f"{server} dbname=app", "replication": f"{server} dbname=replication"}
    return pooler(ini_overrides={"tcp_socket_buffer": "4096"}, databases=databases)


def test_logical_replication_client_gets_its_own_walsender(
        pooler: PoolerFactory, postgres: EmbeddedPostgres) -> None:
    p = pooler()
    dsn = p.dsn("app", ADMIN_USER, ADMIN_PASSWORD)
    # An `options` setting the pooler does not track: refused for an ordinary login, passed
    # on word for word for a replication one.
    options = "-c enable_seqscan=off -c extra_float_digits=3"
    with replication(dsn, "database", application_name="walreader",
                     options=options) as conn:
        system = simple(conn, "IDENTIFY_SYSTEM")
        assert len(system) == 1 and system[0][0].isdigit()  # systemid
        assert simple(conn, "SHOW application_name") == [("walreader",)]
        assert simple(conn, "SHOW enable_seqscan") == [("off",)]
        assert simple(conn, "SELECT 40 + 2") == [(42,)]  # a logical walsender takes SQL
        assert walsenders(postgres) == 1
        # Its server is its own: an ordinary client of the same pool gets another one.
        with connect(dsn) as plain:
            assert plain.execute("SELECT pg_backend_pid()").fetchone() != (
                conn.info.backend_pid,)
            assert plain.execute("SHOW enable_seqscan").fetchone() == ("on",)
        assert simple(conn, "IDENTIFY_SYSTEM")[0][0] == system[0][0]
    with pytest.raises(psycopg.OperationalError, match="unsupported startup parameter"):
        connect(dsn, options=options)


def test_physical_replication_client_takes_commands_not_sql(
        pooler: PoolerFactory, postgres: EmbeddedPostgres) -> None:
    p = pooler()
    dsn = p.dsn("app", ADMIN_USER, ADMIN_PASSWORD)
    with replication(dsn, "true", application_name="standby1") as conn:
        assert len(simple(conn, "IDENTIFY_SYSTEM")) == 1
        assert simple(conn, "SHOW application_name") == [("standby1",)]
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="WAL sender"):
            simple(conn, "SELECT 1")
        # No server_check_query, reset query or SET of the pooler's ever reached it.
        assert len(simple(conn, "IDENTIFY_SYSTEM")) == 1
    assert "could not set session parameters" not in p.log()


def test_pg_receivewal_streams_wal_through_the_pooler(
        pooler: PoolerFactory, postgres: EmbeddedPostgres, tmp_path: Path) -> None:
    p = with_replication_database(pooler, postgres)
    target = tmp_path / "wal"
    target.mkdir()
    dsn = p.dsn("postgres", ADMIN_USER, ADMIN_PASSWORD)
    proc = subprocess.Popen([tool(postgres, "pg_receivewal"), "--dbname", dsn,
                             "--directory", str(target), "--no-loop"],
                            stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: walsenders(postgres) == 1, 10), "no walsender"
        postgres.execute("SELECT pg_switch_wal()")  # a segment's end goes by the stream
        assert wait_for(lambda: any(target.iterdir()), 10), "no WAL received"
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err.decode()
    assert any(path.stat().st_size > 0 for path in target.iterdir())


def test_pg_basebackup_through_the_pooler(
        pooler: PoolerFactory, postgres: EmbeddedPostgres, tmp_path: Path) -> None:
    p = with_replication_database(pooler, postgres)
    target = tmp_path / "base"
    # -X stream: a second replication connection streams WAL beside the backup's.
    started = time.monotonic()
    done = subprocess.run([tool(postgres, "pg_basebackup"), "--dbname",
                           p.dsn("postgres", ADMIN_USER, ADMIN_PASSWORD),
                           "--pgdata", str(target), "--checkpoint=fast", "-X", "stream",
                           "--no-sync"], capture_output=True, timeout=50)
    assert done.returncode == 0, done.stderr.decode()
    assert time.monotonic() - started < 30  # tens of MB: seconds, not a delayed-ACK crawl
    assert (target / "PG_VERSION").exists()
    assert (target / "backup_label").exists()


def test_replication_servers_count_against_pool_size(
        pooler: PoolerFactory, postgres: EmbeddedPostgres) -> None:
    server = f"host={postgres.host} port={postgres.port}"
    p = pooler(databases={"app": f"{server} dbname=app pool_size=2"})
    dsn = p.dsn("app", ADMIN_USER, ADMIN_PASSWORD)
    errors: list[BaseException] = []

    def sleeper() -> None:
        try:
            with replication(dsn, "database") as conn:
                simple(conn, "SELECT pg_sleep(0.4)")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=sleeper) for _ in range(5)]
    started = time.monotonic()
    with sampling(lambda: walsenders(postgres)) as samples:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    elapsed = time.monotonic() - started
    assert not errors, errors
    assert max(samples) == 2  # never more than pool_size
    assert elapsed >= 1.2  # five sleeps, two at a time: three rounds
    # Closed with their clients, not kept idle for the next one.
    assert wait_for(lambda: walsenders(postgres) == 0, 5)
    with console(p) as admin:
        rows = admin.execute("SHOW SERVERS").fetchall()
    assert rows == []


def test_replication_client_evicts_an_idle_server_of_a_full_pool(
        pooler: PoolerFactory, postgres: EmbeddedPostgres) -> None:
    server = f"host={postgres.host} port={postgres.port}"
    p = pooler(databases={"app": f"{server} dbname=app pool_size=1"})
    dsn = p.dsn("app", ADMIN_USER, ADMIN_PASSWORD)
    with connect(dsn) as plain:
        plain.execute("SELECT 1")  # the pool's one server, idle from now on
    assert backends(postgres, "app") == 1
    with replication(dsn, "database") as conn:
        assert len(simple(conn, "IDENTIFY_SYSTEM")) == 1
        assert walsenders(postgres) == 1
        assert wait_for(lambda: backends(postgres, "app") == 0, 5)
    assert wait_for(lambda: "closing because: evicted" in p.log(), 5), p.log()


def test_failed_replication_login_fails_that_client_alone(
        pooler: PoolerFactory, postgres: EmbeddedPostgres) -> None:
    p = pooler()
    # Role `app` has no REPLICATION attribute: PostgreSQL refuses it a walsender.
    with pytest.raises(psycopg.OperationalError, match="login failed"):
        replication(p.dsn(), "database")
    log = p.log()
    assert "WAL sender" in log or "walsender" in log, log
    assert "closing because: login failed (age=" in log
    # Nothing is cached against the pool: an ordinary login goes on at once.
    with connect(p.dsn()) as plain:
        assert plain.execute("SELECT 1").fetchone() == (1,)


def test_console_shows_replication_connections(
        pooler: PoolerFactory, postgres: EmbeddedPostgres) -> None:
    p = pooler()
    dsn = p.dsn("app", ADMIN_USER, ADMIN_PASSWORD)
    with replication(dsn, "database") as logical, replication(dsn, "on") as physical, \
            connect(dsn) as plain, console(p) as admin:
        plain.execute("SELECT 1")
        simple(logical, "IDENTIFY_SYSTEM")
        simple(physical, "IDENTIFY_SYSTEM")
        clients = admin.execute("SHOW CLIENTS")
        names = [c.name for c in clients.description or []]
        kinds = sorted(row[names.index("replication")] for row in clients.fetchall()
                       if row[names.index("database")] == "app")
        assert kinds == ["logical", "none", "physical"]
        servers = admin.execute("SHOW SERVERS")
        names = [c.name for c in servers.description or []]
        rows = servers.fetchall()
        by_kind = {row[names.index("replication")]: row for row in rows}
        assert sorted(by_kind) == ["logical", "none", "physical"]
        assert by_kind["logical"][names.index("state")] == "active"
        # The walsender's own pid (the client's BackendKeyData carries the pooler's key).
        [(walsender_pid,)] = simple(logical, "SELECT pg_backend_pid()")
        assert by_kind["logical"][names.index("remote_pid")] == walsender_pid


def test_cancel_reaches_a_replication_clients_walsender(
        pooler: PoolerFactory, postgres: EmbeddedPostgres) -> None:
    p = pooler()
    with replication(p.dsn("app", ADMIN_USER, ADMIN_PASSWORD), "database") as conn:
        timer = threading.Timer(0.5, conn.cancel)
        timer.start()
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled):
            simple(conn, "SELECT pg_sleep(20)")
        assert time.monotonic() - started < 10
        timer.join()
        assert simple(conn, "SELECT 1") == [(1,)]


def test_invalid_replication_value_is_refused(pooler: PoolerFactory) -> None:
    p = pooler()
    with pytest.raises(psycopg.OperationalError, match='invalid value for parameter "replication"'):
        replication(p.dsn("app", ADMIN_USER, ADMIN_PASSWORD), "sometimes")


def test_reconnect_and_kill_end_replication_sessions_at_once(
        pooler: PoolerFactory, postgres: EmbeddedPostgres) -> None:
    p = pooler()
    dsn = p.dsn("app", ADMIN_USER, ADMIN_PASSWORD)
    # Never released, so never replaced at a release: closed now, by either command.
    for command in ("RECONNECT app", "KILL app"):
        with replication(dsn, "database") as conn, console(p) as admin:
            simple(conn, "IDENTIFY_SYSTEM")
            admin.execute(command)
            assert wait_for(lambda: walsenders(postgres) == 0, 5), command
            with pytest.raises(psycopg.OperationalError):
                simple(conn, "IDENTIFY_SYSTEM")
            if command.startswith("KILL"):
                admin.execute("RESUME app")  # KILL leaves the database paused
    with replication(dsn, "database") as conn:
        assert len(simple(conn, "IDENTIFY_SYSTEM")) == 1
    assert "Traceback" not in p.log(), p.log()
    assert wait_for(lambda: "closing because: database configuration changed" in p.log(), 5)


def test_replication_client_waits_for_a_busy_pool(
        pooler: PoolerFactory, postgres: EmbeddedPostgres) -> None:
    server = f"host={postgres.host} port={postgres.port}"
    p = pooler(databases={"app": f"{server} dbname=app pool_size=1"})
    dsn = p.dsn("app", ADMIN_USER, ADMIN_PASSWORD)
    with connect(dsn) as plain:
        plain.execute("BEGIN")
        plain.execute("SELECT 1")  # holds the pool's one server
        got: list[float] = []

        def replicate() -> None:
            with replication(dsn, "database") as conn:
                simple(conn, "IDENTIFY_SYSTEM")
                got.append(time.monotonic())

        waiter = threading.Thread(target=replicate)
        waiter.start()
        time.sleep(1.0)
        assert not got and walsenders(postgres) == 0  # no room: it waits
        released = time.monotonic()
        plain.execute("COMMIT")
        waiter.join(10)
    # Served soon after the release (the freed server, or the janitor evicting it;
    # test_replication_client_keeps_its_place_in_line checks which).
    assert got and got[0] - released < 1
    # The client's Terminate is its leaving, whichever socket is then seen closing first.
    assert wait_for(lambda: "closing because: replication client disconnected" in p.log(), 5)
    # Both clients said Terminate: the ordinary one and the replication one (whose close
    # would read "client closed the connection", or the server's, without the framing).
    assert wait_for(lambda: p.log().count("closing because: client sent Terminate") == 2,
                    5), p.log()[-2000:]


def test_replication_client_keeps_its_place_in_line(
        pooler: PoolerFactory, postgres: EmbeddedPostgres) -> None:
    """First come, first served: an ordinary client that asks after a waiting replication
    client does not take the server freed before it."""
    server = f"host={postgres.host} port={postgres.port}"
    p = pooler(databases={"app": f"{server} dbname=app pool_size=1"})
    dsn = p.dsn("app", ADMIN_USER, ADMIN_PASSWORD)
    order: list[str] = []

    def replicate() -> None:
        with replication(dsn, "database") as conn:
            simple(conn, "SELECT pg_sleep(0.5)")
            order.append("replication")

    def query() -> None:
        with connect(dsn) as conn:
            conn.execute("SELECT 1")
            order.append("ordinary")

    with connect(dsn) as holder:
        holder.execute("BEGIN")
        holder.execute("SELECT 1")
        first = threading.Thread(target=replicate)
        first.start()
        time.sleep(0.5)
        second = threading.Thread(target=query)
        second.start()
        time.sleep(0.5)
        holder.execute("COMMIT")
        first.join(10)
        second.join(10)
    assert order == ["replication", "ordinary"]


def test_pg_basebackup_over_client_tls(
        pooler: PoolerFactory, postgres: EmbeddedPostgres, tmp_path: Path,
        certs: Certificates) -> None:  # noqa: F811 - the fixture
    server = f"host={postgres.host} port={postgres.port}"
    p = pooler(ini_overrides=tls_settings(certs, "require"),
               databases={"replication": f"{server} dbname=replication"})
    target = tmp_path / "base"
    dsn = (f"host=localhost port={p.port} user={ADMIN_USER} password={ADMIN_PASSWORD}"
           f" sslmode=verify-full sslrootcert={certs.ca.root}")
    # Its own process group: with -X stream a child streams the WAL, and a hang must kill both.
    proc = subprocess.Popen([tool(postgres, "pg_basebackup"), "--dbname", dsn,
                             "--pgdata", str(target), "--checkpoint=fast", "-X", "stream",
                             "--no-sync", "--verbose"], stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=30)  # inside the test timeout: the state prints
    except subprocess.TimeoutExpired:
        # What each side was doing, for whoever reads the failure.
        senders = postgres.execute(
            "SELECT pid, state, wait_event, left(query, 60) FROM pg_stat_activity"
            " WHERE backend_type = 'walsender'")
        replication = postgres.execute(
            "SELECT pid, state, sent_lsn, write_lsn, flush_lsn FROM pg_stat_replication")
        with console(p) as admin:
            clients = admin.execute("SHOW CLIENTS").fetchall()
            servers = admin.execute("SHOW SERVERS").fetchall()
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"pg_basebackup hung; walsenders: {senders}; replication: {replication};"
                    f" clients: {clients}; servers: {servers}\n{err.decode()[-2000:]}\n"
                    f"{p.log()[-3000:]}")
    assert proc.returncode == 0, err.decode()
    assert (target / "PG_VERSION").exists()
    assert "replication=yes" in p.log() and "tls=TLSv1.3/" in p.log()
