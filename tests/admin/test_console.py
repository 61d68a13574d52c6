"""The admin console against a running pypool, through psycopg: every SHOW's columns as
PgBouncer 1.24 sends them, their values under load, each command's effect, the errors."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import psycopg
import pytest

from pypool.embedded import EmbeddedPostgres, free_port
from tests.admin.console_client import (
    STATS_PASSWORD,
    STATS_USER,
    Background,
    app,
    columns,
    console,
    row,
    show,
    wait_until,
)
from tests.conftest import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    APP_PASSWORD,
    APP_USER,
    Pooler,
    server_connections,
)

pytestmark = pytest.mark.timeout(60)

TEXT, INT4, INT8, NUMERIC = 25, 23, 20, 1700
_OIDS = {"s": TEXT, "T": TEXT, "i": INT4, "q": INT8, "N": NUMERIC}


def _cols(types: str, names: str) -> list[tuple[str, int]]:
    """Columns as PgBouncer's admin.c declares them: a type letter per column, and names."""
    split = names.split()
    assert len(types) == len(split)
    return [(name, _OIDS[t]) for name, t in zip(split, types, strict=True)]


_SOCKETS = _cols(
    "ssssssisiTTiiississii",
    "type user database replication state addr port local_addr local_port connect_time "
    "request_time wait wait_us close_needed ptr link remote_pid tls application_name "
    "prepared_statements id",
)
_STAT_NAMES = ("server_assignment_count xact_count query_count {r} {s} xact_time query_time "
               "wait_time {p}client_parse_count {p}server_parse_count {p}bind_count "
               "{p}client_login_count")  # client_login_count: PgBouncer 1.26 (#1457)

# Written from PgBouncer 1.24.1's src/admin.c and src/stats.c, not from pypool's code.
EXPECTED_COLUMNS = {
    "POOLS": _cols(
        "ssiiiiiiiiiiiiiss",
        "database user cl_active cl_waiting cl_active_cancel_req cl_waiting_cancel_req "
        "sv_active sv_active_cancel sv_being_canceled sv_idle sv_used sv_tested sv_login "
        "maxwait maxwait_us pool_mode load_balance_hosts",
    ),
    "STATS": _cols(
        "s" + "N" * 24,
        "database "
        + " ".join("total_" + n for n in _STAT_NAMES.format(r="received", s="sent", p="").split())
        + " "
        + " ".join("avg_" + n for n in _STAT_NAMES.format(r="recv", s="sent", p="").split()),
    ),
    "STATS_TOTALS": _cols(
        "s" + "N" * 12,
        "database " + _STAT_NAMES.format(r="bytes_received", s="bytes_sent", p=""),
    ),
    "STATS_AVERAGES": _cols(
        "s" + "N" * 12,
        "database " + _STAT_NAMES.format(r="bytes_received", s="bytes_sent", p="avg_"),
    ),
    "TOTALS": _cols("sN", "name value"),
    "CLIENTS": [*_SOCKETS, ("pinned", TEXT)],  # pypool's own, last (docs/session-state.md)
    "SERVERS": _SOCKETS,
    "DATABASES": _cols(
        "ssissiiiissiiiiii",
        "name host port database force_user pool_size min_pool_size reserve_pool_size "
        "server_lifetime pool_mode load_balance_hosts max_connections current_connections "
        "max_client_connections current_client_connections paused disabled",
    ),
    "USERS": _cols(
        "ssssiiii",
        "name pool_size reserve_pool_size pool_mode max_user_connections current_connections "
        "max_user_client_connections current_client_connections",
    ),
    "CONFIG": _cols("ssss", "key value default changeable"),
    "LISTS": _cols("si", "list items"),
    "STATE": _cols("ss", "key value"),
    "VERSION": _cols("s", "version"),
}


