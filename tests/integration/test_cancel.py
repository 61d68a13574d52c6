"""Query cancellation through the pooler, against a real PostgreSQL: a CancelRequest with
the key the pooler issued reaches the server that client holds, and only that one; an
unknown key is dropped silently (COMPAT.md, "Cancel")."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import asyncpg
import psycopg
import pytest

from pypool.protocol import messages as m
from tests.integration.app_client import CONNECT_TIMEOUT, connect
from tests.integration.polling import wait_for

pytestmark = pytest.mark.timeout(30)



def running(postgres, marker: str) -> int:
    rows = postgres.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active'"
        " AND query LIKE %s AND pid <> pg_backend_pid()",
        params=(f"%{marker}%",),
    )
    assert rows is not None
    return int(rows[0][0])


class Query(threading.Thread):
    """Runs one statement on `conn` in a thread; keeps the result or the error and when."""

    def __init__(self, conn: psycopg.Connection, sql: str) -> None:
        super().__init__(daemon=True)
        self.conn, self.sql = conn, sql
        self.result: object = None
        self.error: BaseException | None = None
        self.finished_at = 0.0

    def run(self) -> None:
        try:
            self.result = self.conn.execute(self.sql).fetchone()
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            self.error = exc
        self.finished_at = time.monotonic()


def test_cancel_reaches_the_right_server(postgres, pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "2"})
    with connect(p.dsn()) as victim, connect(p.dsn()) as bystander:
        slow = Query(victim, "SELECT pg_sleep(10) /* cancel-me */")
        calm = Query(bystander, "SELECT pg_sleep(1.5), 'calm' /* leave-me */")
        slow.start()
        calm.start()
        assert wait_for(lambda: running(postgres, "cancel-me") == 1, 5)
        assert wait_for(lambda: running(postgres, "leave-me") == 1, 5)
        start = time.monotonic()
        victim.cancel_safe(timeout=5)
        slow.join(5)
        calm.join(5)
        assert isinstance(slow.error, psycopg.errors.QueryCanceled), slow.error
        assert slow.finished_at - start < 3
        assert calm.error is None and calm.result == ("", "calm")
        # Both connections go on as usual.
        assert victim.execute("SELECT 1").fetchone()[0] == 1
        assert bystander.execute("SELECT 2").fetchone()[0] == 2
    assert running(postgres, "cancel-me") == 0


def test_cancel_of_an_idle_client_is_harmless(pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "1"})
    with connect(p.dsn()) as idle, connect(p.dsn()) as busy:
        q = Query(busy, "SELECT pg_sleep(0.5), 'done'")
        q.start()
        time.sleep(0.1)
        idle.cancel_safe(timeout=5)  # holds no server: nothing to cancel
        q.join(5)
        assert q.error is None and q.result == ("", "done")
        assert idle.execute("SELECT 3").fetchone()[0] == 3


async def test_asyncpg_timeout_cancels_through_the_pooler(postgres, pooler) -> None:
    p = pooler()
    conn = await asyncpg.connect(p.dsn(), statement_cache_size=0, timeout=CONNECT_TIMEOUT)
    try:
        start = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await conn.fetchval("SELECT pg_sleep(10) /* asyncpg-cancel */", timeout=0.5)
        # asyncpg waits for its cancel to land before the next query can run.
        assert await asyncio.wait_for(conn.fetchval("SELECT 41 + 1"), 5) == 42
        assert time.monotonic() - start < 3
        assert running(postgres, "asyncpg-cancel") == 0
    finally:
        await conn.close()


async def test_psycopg_async_cancel_inside_a_transaction(postgres, pooler) -> None:
    p = pooler()
    conn = await psycopg.AsyncConnection.connect(
        p.dsn(), autocommit=True, connect_timeout=CONNECT_TIMEOUT, prepare_threshold=None
    )
    try:
        await conn.execute("BEGIN")
        pid = (await (await conn.execute("SELECT pg_backend_pid()")).fetchone())[0]
        task = asyncio.create_task(conn.execute("SELECT pg_sleep(10) /* async-cancel */"))
        for _ in range(100):
            if await asyncio.to_thread(running, postgres, "async-cancel"):
                break
            await asyncio.sleep(0.05)
        start = time.monotonic()
        await conn.cancel_safe(timeout=5)
        with pytest.raises(psycopg.errors.QueryCanceled) as info:
            await asyncio.wait_for(task, 5)
        assert info.value.sqlstate == "57014"
        assert time.monotonic() - start < 3
        # Still inside its (now failed) transaction, on the same server.
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        await conn.execute("ROLLBACK")
        # The ROLLBACK ended it there: that backend is idle, not left in its failed
        # transaction. (Which server the next transaction gets is the pool's choice: this
        # one may still be parked until the CancelRequest's connection closes.)
        rows = await asyncio.to_thread(
            postgres.execute, "SELECT state FROM pg_stat_activity WHERE pid = %s", params=(pid,))
        assert rows == [("idle",)]
        await conn.execute("BEGIN")
        assert (await (await conn.execute("SELECT 7")).fetchone())[0] == 7
        await conn.execute("COMMIT")
    finally:
        await conn.close()


def test_unknown_cancel_key_is_dropped_silently(postgres, pooler) -> None:
    p = pooler()
    with connect(p.dsn()) as conn:
        q = Query(conn, "SELECT pg_sleep(1), 'untouched' /* keep-running */")
        q.start()
        assert wait_for(lambda: running(postgres, "keep-running") == 1, 5)
        for pid, secret in ((1234, 5678), (0, 0), (2**31 - 1, 2**32 - 1)):
            with socket.create_connection((p.host, p.port), timeout=5) as sock:
                sock.sendall(m.cancel_request(pid, secret))
                assert sock.recv(1024) == b""  # closed, no answer
        q.join(5)
        assert q.error is None and q.result == ("", "untouched")
        assert conn.execute("SELECT 6").fetchone()[0] == 6
    assert p.proc.poll() is None
