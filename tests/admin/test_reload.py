"""Reloads that drop no one: SIGHUP and the console's RELOAD re-read the ini and the auth_file;
sizes and timeouts apply to the next assignment, a removed database refuses new clients while
its connected ones carry on, a changed one gets new servers, a bad file is logged and ignored."""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
import pytest

from pypool.embedded import EmbeddedPostgres
from tests.admin.console_client import Background, app, console, row, show, wait_until
from tests.conftest import Pooler, server_connections

pytestmark = pytest.mark.timeout(60)


def _hold_the_only_server(p: Pooler) -> tuple[psycopg.Connection, psycopg.Connection]:
    holder, waiter = app(p), app(p)
    holder.execute("BEGIN")
    holder.execute("SELECT 1")
    return holder, waiter


def test_sighup_pool_size_applies_to_the_next_assignment(
    operated_pooler: Callable[..., Pooler],
) -> None:
    p = operated_pooler(default_pool_size=1)
    holder, waiter = _hold_the_only_server(p)
    with holder, waiter:
        blocked = Background(lambda: waiter.execute("SELECT 2").fetchone())
        time.sleep(0.3)
        assert not blocked.done
        p.rewrite_config({"default_pool_size": "2"})
        p.reload()
        assert blocked.result() == (2,)  # a second server, while holder keeps the first
        holder.execute("COMMIT")
    assert "configuration reloaded from" in p.log()


def test_reload_timeout_applies_to_waiting_clients(operated_pooler: Callable[..., Pooler]) -> None:
    p = operated_pooler(default_pool_size=1)
    holder, waiter = _hold_the_only_server(p)
    with holder, waiter, console(p) as admin:
        p.rewrite_config({"query_wait_timeout": "1"})
        assert admin.execute("RELOAD").statusmessage == "RELOAD"
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match="query_wait_timeout"):
            waiter.execute("SELECT 2")
        assert time.monotonic() - started < 5
        assert holder.execute("SELECT 3").fetchone() == (3,)  # untouched


def test_removed_database_refuses_new_clients_and_serves_connected_ones(
    bouncer: Pooler, postgres: EmbeddedPostgres,
) -> None:
    with app(bouncer, "bench") as connected, console(bouncer) as admin:
        connected.execute("SELECT 1")
        databases = dict(bouncer.databases)
        bench = databases.pop("bench")
        bouncer.rewrite_config(databases=databases)
        admin.execute("RELOAD")
        with pytest.raises(psycopg.OperationalError, match="no such database: bench"):
            app(bouncer, "bench")
        for i in range(3):  # the connected client is not dropped
            with connected.transaction():
                assert connected.execute("SELECT %s::int", (i,)).fetchone() == (i,)
        assert row(admin, "DATABASES", name="bench")["current_client_connections"] == 1
        assert "database bench removed from the config" in bouncer.log()
        connected.close()
        # once its last client has gone, the pool and its servers go too
        wait_until(lambda: not [r for r in show(admin, "POOLS") if r["database"] == "bench"])
        wait_until(lambda: server_connections(postgres, "bench", "app") == 0)
        assert "bench" not in {r["name"] for r in show(admin, "DATABASES")}
        # and it can come back
        bouncer.rewrite_config(databases={**databases, "bench": bench})
        admin.execute("RELOAD")
        with app(bouncer, "bench") as again:
            assert again.execute("SELECT 4").fetchone() == (4,)


def test_bad_config_is_logged_and_the_old_one_kept(bouncer: Pooler) -> None:
    with app(bouncer) as client, console(bouncer) as admin:
        client.execute("SELECT 1")
        bouncer.rewrite_config({"pool_mode": "bogus", "default_pool_size": "9"})
        bouncer.reload()
        wait_until(lambda: "reload failed, keeping the old configuration" in bouncer.log())
        with pytest.raises(psycopg.errors.ConfigFileError,
                           match="RELOAD failed, see logs for additional details"):
            admin.execute("RELOAD")
        config = {r["key"]: r["value"] for r in show(admin, "CONFIG")}
        assert config["pool_mode"] == "transaction" and config["default_pool_size"] == "5"
        assert client.execute("SELECT 2").fetchone() == (2,)
        with app(bouncer) as newcomer:
            assert newcomer.execute("SELECT 3").fetchone() == (3,)
        # a key that needs a restart keeps its value, and the log says so
        bouncer.rewrite_config({"pool_mode": "transaction", "listen_port": "1"})
        admin.execute("RELOAD")
        assert "listen_port changed: takes effect at restart" in bouncer.log()
        assert row(admin, "CONFIG", key="listen_port")["value"] == str(bouncer.port)


def test_reload_rereads_the_auth_file(bouncer: Pooler) -> None:
    with pytest.raises(psycopg.OperationalError):
        console(bouncer, "watcher", "watch-secret")
    bouncer.rewrite_config({"stats_users": "stats_reader, watcher"},
                           userlist={**bouncer.userlist, "watcher": "watch-secret"})
    bouncer.reload()
    wait_until(lambda: "configuration reloaded" in bouncer.log())
    with console(bouncer, "watcher", "watch-secret") as watcher:
        assert row(watcher, "DATABASES", name="app")["name"] == "app"


def test_changed_database_gets_new_servers_after_release(
    bouncer: Pooler, postgres: EmbeddedPostgres,
) -> None:
    with app(bouncer) as client, console(bouncer) as admin:
        client.execute("BEGIN")
        old_pid = client.execute("SELECT pg_backend_pid()").fetchone()
        bouncer.rewrite_config(databases={
            **bouncer.databases, "app": bouncer.databases["app"] + " application_name=reloaded",
        })
        admin.execute("RELOAD")
        assert row(admin, "SERVERS", database="app")["close_needed"] == 1
        assert client.execute("SELECT pg_backend_pid()").fetchone() == old_pid
        client.execute("COMMIT")
        assert client.execute("SELECT pg_backend_pid()").fetchone() != old_pid
        wait_until(lambda: postgres.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s", params=old_pid) == [])
        assert all(s["close_needed"] == 0 for s in show(admin, "SERVERS"))


def test_an_auth_file_that_cannot_be_read_keeps_the_users(
    operated_pooler: Callable[..., Pooler],
) -> None:
    """A reload of an auth_file saved in Latin-1 (not UTF-8), then of one that is gone: each
    is logged, and the users known so far can still log in (before, the first escaped as an
    exception and the second emptied the user list, locking everyone out)."""
    p = operated_pooler()
    with app(p) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    good = p.userlist_path.read_bytes()
    p.userlist_path.write_bytes(good + b'"caf\xe9" "secret"\n')
    p.reload()
    wait_until(lambda: "not UTF-8" in p.log())
    with app(p) as conn:
        assert conn.execute("SELECT 2").fetchone() == (2,)
    p.userlist_path.unlink()
    p.reload()
    wait_until(lambda: "keeping the users known so far" in p.log().split("not UTF-8", 1)[1])
    with app(p) as conn:
        assert conn.execute("SELECT 3").fetchone() == (3,)