def test_show_columns_are_pgbouncers(bouncer: Pooler) -> None:
    with app(bouncer) as client, console(bouncer) as admin:
        client.execute("SELECT 1")
        assert {what: columns(admin, what) for what in EXPECTED_COLUMNS} == EXPECTED_COLUMNS
        # lower case and a trailing semicolon work as in PgBouncer, and so does SELECT
        assert columns(admin, "pools;") == EXPECTED_COLUMNS["POOLS"]
        assert admin.execute("select version").fetchone()[0].startswith("PgBouncer")


def test_show_rows_that_name_things(bouncer: Pooler) -> None:
    with console(bouncer) as admin:
        assert [r["list"] for r in show(admin, "LISTS")] == [
            "databases", "users", "peers", "pools", "peer_pools", "free_clients",
            "used_clients", "login_clients", "free_servers", "used_servers", "dns_names",
            "dns_zones", "dns_queries", "dns_pending",
        ]
        totals = [r["name"] for r in show(admin, "TOTALS")]
        fields = ["server_assignment_count", "xact_count", "query_count", "client_bytes",
                  "server_bytes", "xact_time", "query_time", "wait_time",
                  "ps_client_parse_count", "ps_server_parse_count", "ps_bind_count",
                  "client_login_count"]
        assert totals == ["total_" + f for f in fields] + ["avg_" + f for f in fields]
        assert show(admin, "STATE") == [{"key": "active", "value": "yes"},
                                        {"key": "paused", "value": "no"},
                                        {"key": "suspended", "value": "no"}]
        (version,) = show(admin, "VERSION")
        assert version["version"].startswith("PgBouncer 1.24.1 (pypool ")
        config = {r["key"]: r for r in show(admin, "CONFIG")}
        assert config["max_client_conn"]["value"] == "500"
        assert config["max_client_conn"]["default"] == "100"
        assert config["query_wait_timeout"]["value"] == "120"
        assert config["listen_port"]["changeable"] == "no"
        assert config["default_pool_size"]["changeable"] == "yes"
        assert config["metrics_port"]["value"] == "0"  # no metrics unless asked for
        assert "metrics on" not in bouncer.log()
        databases = {r["name"]: r for r in show(admin, "DATABASES")}
        assert set(databases) == {"app", "bench", "postgres", "pgbouncer"}
        assert databases["app"]["database"] == "app"
        assert databases["app"]["pool_size"] == 5
        assert databases["pgbouncer"]["pool_mode"] == "statement"
        users = {r["name"] for r in show(admin, "USERS")}
        assert {APP_USER, STATS_USER, "pgbouncer"} <= users
        notices: list[str] = []
        admin.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        admin.execute("SHOW HELP")
        assert notices == ["Console usage"]


def _load(p: Pooler, clients: int, stop: Callable[[], bool]) -> list[Background]:
    """`clients` connections running short transactions until `stop()`."""

    def run() -> int:
        done = 0
        with app(p) as conn:
            while not stop():
                with conn.transaction():
                    conn.execute("SELECT pg_sleep(0.002)")
                    conn.execute("SELECT 1")
                done += 1
        return done

    return [Background(run) for _ in range(clients)]


