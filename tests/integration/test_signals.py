"""Signals, as PgBouncer reads them (COMPAT.md): SIGHUP reloads, SIGINT drains transactions
and exits, SIGTERM drains clients and exits, SIGQUIT exits now, SIGUSR1/SIGUSR2 pause and
resume. Checked from outside, on the `python -m pypool` process itself."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time

import psycopg
import pytest

from pypool.embedded import EmbeddedPostgres
from tests.conftest import rows_in
from tests.integration.app_client import CONNECT_TIMEOUT, connect
from tests.integration.polling import wait_for

pytestmark = pytest.mark.timeout(40)



def refuses_connections(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return False
    except OSError:
        return True


async def max_servers_under_load(postgres: EmbeddedPostgres, dsn: str, clients: int) -> int:
    """Run `clients` concurrent sleepers; the most app servers pg_stat_activity showed."""
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
            while not done.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = 'app'"
                    " AND usename = 'app' AND backend_type = 'client backend'"
                ).fetchone()
                assert row is not None
                peak = max(peak, int(row[0]))
                time.sleep(0.01)

    async def one(i: int) -> int:
        async with await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT, prepare_threshold=None
        ) as conn:
            cur = await conn.execute("SELECT %s::int, pg_sleep(0.2)", (i,))
            row = await cur.fetchone()
            assert row is not None
            return int(row[0])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        got = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(clients))), 20)
    finally:
        done.set()
        sampler.join(5)
    assert got == list(range(clients))
    return peak


async def test_sighup_reloads_pool_size(postgres, pooler, pg_activity) -> None:
    p = pooler(ini_overrides={"default_pool_size": "2"})
    assert await max_servers_under_load(postgres, p.dsn(), 6) == 2
    p.rewrite_config(ini_overrides={"default_pool_size": "4"})
    p.reload()
    await asyncio.sleep(0.3)
    assert await max_servers_under_load(postgres, p.dsn(), 8) in (3, 4)
    # A broken config is refused and the old one stays.
    p.rewrite_config(ini_overrides={"pool_mode": "no-such-mode"})
    p.reload()
    await asyncio.sleep(0.3)
    assert p.proc.poll() is None
    assert await max_servers_under_load(postgres, p.dsn(), 8) in (3, 4)


def test_sigint_lets_transactions_finish_then_exits(postgres, pooler, app_table) -> None:
    p = pooler()
    idle = connect(p.dsn())
    in_tx = connect(p.dsn())
    try:
        idle.execute("SELECT 1")
        in_tx.execute("BEGIN")
        in_tx.execute(f"INSERT INTO {app_table} VALUES (1)")
        p.proc.send_signal(signal.SIGINT)
        assert wait_for(lambda: refuses_connections(p.host, p.port), 3)
        # The client with a transaction finishes it.
        in_tx.execute(f"INSERT INTO {app_table} VALUES (2)")
        assert p.proc.poll() is None
        in_tx.execute("COMMIT")
        p.proc.wait(5)
        assert p.proc.returncode == 0
        # A client without a transaction was told and let go (PgBouncer's words).
        with pytest.raises(psycopg.OperationalError) as info:
            idle.execute("SELECT 1")
        assert "server shutting down" in str(info.value)
    finally:
        idle.close()
        in_tx.close()
    assert rows_in(postgres, app_table) == 2


def test_sigterm_waits_for_clients_then_exits(pooler) -> None:
    p = pooler()
    conn = connect(p.dsn())
    try:
        assert conn.execute("SELECT 1").fetchone()[0] == 1
        p.proc.send_signal(signal.SIGTERM)
        assert wait_for(lambda: refuses_connections(p.host, p.port), 3)
        time.sleep(0.5)
        assert p.proc.poll() is None  # still serving its client
        for i in range(3):
            assert conn.execute("SELECT %s::int", (i,)).fetchone()[0] == i
        conn.execute("BEGIN")
        conn.execute("SELECT 1")
        conn.execute("COMMIT")
        assert p.proc.poll() is None
    finally:
        conn.close()
    p.proc.wait(5)
    assert p.proc.returncode == 0


def test_sigquit_exits_at_once(postgres, pooler, app_table) -> None:
    p = pooler()
    conn = connect(p.dsn())
    try:
        conn.execute("BEGIN")
        conn.execute(f"INSERT INTO {app_table} VALUES (1)")
        start = time.monotonic()
        p.proc.send_signal(signal.SIGQUIT)
        p.proc.wait(5)
        assert time.monotonic() - start < 3
        with pytest.raises(psycopg.OperationalError):
            conn.execute("COMMIT")
    finally:
        conn.close()
    # The open transaction died with its server connection.
    assert rows_in(postgres, app_table) == 0


def test_sigusr1_pauses_sigusr2_resumes(pooler) -> None:
    p = pooler()
    with connect(p.dsn()) as conn:
        assert conn.execute("SELECT 1").fetchone()[0] == 1
        p.proc.send_signal(signal.SIGUSR1)
        time.sleep(0.3)
        result: list[object] = []

        def query() -> None:
            try:
                result.append(conn.execute("SELECT 'after resume'").fetchone()[0])
            except BaseException as exc:  # noqa: BLE001 - checked below
                result.append(exc)

        t = threading.Thread(target=query, daemon=True)
        t.start()
        t.join(1.0)
        assert t.is_alive() and not result, "a query ran while the pooler was paused"
        resumed = time.monotonic()
        p.proc.send_signal(signal.SIGUSR2)
        t.join(5)
        assert result == ["after resume"]
        assert time.monotonic() - resumed < 3
        assert conn.execute("SELECT 2").fetchone()[0] == 2


def test_sigint_tells_a_new_transaction_and_a_queued_client(pooler) -> None:
    p = pooler({"default_pool_size": "1"})
    holder = connect(p.dsn())
    idle = connect(p.dsn())
    queued_error: list[str] = []
    try:
        holder.execute("BEGIN")
        holder.execute("SELECT 1")  # holds the one server

        def queue() -> None:
            try:
                with connect(p.dsn()) as conn:
                    conn.execute("SELECT 1")
            except psycopg.OperationalError as exc:
                queued_error.append(str(exc))

        waiter = threading.Thread(target=queue)
        waiter.start()
        time.sleep(0.5)  # queued behind the holder
        p.proc.send_signal(signal.SIGINT)
        waiter.join(5)
        assert queued_error and "server shutting down" in queued_error[0]
        with pytest.raises(psycopg.OperationalError, match="server shutting down"):
            idle.execute("SELECT 1")  # a new transaction after the signal
        assert holder.execute("SELECT 2").fetchone() == (2,)  # its transaction goes on
        holder.execute("COMMIT")
        p.proc.wait(5)
    finally:
        holder.close()
        idle.close()
    log = p.log()
    assert "got SIGINT, shutting down, waiting for all servers connections to be released" in log
    assert "closing because: server shutting down" in log


def test_sigusr2_during_a_shutdown_is_ignored(pooler) -> None:
    p = pooler()
    conn = connect(p.dsn())
    try:
        conn.execute("SELECT 1")
        p.proc.send_signal(signal.SIGTERM)
        assert wait_for(lambda: "got SIGTERM, shutting down" in p.log(), 3)
        p.proc.send_signal(signal.SIGUSR2)
        assert wait_for(lambda: "got SIGUSR2 while shutting down, ignoring" in p.log(), 3)
        assert conn.execute("SELECT 3").fetchone() == (3,)
    finally:
        conn.close()
    p.proc.wait(5)


def test_sigint_drains_at_transaction_boundaries(postgres, pooler) -> None:
    """The drain: a client between transactions is ended at once, not at the exit; one in
    a transaction block ends at its COMMIT; a session-mode client at its next
    ReadyForQuery 'I', or at once when it sits between transactions holding its server.
    Each is told 57P01 (admin_shutdown), then the pooler exits."""
    from tests.integration.rawclient import RawClient

    server = f"host={postgres.host} port={postgres.port} dbname=app"
    p = pooler({"auth_type": "trust", "shutdown_drain": "1"},
               databases={"app": server, "app_session": f"{server} pool_mode=session"})
    idle, in_tx, session, session_idle = (RawClient(p.host, p.port) for _ in range(4))
    try:
        for client, db in ((idle, "app"), (in_tx, "app"), (session, "app_session"),
                           (session_idle, "app_session")):
            assert client.login("app", db).error is None
            assert client.simple_query("SELECT 1")[0] == [["1"]]
        assert in_tx.simple_query("BEGIN")[2] == ord("T")
        assert session.simple_query("BEGIN")[2] == ord("T")
        p.proc.send_signal(signal.SIGINT)
        assert idle.read_error_and_close()["C"] == "57P01"  # at once
        assert session_idle.read_error_and_close()["C"] == "57P01"
        assert p.proc.poll() is None
        assert in_tx.simple_query("SELECT 2")[0] == [["2"]]
        in_tx.query("COMMIT")
        assert in_tx.read_error_and_close()["C"] == "57P01"  # after its COMMIT's reply
        assert p.proc.poll() is None
        session.query("COMMIT")
        assert session.read_error_and_close()["C"] == "57P01"
        p.proc.wait(5)
        assert p.proc.returncode == 0
    finally:
        for client in (idle, in_tx, session, session_idle):
            client.close()
