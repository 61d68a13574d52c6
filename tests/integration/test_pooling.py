"""Pooling correctness against a real PostgreSQL: how many servers the pooler opens, who
gets which one and when, and the caps and modes that govern that.

Server counts are read from pg_stat_activity (PostgreSQL's own view), never from the
pooler's bookkeeping, so a pooler that miscounts is caught.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest

from pypool.embedded import EmbeddedPostgres
from tests.integration.app_client import CONNECT_TIMEOUT, connect
from tests.integration.polling import wait_for

pytestmark = pytest.mark.timeout(40)



# -- helpers ---------------------------------------------------------------------------


def settle(postgres: EmbeddedPostgres, pg_activity: Callable[..., int],
           dbname: str = "app") -> None:
    """Wait for backends left over from an earlier test's pooler to exit."""
    assert wait_for(lambda: pg_activity(postgres, dbname, "app") == 0, 5), (
        f"{pg_activity(postgres, dbname, 'app')} stale server connections on {dbname}"
    )


class ActivitySampler:
    """Samples pg_stat_activity in a thread and remembers the largest server count seen."""

    def __init__(self, postgres: EmbeddedPostgres, dbnames: tuple[str, ...] = ("app",),
                 usename: str = "app") -> None:
        self.postgres = postgres
        self.dbnames = list(dbnames)
        self.usename = usename
        self.max = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.postgres.dsn(), autocommit=True, connect_timeout=5) as conn:
            while not self._stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = ANY(%s)"
                    " AND usename = %s AND backend_type = 'client backend'",
                    (self.dbnames, self.usename),
                ).fetchone()
                assert row is not None
                self.max = max(self.max, int(row[0]))
                self.samples += 1
                time.sleep(0.01)

    def __enter__(self) -> ActivitySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@contextmanager
def sampling(postgres: EmbeddedPostgres, *dbnames: str) -> Iterator[ActivitySampler]:
    with ActivitySampler(postgres, dbnames or ("app",)) as sampler:
        yield sampler
    assert sampler.samples > 0


async def run_concurrently(dsn: str, n: int, queries: int, sleep: float) -> list[list[int]]:
    """`n` psycopg async clients, each running `queries` queries; the values they got."""

    async def one(i: int) -> list[int]:
        conn = await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT, prepare_threshold=None
        )
        async with conn:
            got = []
            for q in range(queries):
                cur = await conn.execute(
                    "SELECT %s::int * 1000 + %s::int, pg_sleep(%s)", (i, q, sleep)
                )
                row = await cur.fetchone()
                assert row is not None
                got.append(row[0])
            return got

    return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), 30)


# -- pool size -------------------------------------------------------------------------


async def test_fifty_clients_share_five_servers(postgres, pooler, pg_activity) -> None:
    settle(postgres, pg_activity)
    p = pooler()
    with sampling(postgres) as sampler:
        results = await run_concurrently(p.dsn(), n=50, queries=4, sleep=0.02)
    assert results == [[i * 1000 + q for q in range(4)] for i in range(50)]
    assert 1 <= sampler.max <= 5, sampler.max
    assert pg_activity(postgres) <= 5


def test_transaction_keeps_its_server_while_others_proceed(postgres, pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "2"})
    with connect(p.dsn()) as holder, connect(p.dsn()) as other1, connect(p.dsn()) as other2:
        holder.execute("BEGIN")
        pid = holder.execute("SELECT pg_backend_pid()").fetchone()[0]
        seen = set()
        for _ in range(5):
            for other in (other1, other2):
                seen.add(other.execute("SELECT pg_backend_pid()").fetchone()[0])
            assert holder.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
        # Pool size 2, one server held: everybody else shares the other one.
        assert seen and pid not in seen and len(seen) == 1
        assert holder.execute("SELECT now() = statement_timestamp()").fetchone()[0] is False
        holder.execute("COMMIT")


def test_idle_servers_are_reused_last_in_first_out(postgres, pooler, pg_activity) -> None:
    settle(postgres, pg_activity)
    p = pooler()
    conns = [connect(p.dsn()) for _ in range(4)]
    try:
        # Four transactions at once open four servers.
        pids = set()
        for conn in conns:
            conn.execute("BEGIN")
            pids.add(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        assert len(pids) == 4
        for conn in conns:
            conn.execute("COMMIT")
        assert pg_activity(postgres) == 4
        # Sequential work: the most recently released server serves it all.
        used = [conns[i % 4].execute("SELECT pg_backend_pid()").fetchone()[0]
                for i in range(12)]
        assert len(set(used)) == 1, used
    finally:
        for conn in conns:
            conn.close()


def test_waiting_clients_are_served_first_in_first_out(postgres, pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "1"})
    served: dict[int, float] = {}
    errors: list[BaseException] = []

    def waiter(i: int, conn: psycopg.Connection) -> None:
        try:
            served[i] = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0]
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    holder = connect(p.dsn())
    waiters = [connect(p.dsn()) for _ in range(5)]
    try:
        holder.execute("BEGIN")
        holder.execute("SELECT 1")
        threads = []
        for i, conn in enumerate(waiters):
            t = threading.Thread(target=waiter, args=(i, conn))
            t.start()
            threads.append(t)
            time.sleep(0.1)  # queue them in a known order
        assert not served, "a waiter got the only server while it was held"
        holder.execute("COMMIT")
        for t in threads:
            t.join(10)
        assert not errors, errors
        order = sorted(served, key=lambda i: served[i])
        assert order == [0, 1, 2, 3, 4]
    finally:
        for conn in [holder, *waiters]:
            conn.close()