def test_values_under_load(bouncer: Pooler, postgres: EmbeddedPostgres) -> None:
    stopping = False
    workers = _load(bouncer, 8, lambda: stopping)
    try:
        with console(bouncer) as admin:
            pools = wait_until(lambda: [r for r in show(admin, "POOLS") if r["database"] == "app"
                                        and r["cl_active"] + r["cl_waiting"] == 8])
            assert pools[0]["user"] == APP_USER
            assert pools[0]["pool_mode"] == "transaction"
            assert pools[0]["sv_active"] + pools[0]["sv_idle"] + pools[0]["sv_login"] <= 5
            clients = [r for r in show(admin, "CLIENTS") if r["database"] == "app"]
            assert len(clients) == 8
            assert {c["state"] for c in clients} <= {"active", "idle", "waiting"}
            assert all(c["type"] == "C" and c["user"] == APP_USER for c in clients)
            assert len({c["id"] for c in clients}) == 8
            me = row(admin, "CLIENTS", database="pgbouncer")
            # No server linked: idle, as PgBouncer 1.25 says of its console clients too.
            assert me["user"] == "pool_admin" and me["state"] == "idle"
            # two stats periods, so the averages cover a full one under load
            time.sleep(2.2)
            stats = row(admin, "STATS", database="app")
            assert stats["total_xact_count"] > 20
            assert stats["total_query_count"] >= 2 * stats["total_xact_count"]
            assert stats["total_server_assignment_count"] >= stats["total_xact_count"]
            assert stats["avg_xact_count"] > 5
            assert stats["avg_xact_time"] > 2000  # pg_sleep(0.002) per transaction, in us
            assert stats["avg_query_time"] > 0
            totals = row(admin, "STATS_TOTALS", database="app")
            assert totals["xact_count"] >= stats["total_xact_count"]
            averages = row(admin, "STATS_AVERAGES", database="app")
            assert averages["xact_count"] > 5
            servers = [r for r in show(admin, "SERVERS") if r["database"] == "app"]
            assert 1 <= len(servers) <= 5
            assert {s["state"] for s in servers} <= {"active", "idle", "new"}
            pids = {s["remote_pid"] for s in servers if s["state"] != "new"}
            rows = postgres.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = 'app' AND usename = 'app'")
            assert rows is not None
            assert pids <= {r[0] for r in rows}
            linked = {c["link"] for c in show(admin, "CLIENTS") if c["link"]}
            assert linked <= {s["ptr"] for s in show(admin, "SERVERS")}
            database = row(admin, "DATABASES", name="app")
            assert 1 <= database["current_connections"] <= 5
            assert database["current_client_connections"] == 8
            user = row(admin, "USERS", name=APP_USER)
            assert user["current_client_connections"] == 8
            lists = {r["list"]: r["items"] for r in show(admin, "LISTS")}
            assert lists["used_clients"] >= 9
            assert lists["pools"] >= 2
            total = {r["name"]: r["value"] for r in show(admin, "TOTALS")}
            assert total["total_xact_count"] >= stats["total_xact_count"]
    finally:
        stopping = True
        done = [w.result() for w in workers]
    assert all(n > 0 for n in done)


def test_maxwait_and_waiting_clients(operated_pooler: Callable[..., Pooler]) -> None:
    p = operated_pooler(default_pool_size=1)
    with app(p) as holder, app(p) as waiter, console(p) as admin:
        holder.execute("BEGIN")
        holder.execute("SELECT 1")
        blocked = Background(lambda: waiter.execute("SELECT 2").fetchone())
        pool = wait_until(lambda: row(admin, "POOLS", database="app")["cl_waiting"] == 1
                          and row(admin, "POOLS", database="app"))
        time.sleep(0.3)
        pool = row(admin, "POOLS", database="app")
        assert pool["cl_waiting"] == 1 and pool["sv_active"] == 1
        assert pool["maxwait"] * 1_000_000 + pool["maxwait_us"] >= 300_000
        waiting = row(admin, "CLIENTS", database="app", state="waiting")
        assert waiting["wait"] * 1_000_000 + waiting["wait_us"] >= 300_000
        holder.execute("COMMIT")
        assert blocked.result() == (2,)
        assert row(admin, "STATS", database="app")["total_wait_time"] >= 300_000


def test_prepared_statements_are_counted(bouncer: Pooler) -> None:
    with app(bouncer, prepare_threshold=0) as client, console(bouncer) as admin:
        client.execute("SELECT %s::int", (1,), prepare=True)
        client.execute("SELECT %s::int + 1", (1,), prepare=True)
        assert row(admin, "CLIENTS", database="app")["prepared_statements"] == 2
        assert row(admin, "SERVERS", database="app")["prepared_statements"] == 2
        stats = row(admin, "STATS", database="app")
        assert stats["total_client_parse_count"] == 2
        assert stats["total_server_parse_count"] == 2
        assert stats["total_bind_count"] == 2


