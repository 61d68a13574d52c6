"""PgBouncer's guarantees that pypool takes over, against a real PostgreSQL (COMPAT.md): a
queued client is refused after query_wait_timeout and helped by the reserve pool (pipelining
is off by default, so nothing serves it behind another's transaction), query_wait_notify,
transaction_timeout, the admin console past max_client_conn, failing server logins reported
at once to new clients, and a server a cancel is still travelling to handed to no one.

The janitor runs every 0.5 s, so a timeout of 1 s fires between 1 and about 1.6 s.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from typing import Any

import psycopg
import pytest

from pypool.embedded import EmbeddedPostgres, free_port
from pypool.protocol.startup import CANCEL_REQUEST_CODE
from tests.admin.console_client import console, row, show
from tests.conftest import ADMIN_PASSWORD, ADMIN_USER, APP_USER
from tests.integration.app_client import Login, assert_pooler_error, connect
from tests.integration.polling import settle, wait_for
from tests.integration.tcp_pipe import pipe

pytestmark = pytest.mark.timeout(40)

WAIT_NOTICE = "No server connection available in postgres backend, client being queued"






def running(postgres: EmbeddedPostgres, marker: str) -> int:
    """Backends running a query that contains `marker` right now."""
    rows = postgres.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active'"
        " AND query LIKE %s AND pid <> pg_backend_pid()",
        params=(f"%{marker}%",),
    )
    assert rows is not None
    return int(rows[0][0])


def idle_in_transaction(postgres: EmbeddedPostgres) -> int:
    rows = postgres.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = 'app' AND usename = %s"
        " AND state LIKE 'idle in transaction%%'",
        params=(APP_USER,),
    )
    assert rows is not None
    return int(rows[0][0])


class Query(threading.Thread):
    """Runs one statement on `conn` in a thread; keeps the result or the error and when."""

    def __init__(self, conn: psycopg.Connection[Any], sql: str) -> None:
        super().__init__(daemon=True)
        self.conn, self.sql = conn, sql
        self.result: object = None
        self.error: BaseException | None = None
        self.started_at = 0.0
        self.finished_at = 0.0

    def run(self) -> None:
        self.started_at = time.monotonic()
        try:
            self.result = self.conn.execute(self.sql).fetchone()
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            self.error = exc
        self.finished_at = time.monotonic()

    @property
    def elapsed(self) -> float:
        return self.finished_at - self.started_at


class CancelHoldingProxy:
    """A TCP relay in front of PostgreSQL, on 127.0.0.1 and a port of its own, that passes
    ordinary connections straight through but holds each CancelRequest `hold` seconds before
    passing it on: a cancel still travelling, for as long as a test needs. `cut()` stops
    listening and drops every relayed connection: the server has become unreachable."""

    def __init__(self, target_host: str, target_port: int, hold: float = 1.5) -> None:
        self.target = (target_host, target_port)
        self.hold = hold
        self.cancels_received: list[float] = []  # monotonic times
        self.cancels_forwarded: list[float] = []
        self._writers: set[asyncio.StreamWriter] = set()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._server = self._call(self._listen())
        self.port: int = self._server.sockets[0].getsockname()[1]

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(5)

    async def _listen(self) -> asyncio.AbstractServer:
        return await asyncio.start_server(self._relay, "127.0.0.1", 0)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            head = await reader.readexactly(8)
            length, code = struct.unpack("!II", head)
            if length == 16 and code == CANCEL_REQUEST_CODE:
                head += await reader.readexactly(8)
                self.cancels_received.append(time.monotonic())
                await asyncio.sleep(self.hold)
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            self._writers.add(up_writer)
            up_writer.write(head)
            if length == 16 and code == CANCEL_REQUEST_CODE:
                await up_writer.drain()
                self.cancels_forwarded.append(time.monotonic())
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            # PostgreSQL closing a cancel connection closes the pooler's too.
            await pipe(src, dst)
        finally:
            self._writers.discard(dst)

    def cut(self) -> None:
        async def cut() -> None:
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            self._writers.clear()

        self._call(cut())

    def close(self) -> None:
        try:
            self.cut()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)


# -- 1. pipelining off by default: a queued client gets query_wait_timeout ------------------


def test_queued_client_gets_query_wait_timeout_not_a_late_answer(pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "2", "query_wait_timeout": "1"})
    busy = [connect(p.dsn()), connect(p.dsn())]
    third = connect(p.dsn())
    try:
        sleepers = [Query(conn, "SELECT pg_sleep(4), 'slept'") for conn in busy]
        for q in sleepers:
            q.start()
        time.sleep(0.3)  # both servers are in pg_sleep now
        start = time.monotonic()
        with pytest.raises(psycopg.OperationalError) as info:
            third.execute("SELECT 1")
        elapsed = time.monotonic() - start
        assert_pooler_error(info.value, "query_wait_timeout")
        # About 1 s, not served behind a sleeper once its 4 s are over.
        assert 0.9 <= elapsed <= 2.5, elapsed
        for q in sleepers:
            q.join(8)
            assert q.error is None and q.result == ("", "slept"), q.error
    finally:
        for conn in [*busy, third]:
            conn.close()


@pytest.mark.parametrize("where", ["database", "user"])
def test_query_wait_timeout_per_database_and_per_user(pooler, postgres, where) -> None:
    """PgBouncer 1.26: query_wait_timeout in a [databases] entry wins over [pgbouncer]'s,
    and one in [users] over both."""
    server = f"host={postgres.host} port={postgres.port} dbname=app"
    if where == "database":
        databases, users = {"app": f"{server} query_wait_timeout=1"}, ""
    else:
        databases = {"app": f"{server} query_wait_timeout=60"}
        users = "[users]\napp = query_wait_timeout=1\n"
    p = pooler(ini_overrides={"default_pool_size": "1", "query_wait_timeout": "60"},
               databases=databases, extra_sections=users)
    busy, queued = connect(p.dsn()), connect(p.dsn())
    try:
        sleeper = Query(busy, "SELECT pg_sleep(3), 'slept'")
        sleeper.start()
        time.sleep(0.3)
        start = time.monotonic()
        with pytest.raises(psycopg.OperationalError) as info:
            queued.execute("SELECT 1")
        assert_pooler_error(info.value, "query_wait_timeout")
        assert time.monotonic() - start < 2.9  # its own 1 s, not 60 s nor the sleeper's end
        sleeper.join(8)
        assert sleeper.error is None and sleeper.result == ("", "slept")
    finally:
        busy.close()
        queued.close()


def test_pipeline_depth_defaults_to_zero(pooler) -> None:
    p = pooler()
    assert "pipeline_depth" not in p.settings
    with console(p) as admin:
        entry = row(admin, "CONFIG", key="pipeline_depth")
    assert entry["value"] == "0", entry
    assert entry["default"] == "0", entry


# -- 2. the reserve pool --------------------------------------------------------------------


def test_reserve_pool_serves_a_waiter_before_the_busy_server_frees(
    postgres, pooler, pg_activity
) -> None:
    settle(postgres, pg_activity)
    p = pooler(ini_overrides={"default_pool_size": "1", "reserve_pool_size": "1",
                              "reserve_pool_timeout": "0.5", "query_wait_timeout": "10"})
    with connect(p.dsn()) as holder, connect(p.dsn()) as waiter:
        sleeper = Query(holder, "SELECT pg_sleep(3), 'slept' /* reserve-holder */")
        sleeper.start()
        assert wait_for(lambda: running(postgres, "reserve-holder") == 1, 5)
        start = time.monotonic()
        assert waiter.execute("SELECT 7").fetchone()[0] == 7
        elapsed = time.monotonic() - start
        # reserve_pool_timeout (0.5 s) plus a janitor round, well before the 3 s sleep ends.
        assert 0.4 <= elapsed <= 2.0, elapsed
        assert sleeper.is_alive(), "served only once the holder's server was free"
        assert pg_activity(postgres, "app", APP_USER) == 2  # the pool's server and a reserve one
        sleeper.join(5)
        assert sleeper.error is None and sleeper.result == ("", "slept")


# -- 3. query_wait_notify ---------------------------------------------------------------


def _queued_query_notices(
    p, postgres: EmbeddedPostgres
) -> tuple[object, list[tuple[str | None, str | None]]]:
    """Run a query queued ~3 s behind another client's pg_sleep(3); its result and the
    (severity, message) of each notice it got."""
    notices: list[tuple[str | None, str | None]] = []
    with connect(p.dsn()) as holder, connect(p.dsn()) as waiter:
        # A Diagnostic is only valid inside the handler: copy what is asserted.
        waiter.add_notice_handler(lambda d: notices.append((d.severity, d.message_primary)))
        sleeper = Query(holder, "SELECT pg_sleep(3) /* notify-holder */")
        sleeper.start()
        assert wait_for(lambda: running(postgres, "notify-holder") == 1, 5)
        start = time.monotonic()
        result = waiter.execute("SELECT 'queued'").fetchone()
        assert time.monotonic() - start >= 2.0  # it really was queued
        sleeper.join(5)
        assert sleeper.error is None
    return result, notices


def test_query_wait_notify_tells_a_queued_client(postgres, pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "1", "query_wait_notify": "1",
                              "query_wait_timeout": "10"})
    result, notices = _queued_query_notices(p, postgres)
    assert result == ("queued",)
    assert notices == [("NOTICE", WAIT_NOTICE)]  # once, not every janitor round


def test_query_wait_notify_zero_sends_no_notice(postgres, pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "1", "query_wait_notify": "0",
                              "query_wait_timeout": "10"})
    result, notices = _queued_query_notices(p, postgres)
    assert result == ("queued",)
    assert notices == []


def test_query_wait_timeout_at_login_without_query_wait_notify(pooler) -> None:
    p = pooler(ini_overrides={"max_db_connections": "1", "query_wait_timeout": "1",
                              "query_wait_notify": "0"})
    with connect(p.dsn()) as holder:
        holder.execute("BEGIN")
        holder.execute("SELECT 1")
        start = time.monotonic()
        with pytest.raises(psycopg.OperationalError) as info:
            connect(p.dsn(user=ADMIN_USER, password=ADMIN_PASSWORD))  # waits at login
        assert "query_wait_timeout" in str(info.value), str(info.value)
        assert time.monotonic() - start <= 3.5
        holder.execute("COMMIT")


def test_query_wait_timeout_zero_lets_a_login_wait_on(pooler) -> None:
    p = pooler(ini_overrides={"max_db_connections": "1", "query_wait_timeout": "0"})
    with connect(p.dsn()) as holder:
        holder.execute("BEGIN")
        holder.execute("SELECT 1")
        late: list[object] = []

        def log_in() -> None:
            try:
                with connect(p.dsn(user=ADMIN_USER, password=ADMIN_PASSWORD)) as conn:
                    late.append(conn.execute("SELECT current_user").fetchone()[0])
            except psycopg.Error as exc:
                late.append(exc)

        t = threading.Thread(target=log_in, daemon=True)
        t.start()
        time.sleep(1.5)  # three janitor rounds with the login waiting
        holder.execute("COMMIT")
        t.join(8)
    assert late == [ADMIN_USER], late


# -- 4. transaction_timeout -------------------------------------------------------------


def _transaction_cut(p, postgres: EmbeddedPostgres) -> None:
    """BEGIN; SELECT 1; 2 s idle: the next query fails and no backend is left in it."""
    with connect(p.dsn()) as conn:
        conn.execute("BEGIN")
        conn.execute("SELECT 1")
        assert idle_in_transaction(postgres) == 1
        time.sleep(2)
        with pytest.raises(psycopg.OperationalError) as info:
            conn.execute("SELECT 1")
    assert_pooler_error(info.value, "transaction timeout")
    assert wait_for(lambda: idle_in_transaction(postgres) == 0, 3), idle_in_transaction(postgres)
    with connect(p.dsn()) as conn:  # and the pool serves on
        assert conn.execute("SELECT 8").fetchone()[0] == 8


def test_transaction_timeout(postgres, pooler, pg_activity) -> None:
    settle(postgres, pg_activity)
    p = pooler(ini_overrides={"transaction_timeout": "1"})
    with connect(p.dsn()) as conn:  # a short transaction is left alone
        conn.execute("BEGIN")
        conn.execute("SELECT pg_sleep(0.3)")
        conn.execute("COMMIT")
    _transaction_cut(p, postgres)


def test_transaction_timeout_per_user(postgres, pooler, pg_activity) -> None:
    settle(postgres, pg_activity)
    p = pooler(extra_sections=f"[users]\n{APP_USER} = transaction_timeout=1")
    assert "transaction_timeout" not in p.settings  # no global value
    # Another user's transaction is not bound by app's limit.
    with connect(p.dsn(user=ADMIN_USER, password=ADMIN_PASSWORD)) as other:
        other.execute("BEGIN")
        other.execute("SELECT 1")
        _transaction_cut(p, postgres)
        assert other.execute("SELECT 9").fetchone()[0] == 9
        other.execute("COMMIT")


def test_transaction_timeout_zero_for_a_user_turns_the_global_one_off(postgres, pooler,
                                                                      pg_activity) -> None:
    settle(postgres, pg_activity)
    p = pooler(ini_overrides={"transaction_timeout": "1"},
               extra_sections=f"[users]\n{ADMIN_USER} = transaction_timeout=0")
    with connect(p.dsn(user=ADMIN_USER, password=ADMIN_PASSWORD)) as exempt:
        exempt.execute("BEGIN")
        exempt.execute("SELECT 1")
        _transaction_cut(p, postgres)  # app's transaction is cut after 1 s
        assert exempt.execute("SELECT 9").fetchone()[0] == 9  # 2 s in, still open
        exempt.execute("COMMIT")


# -- 5. the admin console past max_client_conn --------------------------------------------


def test_admin_console_reachable_when_max_client_conn_is_reached(pooler) -> None:
    p = pooler(ini_overrides={"max_client_conn": "2"})
    clients = [connect(p.dsn()), connect(p.dsn())]
    try:
        for conn in clients:
            assert conn.execute("SELECT 1").fetchone()[0] == 1
        with pytest.raises(psycopg.OperationalError) as info:
            connect(p.dsn())
        assert "no more connections allowed (max_client_conn)" in str(info.value)
        with console(p) as admin:
            pools = show(admin, "POOLS")
            app = [r for r in pools if r["database"] == "app" and r["user"] == APP_USER]
            assert len(app) == 1 and app[0]["cl_active"] == 2, pools
        # The console did not open a slot for applications.
        with pytest.raises(psycopg.OperationalError) as again:
            connect(p.dsn())
        assert "no more connections allowed (max_client_conn)" in str(again.value)
        for conn in clients:
            assert conn.execute("SELECT 2").fetchone()[0] == 2
    finally:
        for conn in clients:
            conn.close()


# -- 6. server logins failing: new clients told at once, queued ones wait for a retry ------
#
# As PgBouncer: a server that cannot be reached (connect refused or timed out) is no verdict
# on the login, so the clients queued for it keep waiting for the next try, after
# server_login_retry, or for query_wait_timeout; a client that comes while logins are
# failing and no server can serve it gets the cached error at once. A server that refuses
# the login fails its waiting clients with its own error.


def _fails_fast(dsn: str, limit: float = 2.0) -> psycopg.OperationalError:
    start = time.monotonic()
    with pytest.raises(psycopg.OperationalError) as info:
        with connect(dsn) as conn:
            conn.execute("SELECT 1")
    assert time.monotonic() - start <= limit, (time.monotonic() - start, str(info.value))
    return info.value


def test_unreachable_server_fails_new_clients_at_once(pooler) -> None:
    dead = free_port()
    p = pooler(ini_overrides={"query_wait_timeout": "4"},
               databases={"app": f"host=127.0.0.1 port={dead} dbname=app"})
    first = Login(p.dsn())
    assert wait_for(lambda: "server login failed" in p.log(), 3), p.log()
    # The connect failed: new clients hear so at once, for server_login_retry (15 s).
    for _ in range(2):
        cached = _fails_fast(p.dsn())
        assert "server login has been failing, cached error: server connection failed" in str(
            cached), str(cached)
        assert "(server_login_retry)" in str(cached)
    # The one that was queued when it failed waits on, for a retry or its timeout.
    assert first.is_alive(), first.error
    first.join(6)
    assert not first.is_alive()
    assert isinstance(first.error, psycopg.OperationalError), first.error
    assert "query_wait_timeout" in str(first.error), str(first.error)
    assert first.elapsed >= 3.5, first.elapsed
    assert p.proc.poll() is None


def test_wrong_server_password_fails_new_clients_at_once(postgres, pooler) -> None:
    server = f"host={postgres.host} port={postgres.port}"
    p = pooler(ini_overrides={"query_wait_timeout": "30"},
               databases={"app": f"{server} dbname=app user={APP_USER} password=wrong"})
    first = _fails_fast(p.dsn())
    assert "password authentication failed" in str(first), str(first)
    assert "server login has been failing" not in str(first)
    cached = _fails_fast(p.dsn())
    assert "server login has been failing, cached error: " in str(cached), str(cached)
    assert "password authentication failed" in str(cached)
    assert "(server_login_retry)" in str(cached)


def test_working_pool_whose_server_vanishes(postgres, pooler) -> None:
    """The pool's server dies and cannot be reached again: the queued client waits for a
    retry until query_wait_timeout; connected and new clients asking for a server are told
    at once."""
    proxy = CancelHoldingProxy(postgres.host, postgres.port)
    try:
        p = pooler(ini_overrides={"default_pool_size": "1", "query_wait_timeout": "4"},
                   databases={"app": f"host=127.0.0.1 port={proxy.port} dbname=app"})
        with connect(p.dsn()) as holder, connect(p.dsn()) as waiter, \
                connect(p.dsn()) as idle:
            assert idle.execute("SELECT 1").fetchone()[0] == 1  # the pool works
            holder.execute("BEGIN")
            holder.execute("SELECT 1")
            queued = Query(waiter, "SELECT 'never'")
            queued.start()
            with console(p) as admin:
                assert wait_for(lambda: row(admin, "POOLS", database="app")["cl_waiting"] == 1,
                                3)
            proxy.cut()  # the server dies and cannot be reached again
            with pytest.raises(psycopg.OperationalError):
                holder.execute("SELECT 1")  # its server is gone
            assert wait_for(lambda: "server login failed" in p.log(), 3), p.log()
            # A connected client asking for a server now, and a new one, hear it at once.
            start = time.monotonic()
            with pytest.raises(psycopg.OperationalError) as info:
                idle.execute("SELECT 1")
            assert time.monotonic() - start <= 2.0
            assert "server login has been failing, cached error: " in str(info.value)
            fresh = _fails_fast(p.dsn())
            assert "server login has been failing, cached error: " in str(fresh), str(fresh)
            assert queued.is_alive(), queued.error  # queued before: waits for a retry
            queued.join(6)
            assert not queued.is_alive(), "the waiting client is still waiting"
            assert isinstance(queued.error, psycopg.OperationalError), queued.error
            assert "query_wait_timeout" in str(queued.error), str(queued.error)
            assert queued.elapsed >= 3.5, queued.elapsed
    finally:
        proxy.close()


def test_reload_to_an_unreachable_server(postgres, pooler) -> None:
    """The server moved (per the reloaded config) to where nothing listens: RECONNECT-style
    replacement of the pool's servers fails; its queued client waits for a retry until
    query_wait_timeout, a new client hears the cached error at once."""
    p = pooler(ini_overrides={"default_pool_size": "1", "query_wait_timeout": "4"})
    with connect(p.dsn()) as holder, connect(p.dsn()) as waiter:
        holder.execute("BEGIN")
        holder.execute("SELECT 1")
        dead = free_port()
        p.rewrite_config(databases={"app": f"host=127.0.0.1 port={dead} dbname=app"})
        p.reload()
        assert wait_for(lambda: "configuration reloaded" in p.log(), 5), p.log()
        queued = Query(waiter, "SELECT 'never'")
        queued.start()
        time.sleep(0.3)
        holder.execute("COMMIT")  # its server is closed now: the config changed
        assert wait_for(lambda: "server login failed" in p.log(), 3), p.log()
        cached = _fails_fast(p.dsn())
        assert "server login has been failing, cached error: " in str(cached), str(cached)
        queued.join(6)
        assert not queued.is_alive(), "the waiting client is still waiting"
        assert isinstance(queued.error, psycopg.OperationalError), queued.error
        assert "query_wait_timeout" in str(queued.error), str(queued.error)


# -- 7. cancel isolation: sv_being_canceled ---------------------------------------------


def test_server_is_held_until_the_cancel_lands(postgres, pooler) -> None:
    """Client A's cancel takes 1.5 s to reach PostgreSQL, A's query ends before that. The
    server must wait in being_canceled until the cancel has landed (on an idle backend,
    harmlessly); handed to queued client B at once, B's 2 s query would be the one
    cancelled."""
    proxy = CancelHoldingProxy(postgres.host, postgres.port, hold=1.5)
    try:
        p = pooler(ini_overrides={"default_pool_size": "1", "query_wait_timeout": "30"},
                   databases={"app": f"host=127.0.0.1 port={proxy.port} dbname=app"})
        with connect(p.dsn()) as a, connect(p.dsn()) as b, console(p) as admin:
            assert a.execute("SELECT 1").fetchone()[0] == 1
            qa = Query(a, "SELECT pg_sleep(0.6), 'a' /* held-cancel-a */")
            qa.start()
            assert wait_for(lambda: running(postgres, "held-cancel-a") == 1, 3)
            a.cancel_safe(timeout=5)
            assert wait_for(lambda: proxy.cancels_received, 2), "the cancel never left"
            qb = Query(b, "SELECT pg_sleep(2), 'b' /* after-cancel-b */")
            qb.start()

            def pool() -> dict[str, Any]:
                return row(admin, "POOLS", database="app", user=APP_USER)

            assert wait_for(lambda: pool()["sv_being_canceled"] == 1, 2), pool()
            # While parked: A is done, B still queued, nobody runs on the server.
            parked = pool()
            assert not proxy.cancels_forwarded, "cancel landed before the check"
            assert parked["cl_waiting"] == 1 and parked["sv_active"] == 0, parked
            assert running(postgres, "after-cancel-b") == 0
            qa.join(5)
            assert qa.error is None and qa.result == ("", "a"), qa.error
            qb.join(10)
            assert qb.error is None, qb.error
            assert qb.result == ("", "b")
            assert proxy.cancels_forwarded
            assert qb.finished_at - proxy.cancels_forwarded[0] >= 1.9  # began after it landed
            after = pool()
            assert after["sv_being_canceled"] == 0 and after["sv_idle"] == 1, after
            assert a.execute("SELECT 10").fetchone()[0] == 10
            assert b.execute("SELECT 11").fetchone()[0] == 11
    finally:
        proxy.close()


def _cancel_a_short_query(postgres: EmbeddedPostgres, conn: psycopg.Connection[Any],
                          marker: str) -> int:
    """Run a 0.3 s query on `conn` and cancel it while it runs; the cancel is still held by
    the proxy when the query ends on its own. Returns the backend pid it ran on."""
    pid = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
    query = Query(conn, f"SELECT pg_sleep(0.3), 'a' /* {marker} */")
    query.start()
    assert wait_for(lambda: running(postgres, marker) == 1, 3)
    conn.cancel_safe(timeout=5)
    query.join(5)
    assert query.error is None, query.error
    return pid


def test_reconnect_closes_a_server_parked_for_its_cancel(postgres, pooler) -> None:
    """RECONNECT while a server waits in being_canceled: when its cancel lands it is closed,
    not put back idle, and the next query runs on a new backend."""
    proxy = CancelHoldingProxy(postgres.host, postgres.port, hold=1.5)
    try:
        p = pooler(ini_overrides={"default_pool_size": "1", "query_wait_timeout": "30"},
                   databases={"app": f"host=127.0.0.1 port={proxy.port} dbname=app"})
        with connect(p.dsn()) as a, console(p) as admin:
            old_pid = _cancel_a_short_query(postgres, a, "parked-reconnect-a")

            def pool() -> dict[str, Any]:
                return row(admin, "POOLS", database="app", user=APP_USER)

            assert wait_for(lambda: pool()["sv_being_canceled"] == 1, 2), pool()
            admin.execute("RECONNECT app")
            assert wait_for(lambda: bool(proxy.cancels_forwarded), 5), "the cancel never landed"
            assert wait_for(lambda: pool()["sv_being_canceled"] == 0, 3), pool()

            def old_backend_gone() -> bool:
                rows = postgres.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                        params=(old_pid,))
                return rows is not None and rows[0][0] == 0

            assert wait_for(old_backend_gone, 5), "the parked server went back to the pool"
            assert a.execute("SELECT pg_backend_pid()").fetchone()[0] != old_pid
    finally:
        proxy.close()


def test_a_cancel_that_does_not_land_in_cancel_wait_timeout_closes_its_server(
        postgres, pooler) -> None:
    """The cancel is held 3 s, cancel_wait_timeout is 1 s: the server it was aimed at could
    still be hit later, so it is closed, never handed on."""
    proxy = CancelHoldingProxy(postgres.host, postgres.port, hold=3.0)
    try:
        p = pooler(ini_overrides={"default_pool_size": "1", "query_wait_timeout": "30",
                                  "cancel_wait_timeout": "1"},
                   databases={"app": f"host=127.0.0.1 port={proxy.port} dbname=app"})
        with connect(p.dsn()) as a, console(p) as admin:
            old_pid = _cancel_a_short_query(postgres, a, "late-cancel-a")
            assert not proxy.cancels_forwarded
            assert wait_for(lambda: "cancel request failed: cancel_wait_timeout" in p.log(), 3)

            def pool() -> dict[str, Any]:
                return row(admin, "POOLS", database="app", user=APP_USER)

            assert wait_for(lambda: pool()["sv_being_canceled"] == 0, 3), pool()
            assert a.execute("SELECT pg_backend_pid()").fetchone()[0] != old_pid
    finally:
        proxy.close()