def test_min_pool_size_opens_servers_without_clients(postgres, pooler, pg_activity) -> None:
    settle(postgres, pg_activity)
    server = f"host={postgres.host} port={postgres.port}"
    pooler(
        ini_overrides={"server_idle_timeout": "0.5"},
        databases={"app": f"{server} dbname=app user=app min_pool_size=3"},
    )
    assert wait_for(lambda: pg_activity(postgres) == 3, 5), pg_activity(postgres)
    # server_idle_timeout does not shrink the pool below min_pool_size.
    time.sleep(1.2)
    assert pg_activity(postgres) == 3


def test_min_pool_size_refills_after_servers_die(postgres, pooler, pg_activity) -> None:
    settle(postgres, pg_activity)
    server = f"host={postgres.host} port={postgres.port}"
    p = pooler(databases={"app": f"{server} dbname=app user=app min_pool_size=2"})
    assert wait_for(lambda: pg_activity(postgres) == 2, 5)
    postgres.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = 'app' AND usename = 'app' AND backend_type = 'client backend'"
    )
    assert wait_for(lambda: pg_activity(postgres) == 2, 5), pg_activity(postgres)
    with connect(p.dsn()) as conn:
        assert conn.execute("SELECT 42").fetchone()[0] == 42


def test_reserve_pool_opens_after_reserve_pool_timeout(postgres, pooler, pg_activity) -> None:
    settle(postgres, pg_activity)
    p = pooler(ini_overrides={"default_pool_size": "1", "reserve_pool_size": "2",
                              "reserve_pool_timeout": "1"})
    holder = connect(p.dsn())
    waiter = connect(p.dsn())
    done: list[float] = []
    try:
        holder.execute("BEGIN")
        holder.execute("SELECT 1")
        start = time.monotonic()

        def wait() -> None:
            waiter.execute("SELECT 1")
            done.append(time.monotonic() - start)

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.6)
        assert not done, "served before reserve_pool_timeout with the pool full"
        assert pg_activity(postgres) == 1
        t.join(5)
        assert done, "the reserve pool never opened"
        assert 0.9 <= done[0] <= 4.0, done
        assert pg_activity(postgres) == 2  # one reserve server for one waiter
        holder.execute("COMMIT")
    finally:
        holder.close()
        waiter.close()


async def test_max_db_connections_caps_servers(postgres, pooler, pg_activity) -> None:
    settle(postgres, pg_activity)
    p = pooler(ini_overrides={"max_db_connections": "2"})
    with sampling(postgres) as sampler:
        results = await run_concurrently(p.dsn(), n=10, queries=3, sleep=0.05)
    assert results == [[i * 1000 + q for q in range(3)] for i in range(10)]
    assert sampler.max == 2


async def test_max_db_connections_per_database_entry(postgres, pooler, pg_activity) -> None:
    settle(postgres, pg_activity)
    server = f"host={postgres.host} port={postgres.port}"
    p = pooler(databases={"app": f"{server} dbname=app max_db_connections=3"})
    with sampling(postgres) as sampler:
        results = await run_concurrently(p.dsn(), n=10, queries=3, sleep=0.05)
    assert results == [[i * 1000 + q for q in range(3)] for i in range(10)]
    assert sampler.max == 3


async def test_max_user_connections_caps_servers_across_databases(
    postgres, pooler, pg_activity
) -> None:
    settle(postgres, pg_activity)
    settle(postgres, pg_activity, "bench")
    p = pooler(ini_overrides={"max_user_connections": "3"})
    with sampling(postgres, "app", "bench") as sampler:
        results = await asyncio.gather(
            run_concurrently(p.dsn("app"), n=6, queries=3, sleep=0.05),
            run_concurrently(p.dsn("bench"), n=6, queries=3, sleep=0.05),
        )
    expected = [[i * 1000 + q for q in range(3)] for i in range(6)]
    assert results == [expected, expected]
    assert 1 <= sampler.max <= 3, sampler.max


def test_max_user_connections_lets_another_pool_in_when_one_is_idle(
    postgres, pooler, pg_activity
) -> None:
    """Idle servers of one pool must not starve another pool of the same user forever:
    PgBouncer closes an idle server of the user to make room."""
    settle(postgres, pg_activity)
    settle(postgres, pg_activity, "bench")
    p = pooler(ini_overrides={"max_user_connections": "2", "query_wait_timeout": "3"})
    a1, a2 = connect(p.dsn("app")), connect(p.dsn("app"))
    try:
        a1.execute("BEGIN")
        a2.execute("BEGIN")
        a1.execute("SELECT 1")
        a2.execute("SELECT 1")
        a1.execute("COMMIT")
        a2.execute("COMMIT")
        assert pg_activity(postgres, "app", "app") == 2
        with connect(p.dsn("bench")) as b:
            start = time.monotonic()
            assert b.execute("SELECT current_database()").fetchone()[0] == "bench"
            assert time.monotonic() - start < 2
    finally:
        a1.close()
        a2.close()