def test_client_logins_are_counted_and_failed_ones_are_not(bouncer: Pooler) -> None:
    """PgBouncer 1.26's total_client_login_count: one per successful login, in its pool's
    row; the console's own logins in the pgbouncer row and SHOW TOTALS."""
    app(bouncer).close()  # the pool exists from its first login
    with console(bouncer) as admin:
        before = row(admin, "STATS", database="app")["total_client_login_count"]
        assert before >= 1
        for _ in range(3):
            app(bouncer).close()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(bouncer.dsn("app", APP_USER, "wrong password"), connect_timeout=5)
        stats = row(admin, "STATS", database="app")
        assert stats["total_client_login_count"] == before + 3
        assert row(admin, "STATS_TOTALS", database="app")["client_login_count"] == before + 3
        assert row(admin, "STATS", database="pgbouncer")["total_client_login_count"] >= 1
        totals = {r["name"]: r["value"] for r in show(admin, "TOTALS")}
        assert totals["total_client_login_count"] >= before + 4


def test_bytes_are_counted(bouncer: Pooler) -> None:
    with app(bouncer) as client, console(bouncer) as admin:
        before = row(admin, "STATS", database="app")
        rows = client.execute("SELECT repeat('x', 1000) FROM generate_series(1, 100)").fetchall()
        assert len(rows) == 100
        after = row(admin, "STATS", database="app")
    # One query out, 100 rows of 1,000 bytes back (plus headers and ReadyForQuery).
    assert after["total_received"] - before["total_received"] >= 50
    assert after["total_sent"] - before["total_sent"] >= 100 * 1000


def test_extended_protocol_on_the_console_is_refused(bouncer: Pooler) -> None:
    with console(bouncer) as admin:
        with pytest.raises(psycopg.OperationalError,
                           match="extended query protocol not supported by admin console"):
            admin.execute("SHOW POOLS WHERE %s", (1,))
        assert admin.closed or admin.broken


# --- commands ---------------------------------------------------------------------------


def test_pause_holds_new_queries_until_resume(bouncer: Pooler, postgres: EmbeddedPostgres
                                              ) -> None:
    with app(bouncer) as busy, app(bouncer) as other, console(bouncer) as admin, \
            console(bouncer) as watcher:
        other.execute("SELECT 1")
        busy.execute("BEGIN")
        busy.execute("SELECT 1")
        pause = Background(lambda: admin.execute("PAUSE app").statusmessage)
        time.sleep(0.5)
        assert not pause.done  # waits for the open transaction
        assert row(watcher, "DATABASES", name="app")["paused"] == 1
        busy.execute("COMMIT")
        assert pause.result() == "PAUSE"
        wait_until(lambda: server_connections(postgres, "app", "app") == 0)
        held = Background(lambda: other.execute("SELECT 42").fetchone())
        time.sleep(0.5)
        assert not held.done
        assert admin.execute("RESUME app").statusmessage == "RESUME"
        assert held.result() == (42,)


def test_pause_all_and_state(bouncer: Pooler) -> None:
    with app(bouncer) as client, console(bouncer) as admin:
        client.execute("SELECT 1")
        assert admin.execute("PAUSE").statusmessage == "PAUSE"
        assert {r["key"]: r["value"] for r in show(admin, "STATE")}["paused"] == "yes"
        with pytest.raises(psycopg.errors.ProtocolViolation, match="already suspended/paused"):
            admin.execute("PAUSE")
        held = Background(lambda: client.execute("SELECT 7").fetchone())
        time.sleep(0.3)
        assert not held.done
        assert admin.execute("RESUME").statusmessage == "RESUME"
        assert held.result() == (7,)
        with pytest.raises(psycopg.errors.ProtocolViolation,
                           match="pooler is not paused/suspended"):
            admin.execute("RESUME")
        with pytest.raises(psycopg.errors.ProtocolViolation, match="database app is not paused"):
            admin.execute("RESUME app")


