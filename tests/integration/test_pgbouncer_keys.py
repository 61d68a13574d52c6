"""PgBouncer's per-database, per-user and client-cap keys against a real pypool and
PostgreSQL: max_db_client_connections and max_user_client_connections (global, [databases],
[users]), [users] pool_size and reserve_pool_size over [databases], [users] timeouts,
[databases] server_lifetime and `reserve_pool`, host lists with load_balance_hosts, and
auth_dbname."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from pypool.embedded import EmbeddedPostgres
from tests.conftest import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    APP_USER,
    Pooler,
    PoolerFactory,
    server_connections,
)
from tests.integration.app_client import connect
from tests.integration.polling import wait_for

pytestmark = pytest.mark.timeout(60)


def show(p: Pooler, what: str) -> list[dict[str, Any]]:
    with connect(p.dsn("pgbouncer", ADMIN_USER, ADMIN_PASSWORD)) as admin:
        cur = admin.execute(f"SHOW {what}")
        assert cur.description is not None
        names = [c.name for c in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def row(p: Pooler, what: str, name: str) -> dict[str, Any]:
    return next(r for r in show(p, what) if r["name"] == name)


def server(postgres: EmbeddedPostgres, **extra: str) -> str:
    tail = "".join(f" {key}={value}" for key, value in extra.items())
    return f"host={postgres.host} port={postgres.port} dbname=app{tail}"


# --- client caps -----------------------------------------------------------------------------


def test_a_database_client_cap_counts_logins_and_refuses_the_next(
    pooler: PoolerFactory, postgres: EmbeddedPostgres
) -> None:
    p = pooler(databases={"app": server(postgres, max_db_client_connections="2"),
                          "other": server(postgres)})
    first, second = connect(p.dsn()), connect(p.dsn())
    try:
        info = row(p, "DATABASES", "app")
        assert (info["current_client_connections"], info["max_client_connections"]) == (2, 2)
        with pytest.raises(psycopg.OperationalError,
                           match=r"client connections exceeded \(max_db_client_connections\)"):
            connect(p.dsn())
        with connect(p.dsn("other")) as conn:  # another database is not capped
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        first.close()
    # One left: there is room again.
    with connect(p.dsn()) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    second.close()
    assert wait_for(lambda: row(p, "DATABASES", "app")["current_client_connections"] == 0, 5)


def test_the_global_cap_set_live_and_the_console_stays_open_to_admins(
    pooler: PoolerFactory
) -> None:
    p = pooler()
    with connect(p.dsn("pgbouncer", ADMIN_USER, ADMIN_PASSWORD)) as admin:
        admin.execute("SET max_db_client_connections = 1")
        admin.execute("SET max_user_client_connections = 1")
        # The admin is the console's first client; a second admin session still gets in.
        with connect(p.dsn("pgbouncer", ADMIN_USER, ADMIN_PASSWORD)) as again:
            assert again.execute("SHOW VERSION").fetchone() is not None
        with connect(p.dsn()) as one:
            with pytest.raises(psycopg.OperationalError,
                               match=r"max_(db|user)_client_connections"):
                connect(p.dsn())
            assert one.execute("SELECT 1").fetchone() == (1,)


def test_a_user_cap_from_users_wins_over_the_global_one(pooler: PoolerFactory) -> None:
    p = pooler(ini_overrides={"max_user_client_connections": "1"},
               extra_sections=f"[users]\n{APP_USER} = max_user_client_connections=2\n")
    first, second = connect(p.dsn()), connect(p.dsn("postgres"))  # across databases
    try:
        info = next(r for r in show(p, "USERS") if r["name"] == APP_USER)
        assert (info["current_client_connections"], info["max_user_client_connections"]) == (
            2, 2)
        with pytest.raises(psycopg.OperationalError,
                           match=r"client connections exceeded \(max_user_client_connections\)"):
            connect(p.dsn())
    finally:
        first.close()
        second.close()


# --- sizes: [users] over [databases] -----------------------------------------------------------


def test_users_pool_size_wins_over_the_database_one(
    pooler: PoolerFactory, postgres: EmbeddedPostgres
) -> None:
    p = pooler(databases={"app": server(postgres, pool_size="3")},
               extra_sections=f"[users]\n{APP_USER} = pool_size=1 reserve_pool_size=0\n")
    user = next(r for r in show(p, "USERS") if r["name"] == APP_USER)
    assert (user["pool_size"], user["reserve_pool_size"]) == ("1", "0")
    holder = connect(p.dsn())
    holder.execute("BEGIN")
    holder.execute("SELECT 1")  # holds the pool's one server
    done: list[object] = []

    def wait_in_line() -> None:
        with connect(p.dsn()) as conn:
            done.append(conn.execute("SELECT 2").fetchone())

    waiter = threading.Thread(target=wait_in_line)
    waiter.start()
    try:
        def pool() -> dict[str, Any]:
            return next(r for r in show(p, "POOLS") if r["database"] == "app")
        assert wait_for(lambda: pool()["cl_waiting"] == 1, 5), pool()
        assert pool()["sv_active"] == 1 and server_connections(postgres) == 1
    finally:
        holder.execute("COMMIT")
        waiter.join(10)
        holder.close()
    assert done == [(2,)]


def test_reserve_pool_is_the_old_name_of_reserve_pool_size(
    pooler: PoolerFactory, postgres: EmbeddedPostgres
) -> None:
    p = pooler(databases={"app": server(postgres, pool_size="1", reserve_pool="2")})
    assert row(p, "DATABASES", "app")["reserve_pool_size"] == 2


# --- timeouts and lifetimes ------------------------------------------------------------------


def test_users_query_timeout_applies_to_that_user_only(pooler: PoolerFactory) -> None:
    p = pooler(extra_sections=f"[users]\n{APP_USER} = query_timeout=1\n")
    with connect(p.dsn()) as conn:
        with pytest.raises(psycopg.OperationalError, match="query timeout"):
            conn.execute("SELECT pg_sleep(3)")
    with connect(p.dsn("app", ADMIN_USER, ADMIN_PASSWORD)) as other:
        assert other.execute("SELECT pg_sleep(1.5), 1").fetchone() == ("", 1)


def test_users_idle_transaction_and_client_idle_timeouts(pooler: PoolerFactory) -> None:
    p = pooler(extra_sections=f"[users]\n{APP_USER} = idle_transaction_timeout=1\n"
                              f"{ADMIN_USER} = client_idle_timeout=1\n")
    with connect(p.dsn()) as conn:
        conn.execute("BEGIN")
        time.sleep(2.5)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    with connect(p.dsn("app", ADMIN_USER, ADMIN_PASSWORD)) as idle:
        time.sleep(2.5)
        with pytest.raises(psycopg.OperationalError):
            idle.execute("SELECT 1")
    assert "idle transaction timeout" in p.log()
    assert "client_idle_timeout" in p.log()


def test_a_databases_server_lifetime_zero_serves_once(
    pooler: PoolerFactory, postgres: EmbeddedPostgres
) -> None:
    p = pooler(databases={"app": server(postgres, server_lifetime="0")})
    pids = set()
    for _ in range(3):
        with connect(p.dsn()) as conn:
            pids.add(conn.execute("SELECT pg_backend_pid()").fetchone())
    assert len(pids) == 3
    assert row(p, "DATABASES", "app")["server_lifetime"] == 0


# --- host lists ---------------------------------------------------------------------------


def test_a_host_list_skips_a_host_that_does_not_resolve(
    pooler: PoolerFactory, postgres: EmbeddedPostgres
) -> None:
    p = pooler(databases={"app": f"host=no-such-host.invalid,{postgres.host} "
                                 f"port={postgres.port} dbname=app load_balance_hosts=disable"})
    with connect(p.dsn()) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    log = p.log()
    assert "closing because: server DNS lookup failed" in log
    assert f"@{postgres.host}:{postgres.port} new connection to server (from" in log
    assert row(p, "DATABASES", "app")["load_balance_hosts"] == "disable"


def test_round_robin_spreads_new_servers_over_the_list(
    pooler: PoolerFactory, postgres: EmbeddedPostgres
) -> None:
    # Two spellings of the same server: each new server goes to the next one.
    p = pooler(databases={"app": f"host=127.0.0.1,localhost port={postgres.port} dbname=app"})
    conns = [connect(p.dsn()) for _ in range(2)]
    try:
        for conn in conns:
            conn.execute("BEGIN")
            conn.execute("SELECT 1")
        servers = {r["addr"] for r in show(p, "SERVERS") if r["database"] == "app"}
        assert servers == {"127.0.0.1", "localhost"}
    finally:
        for conn in conns:
            conn.close()


# --- auth_dbname ------------------------------------------------------------------------------


def test_auth_dbname_runs_auth_query_through_another_entry(
    pooler: PoolerFactory, postgres: EmbeddedPostgres
) -> None:
    # APP_USER is not in the auth_file: auth_query, as ADMIN_USER, finds its verifier, over
    # the `authdb` entry's connection (the `app` entry names a port nothing listens on
    # for auth_query: only its servers would use it, and they use authdb's credentials).
    p = pooler(
        databases={"app": server(postgres), "authdb": f"host={postgres.host} "
                   f"port={postgres.port} dbname=postgres"},
        userlist={ADMIN_USER: ADMIN_PASSWORD},
        ini_overrides={"auth_user": ADMIN_USER, "auth_dbname": "authdb"},
    )
    with connect(p.dsn()) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (APP_USER,)
    with connect(p.dsn("pgbouncer", ADMIN_USER, ADMIN_PASSWORD)) as admin:
        admin.execute("SET auth_dbname = 'nowhere'")
    with pytest.raises(psycopg.OperationalError, match="bouncer config error"):
        connect(p.dsn())
    assert 'authentication database "nowhere" is not configured' in p.log()


def test_auth_dbname_pgbouncer_is_refused_at_start(pooler: PoolerFactory, tmp_path: Any) -> None:
    from tests.integration.test_unix_socket import run_pypool

    ini = tmp_path / "reserved.ini"
    ini.write_text("[databases]\n[pgbouncer]\nlisten_port = 6998\nauth_dbname = pgbouncer\n")
    done = run_pypool(ini)
    assert done.returncode == 2
    assert 'cannot use the reserved "pgbouncer" database as an auth_dbname' in done.stderr


# --- the `options` startup parameter ---------------------------------------------------------


def test_options_settings_reach_the_server_and_others_are_refused(pooler: PoolerFactory) -> None:
    p = pooler(ini_overrides={"pool_mode": "transaction", "default_pool_size": "1"})
    with connect(p.dsn(), options="-c DateStyle=German,\\ YMD --timezone=Portugal") as conn:
        assert conn.execute("SHOW DateStyle").fetchone() == ("German, YMD",)
        assert conn.execute("SHOW TimeZone").fetchone() == ("Portugal",)
    with connect(p.dsn()) as plain:  # the same server, given back as it was
        assert plain.execute("SHOW DateStyle").fetchone() != ("German, YMD",)
    with pytest.raises(psycopg.OperationalError,
                       match="unsupported startup parameter in options: work_mem"):
        connect(p.dsn(), options="-c work_mem=1MB")
    with pytest.raises(psycopg.OperationalError, match="only '-c config=val'"):
        connect(p.dsn(), options="-d 5")


# --- trust and the reserve pool, as PgBouncer logs and refuses them ---------------------------


def test_trust_lets_in_known_users_only(pooler: PoolerFactory) -> None:
    p = pooler(ini_overrides={"auth_type": "trust"})
    with connect(p.dsn()) as conn:  # in the auth_file: no password asked
        assert conn.execute("SELECT current_user").fetchone() == (APP_USER,)
    with pytest.raises(psycopg.OperationalError, match='"trust" authentication failed'):
        connect(p.dsn("app", "nobody-knows-me", "x"))
    assert 'closing because: "trust" authentication failed' in p.log()


def test_the_reserve_pool_is_logged_when_taken(pooler: PoolerFactory,
                                              postgres: EmbeddedPostgres) -> None:
    p = pooler(databases={"app": server(postgres, pool_size="1", reserve_pool_size="1")},
               ini_overrides={"reserve_pool_timeout": "0.5"})
    holder = connect(p.dsn())
    holder.execute("BEGIN")
    holder.execute("SELECT 1")
    try:
        with connect(p.dsn()) as second:  # waits 0.5 s, then gets the reserve server
            assert second.execute("SELECT 2").fetchone() == (2,)
    finally:
        holder.close()
    assert "app/app: taking connection from reserve_pool" in p.log()


# --- reloads, RECONNECT and the log lines operators grep ----------------------------------


def test_server_fast_close_ends_an_idle_session_on_reconnect(pooler: PoolerFactory) -> None:
    p = pooler(ini_overrides={"pool_mode": "session", "server_fast_close": "1"})
    with connect(p.dsn()) as conn:
        conn.execute("SELECT 1")
        with connect(p.dsn("pgbouncer", ADMIN_USER, ADMIN_PASSWORD)) as admin:
            admin.execute("RECONNECT app")
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    assert "closing because: database configuration changed" in p.log()


def test_a_database_added_by_reload_gets_its_min_pool_size(
    pooler: PoolerFactory, postgres: EmbeddedPostgres
) -> None:
    p = pooler()
    p.rewrite_config(databases={
        **p.databases,
        "warm": f"{server(postgres)} user={APP_USER} min_pool_size=2",
    })
    p.reload()
    assert wait_for(lambda: server_connections(postgres) >= 2, 10)


def test_auto_databases_and_failed_server_logins_are_logged(
    pooler: PoolerFactory, postgres: EmbeddedPostgres
) -> None:
    p = pooler(databases={"*": f"host={postgres.host} port={postgres.port}"})
    with connect(p.dsn("app")) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    with pytest.raises(psycopg.OperationalError, match='database "no_such_db" does not exist'):
        connect(p.dsn("no_such_db"))
    log = p.log()
    assert "registered new auto-database: db=app" in log
    assert 'server login failed: FATAL database "no_such_db" does not exist' in log
    assert 'closing because: database "no_such_db" does not exist' in log


def test_auth_query_failures_are_reported_as_pgbouncer_reports_them(
    pooler: PoolerFactory, postgres: EmbeddedPostgres
) -> None:
    p = pooler(
        databases={
            "broken": f"{server(postgres)} auth_query='SELECT usename, passwd FROM nowhere_t"
                      f" WHERE usename = $1'",
            "gone": f"host={postgres.host} port={postgres.port} dbname=no_such_db",
            "authdb": f"host={postgres.host} port={postgres.port} dbname=postgres",
        },
        userlist={ADMIN_USER: ADMIN_PASSWORD},
        ini_overrides={"auth_user": ADMIN_USER, "admin_users": f"{ADMIN_USER},{APP_USER}"},
    )
    # A query that fails on the server: the client hears "bouncer config error", the log why.
    with pytest.raises(psycopg.OperationalError, match="bouncer config error"):
        connect(p.dsn("broken"))
    assert 'relation "nowhere_t" does not exist' in p.log()
    # A login auth_query cannot make: the server's own words, as a failed server login.
    with pytest.raises(psycopg.OperationalError, match='database "no_such_db" does not exist'):
        connect(p.dsn("gone"))
    assert 'server login failed: FATAL database "no_such_db" does not exist' in p.log()
    # The console: a user known to PostgreSQL only needs the global auth_dbname.
    with pytest.raises(psycopg.OperationalError, match="bouncer config error"):
        connect(p.dsn("pgbouncer"))
    with connect(p.dsn("pgbouncer", ADMIN_USER, ADMIN_PASSWORD)) as admin:
        admin.execute("SET auth_dbname = 'authdb'")
    with connect(p.dsn("pgbouncer")) as console_session:  # APP_USER, through auth_query
        assert console_session.execute("SHOW VERSION").fetchone() is not None


def test_min_pool_size_does_not_starve_another_pool_under_max_db_connections(
    pooler: PoolerFactory, postgres: EmbeddedPostgres
) -> None:
    # ADMIN_USER's pool keeps min_pool_size = 2 servers, the whole max_db_connections. A
    # client of another user must still get one: an idle server is evicted for it, and the
    # first pool does not take the room back to refill itself while the other waits.
    p = pooler(databases={"app": server(postgres, min_pool_size="2",
                                        max_db_connections="2")})
    with connect(p.dsn("app", ADMIN_USER, ADMIN_PASSWORD)) as first:
        first.execute("SELECT 1")
        assert wait_for(lambda: server_connections(postgres, "app", ADMIN_USER) == 2, 5)
        with connect(p.dsn()) as second:
            assert second.execute("SELECT current_user").fetchone() == (APP_USER,)
    assert "evicted to make room for another pool" in p.log()


def test_trust_lets_in_a_user_auth_query_finds_without_a_password(
    pooler: PoolerFactory, postgres: EmbeddedPostgres
) -> None:
    exists = postgres.execute("SELECT 1 FROM pg_roles WHERE rolname = 'no_password_role'")
    if not exists:
        postgres.execute("CREATE ROLE no_password_role LOGIN")
    p = pooler(ini_overrides={"auth_type": "trust", "auth_user": ADMIN_USER},
               databases={"postgres": f"host={postgres.host} port={postgres.port} "
                                      "dbname=postgres"})
    # Found by auth_query (its rolpassword is NULL): known, so trust lets it in; it is the
    # server (SCRAM only here) that then turns the pool's login down.
    with pytest.raises(psycopg.OperationalError, match="wrong password type") as info:
        connect(p.dsn("postgres", "no_password_role", ""))
    assert "trust" not in str(info.value)
    # Not found by auth_query: under trust there is no password exchange to mock, so, as
    # PgBouncer, the client is told (where the password methods run the mock exchange).
    with pytest.raises(psycopg.OperationalError, match="no such user") as unknown:
        connect(p.dsn("postgres", "no_such_role_at_all", ""))
    assert "trust" not in str(unknown.value)
    assert "closing because: no such user" in p.log()


def test_login_notify_message_is_a_notice_in_the_welcome(pooler) -> None:
    """PgBouncer 1.26: a NOTICE after AuthenticationOk, before ReadyForQuery; none unset."""
    from tests.integration.rawclient import RawClient

    told = pooler(ini_overrides={"auth_type": "trust",
                                 "login_notify_message": "you are talking to pypool"})
    with RawClient(told.host, told.port, timeout=10) as raw:
        login = raw.login("app", "app")
        assert [kind for kind, _ in login.messages][-2:] == [ord("N"), ord("Z")]
        notice = next(body for kind, body in login.messages if kind == ord("N"))
        assert b"SNOTICE\x00" in notice and b"Myou are talking to pypool\x00" in notice
        assert raw.simple_query("SELECT 1")[0] == [["1"]]
    silent = pooler(ini_overrides={"auth_type": "trust"})
    with RawClient(silent.host, silent.port, timeout=10) as raw:
        assert ord("N") not in [kind for kind, _ in raw.login("app", "app").messages]


def test_the_welcome_tells_a_driver_it_talks_to_a_pooler(pooler) -> None:
    """PgBouncer 1.26's ParameterStatus at login: pgbouncer.version (the release pypool
    answers as), pgbouncer.pool_mode (the client's pool's) and
    pgbouncer.max_prepared_statements; libpq exposes them as any reported parameter."""
    import psycopg

    p = pooler(ini_overrides={"max_prepared_statements": "50"})
    with psycopg.connect(p.dsn(), connect_timeout=5) as conn:
        status = conn.info.parameter_status
        assert status("pgbouncer.version") == "1.24.1"
        assert status("pgbouncer.pool_mode") == "transaction"
        assert status("pgbouncer.max_prepared_statements") == "50"
        assert status("server_version")  # the server's own still come first