def test_max_client_conn(pooler) -> None:
    p = pooler(ini_overrides={"max_client_conn": "3"})
    conns = [connect(p.dsn()) for _ in range(3)]
    try:
        with pytest.raises(psycopg.OperationalError) as info:
            connect(p.dsn())
        assert "no more connections allowed (max_client_conn)" in str(info.value)
        for conn in conns:
            assert conn.execute("SELECT 1").fetchone()[0] == 1
        conns.pop().close()
        # The slot is free again once a client leaves.
        assert wait_for(lambda: _can_connect(p.dsn()), 3)
    finally:
        for conn in conns:
            conn.close()


def _can_connect(dsn: str) -> bool:
    try:
        with connect(dsn) as conn:
            return conn.execute("SELECT 1").fetchone()[0] == 1
    except psycopg.OperationalError:
        return False


# -- pool modes ------------------------------------------------------------------------


def test_session_mode_keeps_one_server_per_client(postgres, pooler, pg_activity) -> None:
    settle(postgres, pg_activity)
    p = pooler(ini_overrides={"pool_mode": "session", "default_pool_size": "2"})
    with connect(p.dsn()) as a, connect(p.dsn()) as b:
        pids_a = {a.execute("SELECT pg_backend_pid()").fetchone()[0] for _ in range(5)}
        pids_b = {b.execute("SELECT pg_backend_pid()").fetchone()[0] for _ in range(5)}
        assert len(pids_a) == 1 and len(pids_b) == 1 and pids_a != pids_b
        assert pg_activity(postgres) == 2


def test_session_mode_resets_the_server_between_clients(postgres, pooler) -> None:
    p = pooler(ini_overrides={"pool_mode": "session", "default_pool_size": "1"})
    with connect(p.dsn()) as a:
        pid = a.execute("SELECT pg_backend_pid()").fetchone()[0]
        a.execute("CREATE TEMP TABLE leak_check (x int)")
        a.execute("SET work_mem = '7MB'")
        a.execute("PREPARE leaked AS SELECT 1")
        assert a.execute("SHOW work_mem").fetchone()[0] == "7MB"
    with connect(p.dsn()) as b:
        assert b.execute("SELECT pg_backend_pid()").fetchone()[0] == pid  # same server
        assert b.execute("SELECT to_regclass('pg_temp.leak_check')").fetchone()[0] is None
        assert b.execute("SHOW work_mem").fetchone()[0] != "7MB"
        assert b.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE name = 'leaked'"
        ).fetchone()[0] == 0


def test_statement_mode_rejects_transaction_blocks(pooler) -> None:
    p = pooler(ini_overrides={"pool_mode": "statement"})
    with connect(p.dsn()) as conn:
        assert conn.execute("SELECT 7").fetchone()[0] == 7
        with pytest.raises(psycopg.Error) as info:
            conn.execute("BEGIN")
        assert "transaction blocks not allowed in statement pooling mode" in str(info.value)
        assert info.value.sqlstate == "08P01" and info.value.diag.severity == "FATAL"
        assert conn.closed
    with connect(p.dsn()) as conn:  # the pooler keeps serving, on a clean server
        assert conn.execute("SELECT now() = statement_timestamp()").fetchone()[0] is True
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_star_entry_is_the_fallback_database(postgres, pooler) -> None:
    server = f"host={postgres.host} port={postgres.port}"
    p = pooler(databases={"app": f"{server} dbname=app", "*": server})
    with connect(p.dsn("bench")) as conn:
        assert conn.execute("SELECT current_database()").fetchone()[0] == "bench"
    with connect(p.dsn("app")) as conn:
        assert conn.execute("SELECT current_database()").fetchone()[0] == "app"
    # A name the server does not have: PostgreSQL's own error comes back.
    with pytest.raises(psycopg.OperationalError) as info:
        connect(p.dsn("no_such_db_here"))
    assert 'database "no_such_db_here" does not exist' in str(info.value)


def test_unknown_database_without_star_entry(postgres, pooler) -> None:
    p = pooler()
    with pytest.raises(psycopg.OperationalError) as info:
        connect(p.dsn("nowhere"))
    assert "no such database: nowhere" in str(info.value)
    with connect(p.dsn()) as conn:
        assert conn.execute("SELECT 1").fetchone()[0] == 1


def test_listen_addr_star_listens_on_every_address(pooler) -> None:
    """`listen_addr = *`, PgBouncer's "every address": pypool starts and serves on loopback."""
    p = pooler(ini_overrides={"listen_addr": "*"})
    with connect(p.dsn()) as conn:
        assert conn.execute("SELECT 1").fetchone()[0] == 1
    assert p.proc.poll() is None