def test_kill_drops_clients_and_servers(bouncer: Pooler, postgres: EmbeddedPostgres) -> None:
    with app(bouncer) as victim, console(bouncer) as admin:
        victim.execute("SELECT 1")
        assert admin.execute("KILL app").statusmessage == "KILL"
        with pytest.raises(psycopg.OperationalError):
            victim.execute("SELECT 1")
        wait_until(lambda: server_connections(postgres, "app", "app") == 0)
        assert row(admin, "DATABASES", name="app")["paused"] == 1
        # a killed database stays paused: a new client's query waits for RESUME
        with app(bouncer) as late:
            held = Background(lambda: late.execute("SELECT 3").fetchone())
            time.sleep(0.3)
            assert not held.done
            admin.execute("RESUME app")
            assert held.result() == (3,)


def test_kill_without_a_database_kills_every_pool(bouncer: Pooler,
                                                  postgres: EmbeddedPostgres) -> None:
    """PgBouncer 1.25: KILL alone drops the clients and servers of every database that has
    a pool and pauses each one; the console itself carries on."""
    with app(bouncer) as one, app(bouncer, "bench") as two, console(bouncer) as admin:
        one.execute("SELECT 1")
        two.execute("SELECT 1")
        assert admin.execute("KILL").statusmessage == "KILL"
        for victim in (one, two):
            with pytest.raises(psycopg.OperationalError):
                victim.execute("SELECT 1")
        wait_until(lambda: server_connections(postgres, "app", "app") == 0)
        wait_until(lambda: server_connections(postgres, "bench", "app") == 0)
        assert row(admin, "DATABASES", name="app")["paused"] == 1
        assert row(admin, "DATABASES", name="bench")["paused"] == 1
        assert row(admin, "DATABASES", name="postgres")["paused"] == 0  # had no pool
        assert admin.execute("RESUME app").statusmessage == "RESUME"
        assert admin.execute("RESUME bench").statusmessage == "RESUME"
        with app(bouncer) as late:
            assert late.execute("SELECT 4").fetchone() == (4,)


def test_client_states_are_pgbouncer_125s(bouncer: Pooler) -> None:
    """SHOW CLIENTS `state`: idle (no server linked), waiting (queued), active (linked)."""
    with app(bouncer) as client, console(bouncer) as admin:
        client.execute("SET application_name = 'watched'")
        assert row(admin, "CLIENTS", application_name="watched")["state"] == "idle"
        client.execute("BEGIN")
        assert row(admin, "CLIENTS", application_name="watched")["state"] == "active"
        client.execute("ROLLBACK")
        admin.execute("PAUSE app")
        done = Background(lambda: client.execute("SELECT 1").fetchone())
        wait_until(lambda: row(admin, "CLIENTS", application_name="watched")["state"]
                   == "waiting")
        admin.execute("RESUME app")
        assert done.result(10) == (1,)
        assert row(admin, "CLIENTS", application_name="watched")["state"] == "idle"


def test_kill_client_by_id(bouncer: Pooler) -> None:
    with app(bouncer) as victim, app(bouncer) as bystander, console(bouncer) as admin:
        victim.execute("SET application_name = 'victim'")
        bystander.execute("SELECT 1")
        target = row(admin, "CLIENTS", application_name="victim")["id"]
        assert admin.execute(f"KILL_CLIENT {target}").statusmessage == "KILL_CLIENT"
        with pytest.raises(psycopg.OperationalError):
            victim.execute("SELECT 1")
        assert bystander.execute("SELECT 2").fetchone() == (2,)
        with pytest.raises(psycopg.errors.ProtocolViolation, match="client not found"):
            admin.execute(f"KILL_CLIENT {target}")


def test_disable_refuses_new_clients_only(bouncer: Pooler) -> None:
    with app(bouncer) as connected, console(bouncer) as admin:
        connected.execute("SELECT 1")
        assert admin.execute("DISABLE app").statusmessage == "DISABLE"
        assert row(admin, "DATABASES", name="app")["disabled"] == 1
        with pytest.raises(psycopg.OperationalError, match='database "app" is disabled'):
            app(bouncer)
        assert connected.execute("SELECT 2").fetchone() == (2,)
        assert admin.execute("ENABLE app").statusmessage == "ENABLE"
        with app(bouncer) as again:
            assert again.execute("SELECT 3").fetchone() == (3,)
        with pytest.raises(psycopg.errors.ProtocolViolation, match="no such database: nope"):
            admin.execute("DISABLE nope")
        with pytest.raises(psycopg.errors.ProtocolViolation,
                           match="cannot disable admin db: pgbouncer"):
            admin.execute("DISABLE pgbouncer")


def test_reconnect_closes_servers_after_release(bouncer: Pooler) -> None:
    with app(bouncer) as client, console(bouncer) as admin:
        client.execute("BEGIN")
        old_pid = client.execute("SELECT pg_backend_pid()").fetchone()
        assert admin.execute("RECONNECT app").statusmessage == "RECONNECT"
        assert row(admin, "SERVERS", database="app", state="active")["close_needed"] == 1
        wait_close = Background(lambda: admin.execute("WAIT_CLOSE app").statusmessage)
        time.sleep(0.3)
        assert not wait_close.done
        # the transaction is not disturbed ...
        assert client.execute("SELECT pg_backend_pid()").fetchone() == old_pid
        client.execute("COMMIT")
        assert wait_close.result() == "WAIT_CLOSE"
        # ... and the next one runs on a new server
        assert client.execute("SELECT pg_backend_pid()").fetchone() != old_pid
        assert all(s["close_needed"] == 0 for s in show(admin, "SERVERS"))


def test_set_changes_settings_live(operated_pooler: Callable[..., Pooler]) -> None:
    p = operated_pooler(default_pool_size=1)
    with app(p) as holder, app(p) as waiter, console(p) as admin:
        holder.execute("BEGIN")
        holder.execute("SELECT 1")
        blocked = Background(lambda: waiter.execute("SELECT 5").fetchone())
        time.sleep(0.3)
        assert not blocked.done
        assert admin.execute("SET default_pool_size = 2").statusmessage == \
            "SET default_pool_size=2"
        assert blocked.result() == (5,)  # served by a second server while holder holds one
        holder.execute("COMMIT")
        assert row(admin, "CONFIG", key="default_pool_size")["value"] == "2"
        assert row(admin, "DATABASES", name="app")["pool_size"] == 2
        admin.execute("SET query_wait_timeout = '2.5'")
        assert row(admin, "CONFIG", key="query_wait_timeout")["value"] == "2.5"
        for bad in ("SET listen_port = 7000", "SET no_such_key = 1",
                    "SET default_pool_size = many"):
            with pytest.raises(psycopg.errors.ProtocolViolation, match="SET failed"):
                admin.execute(bad)
        notices: list[str] = []
        admin.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        assert admin.execute("SET client_encoding = 'UTF8'").statusmessage == "SET"
        assert notices == ["SET ignored"]


def test_shutdown_exits(bouncer: Pooler) -> None:
    with console(bouncer) as admin:
        with pytest.raises(psycopg.OperationalError):
            admin.execute("SHUTDOWN")
    assert bouncer.proc.wait(10) == 0


def test_shutdown_wait_for_clients(bouncer: Pooler) -> None:
    """As PgBouncer 1.25: TCP closes, the unix socket stays open for the console only, and
    the pooler exits once the last client has gone."""
    socket_dir = str(bouncer.ini_path.parent)
    with app(bouncer) as client, console(bouncer) as admin:
        client.execute("SELECT 1")
        assert admin.execute("SHUTDOWN WAIT_FOR_CLIENTS").statusmessage == "SHUTDOWN"
        assert client.execute("SELECT 2").fetchone() == (2,)  # still served
        assert bouncer.proc.poll() is None
        with pytest.raises(psycopg.OperationalError, match="pooler is shutting down"):
            psycopg.connect(host=socket_dir, port=bouncer.port, dbname="app", user=APP_USER,
                            password=APP_PASSWORD, connect_timeout=5)
        with psycopg.connect(host=socket_dir, port=bouncer.port, dbname="pgbouncer",
                             user=ADMIN_USER, password=ADMIN_PASSWORD, autocommit=True,
                             connect_timeout=5) as late_admin:
            assert late_admin.execute("SHOW VERSION").fetchone() is not None
        with pytest.raises(psycopg.OperationalError):
            app(bouncer)  # TCP: closed
    assert bouncer.proc.wait(10) == 0  # exits once the client has gone


# --- who may do what, and how errors look -------------------------------------------------


def test_no_command_but_show_runs_for_a_stats_user(bouncer: Pooler) -> None:
    """CVE class of PgBouncer 1.26.0 (KILL_CLIENT from a non-admin): every command that
    acts, with a real target, is refused to a stats_users member, and changes nothing."""
    with app(bouncer) as victim, console(bouncer) as admin, \
            console(bouncer, STATS_USER, STATS_PASSWORD) as stats:
        victim.execute("SET application_name = 'victim'")
        target = row(admin, "CLIENTS", application_name="victim")["id"]
        for command in (f"KILL_CLIENT {target}", "KILL app", "KILL", "PAUSE app", "PAUSE",
                        "SUSPEND", "RESUME", "RESUME app", "DISABLE app", "ENABLE app",
                        "RECONNECT app", "RECONNECT", "WAIT_CLOSE app", "RELOAD",
                        "SHUTDOWN", "SHUTDOWN WAIT_FOR_CLIENTS", "SET max_client_conn = 1",
                        "SHOW FDS", "TRACE app on"):
            with pytest.raises(psycopg.Error) as refused:
                stats.execute(command)
            assert refused.value.sqlstate == "08P01", command
            assert "admin access needed" in str(refused.value) or "invalid command" in str(
                refused.value), command
        assert victim.execute("SELECT 1").fetchone() == (1,)  # still connected, served
        assert row(admin, "DATABASES", name="app")["paused"] == 0
        assert row(admin, "DATABASES", name="app")["disabled"] == 0
        assert bouncer.proc.poll() is None


def test_errors_are_pgbouncers(bouncer: Pooler) -> None:
    with pytest.raises(psycopg.OperationalError, match="not allowed"):
        console(bouncer, APP_USER, APP_PASSWORD)
    with console(bouncer, STATS_USER, STATS_PASSWORD) as stats:
        assert show(stats, "POOLS") is not None
        for command in ("PAUSE", "RESUME app", "RELOAD", "KILL app", "SHUTDOWN",
                        "SET default_pool_size = 3"):
            with pytest.raises(psycopg.errors.ProtocolViolation, match="admin access needed"):
                stats.execute(command)
    with console(bouncer, dbname="pypool") as admin:  # the alias
        for query in ("BOGUS", "SHOW NOPE", "PAUSE a b", "RELOAD now", ""):
            with pytest.raises(psycopg.errors.ProtocolViolation) as failure:
                admin.execute(query)
            assert failure.value.diag.message_primary == \
                f"invalid command '{query}', use SHOW HELP;"
            assert failure.value.diag.severity == "ERROR"
        with pytest.raises(psycopg.errors.ProtocolViolation, match="no such database: nope"):
            admin.execute("PAUSE nope")
        # errors are not fatal
        assert show(admin, "VERSION")


# --- the same columns as a real PgBouncer 1.24 ---------------------------------------------


# What pypool shows as PgBouncer 1.26 does, which 1.24 has not (docs/operating.md).
SINCE_1_26: Final = frozenset({"total_client_login_count", "avg_client_login_count",
                               "client_login_count"})


def _pgbouncer_124() -> str | None:
    """A PgBouncer 1.24 binary: $PYPOOL_PGBOUNCER, the bench's build, or the system's."""
    candidates = [os.environ.get("PYPOOL_PGBOUNCER", ""),
                  str(Path(__file__).resolve().parents[2]
                      / "bench/.cache/pgbouncer-1.24.1/pgbouncer"),
                  shutil.which("pgbouncer") or "", "/usr/sbin/pgbouncer"]
    for path in filter(None, candidates):
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True,
                                 timeout=5).stdout
        except OSError:
            continue
        if out.startswith("PgBouncer 1.24."):
            return path
    return None


@pytest.fixture
def real_pgbouncer(postgres: EmbeddedPostgres) -> Iterator[int]:
    binary = _pgbouncer_124()
    if binary is None:
        pytest.skip("no PgBouncer 1.24 binary to compare with")
    workdir = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
    os.chmod(workdir, 0o755)
    port = free_port()
    (workdir / "userlist.txt").write_text(
        f'"{APP_USER}" "{APP_PASSWORD}"\n"pool_admin" "admin-secret"\n')
    (workdir / "pgbouncer.ini").write_text(
        f"[databases]\napp = host={postgres.host} port={postgres.port} dbname=app\n\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = scram-sha-256\nauth_file = {workdir}/userlist.txt\n"
        "admin_users = pool_admin\npool_mode = transaction\n")
    kwargs: dict[str, Any] = {}
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        for path in workdir.iterdir():
            shutil.chown(path, "postgres", "postgres")
        kwargs = {"user": "postgres", "group": "postgres"}
    proc = subprocess.Popen([binary, str(workdir / "pgbouncer.ini")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)
    try:
        wait_until(lambda: proc.poll() is not None or _listening(port), timeout=10)
        if proc.poll() is not None:
            pytest.skip("PgBouncer 1.24 did not start")
        yield port
    finally:
        proc.send_signal(signal.SIGQUIT)  # immediate shutdown
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def _listening(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def test_same_columns_and_errors_as_real_pgbouncer(bouncer: Pooler, real_pgbouncer: int) -> None:
    dsn = f"host=127.0.0.1 port={real_pgbouncer} dbname=pgbouncer user=pool_admin " \
          "password=admin-secret"
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as real, \
            console(bouncer) as ours, app(bouncer) as client:
        client.execute("SELECT 1")
        with psycopg.connect(f"host=127.0.0.1 port={real_pgbouncer} dbname=app user={APP_USER}"
                             f" password={APP_PASSWORD}", autocommit=True) as real_client:
            real_client.execute("SELECT 1")
            for what in sorted(EXPECTED_COLUMNS) + ["PEERS", "PEER_POOLS", "DNS_ZONES"]:
                our_columns = columns(ours, what)
                if what == "CLIENTS":
                    assert our_columns[-1] == ("pinned", TEXT)  # pypool's one addition, last
                    our_columns = our_columns[:-1]
                our_columns = [c for c in our_columns if c[0] not in SINCE_1_26]
                assert our_columns == columns(real, what), what
            for what, key in (("LISTS", "list"), ("TOTALS", "name"), ("STATE", "key")):
                ours_shown = [r[key] for r in show(ours, what) if r[key] not in SINCE_1_26]
                assert ours_shown == [r[key] for r in show(real, what)]
            # (A bare KILL is an error before PgBouncer 1.25 and kills every pool from 1.25
            # on, as pypool does: tested on its own.)
            for query in ("BOGUS", "PAUSE nope", "RESUME", "SET no_such_key = 1"):
                with pytest.raises(psycopg.Error) as theirs:
                    real.execute(query)
                with pytest.raises(psycopg.Error) as mine:
                    ours.execute(query)
                assert (mine.value.sqlstate, mine.value.diag.message_primary) == \
                    (theirs.value.sqlstate, theirs.value.diag.message_primary), query
