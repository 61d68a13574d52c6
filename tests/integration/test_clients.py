"""Real client programs through the pooler, against a real PostgreSQL: pgbench (select-only,
TPC-B, connect-per-transaction, extended protocol), asyncpg with statement_cache_size=0,
and psql. Outcomes are checked in the data and in pg_stat_activity, not only in exit codes.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg
import psycopg
import pytest

from pypool.embedded import EmbeddedPostgres
from tests.integration.app_client import CONNECT_TIMEOUT
from tests.integration.polling import sampling

pytestmark = pytest.mark.timeout(60)



@contextmanager
def peak_servers(postgres: EmbeddedPostgres, dbname: str) -> Iterator[list[int]]:
    """Yields the counts of `dbname`'s servers sampled while the block runs (max: the peak)."""
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:

        def count() -> int:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                " AND usename = 'app' AND backend_type = 'client backend'",
                (dbname,),
            ).fetchone()
            assert row is not None
            return int(row[0])

        with sampling(count) as samples:
            yield samples


def run_tool(postgres: EmbeddedPostgres, pooler_port: int, tool: str, *args: str,
             dbname: str = "bench", timeout: float = 40) -> str:
    proc = subprocess.run(
        [postgres.tool(tool), "-h", "127.0.0.1", "-p", str(pooler_port), "-U", "app",
         *args, dbname],
        env={**os.environ, "PGPASSWORD": "app-secret", "PGCONNECT_TIMEOUT": "5"},
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, (
        f"{tool} {args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    )
    return proc.stdout


def processed(output: str) -> tuple[int, int]:
    """'number of transactions actually processed: N[/M]' -> (N, M or N)."""
    match = re.search(r"number of transactions actually processed: (\d+)(?:/(\d+))?", output)
    assert match, output
    return int(match.group(1)), int(match.group(2) or match.group(1))


def failed(output: str) -> int:
    match = re.search(r"number of failed transactions: (\d+)", output)
    assert match, output
    return int(match.group(1))


def bench_balances(postgres: EmbeddedPostgres) -> tuple[int, ...]:
    rows = postgres.execute(
        "SELECT (SELECT coalesce(sum(abalance), 0) FROM pgbench_accounts),"
        " (SELECT coalesce(sum(bbalance), 0) FROM pgbench_branches),"
        " (SELECT coalesce(sum(tbalance), 0) FROM pgbench_tellers),"
        " (SELECT coalesce(sum(delta), 0) FROM pgbench_history),"
        " (SELECT count(*) FROM pgbench_history)",
        dbname="bench",
    )
    assert rows is not None
    return tuple(int(v) for v in rows[0])


# -- pgbench ------------------------------------------------------------------------------


def test_pgbench_select_only(postgres, pooler) -> None:
    p = pooler()
    with peak_servers(postgres, "bench") as peak:
        out = run_tool(postgres, p.port, "pgbench", "-S", "-c", "20", "-j", "2", "-T", "3",
                       "-n")
    done, _ = processed(out)
    assert done > 100, out
    assert failed(out) == 0
    assert 1 <= max(peak, default=0) <= 5, peak


def test_pgbench_tpcb_keeps_the_books_balanced(postgres, pooler) -> None:
    p = pooler()
    before = bench_balances(postgres)
    with peak_servers(postgres, "bench") as peak:
        out = run_tool(postgres, p.port, "pgbench", "-c", "8", "-j", "2", "-t", "30", "-n")
    assert processed(out) == (240, 240), out
    assert failed(out) == 0
    assert 1 <= max(peak, default=0) <= 5, peak
    accounts, branches, tellers, history, history_rows = bench_balances(postgres)
    # Every TPC-B transaction moves the same delta in all four tables, or none.
    assert accounts == branches == tellers == history
    assert history_rows == before[4] + 240


def test_pgbench_connect_per_transaction(postgres, pooler) -> None:
    p = pooler()
    with peak_servers(postgres, "bench") as peak:
        out = run_tool(postgres, p.port, "pgbench", "-C", "-S", "-c", "4", "-j", "2",
                       "-t", "25", "-n")
    assert processed(out) == (100, 100), out
    assert failed(out) == 0
    assert 1 <= max(peak, default=0) <= 5, peak


def test_pgbench_extended_protocol(postgres, pooler) -> None:
    p = pooler()
    with peak_servers(postgres, "bench") as peak:
        out = run_tool(postgres, p.port, "pgbench", "-M", "extended", "-c", "8", "-j", "2",
                       "-t", "25", "-n")
    assert processed(out) == (200, 200), out
    assert failed(out) == 0
    assert 1 <= max(peak, default=0) <= 5, peak
    accounts, branches, tellers, history, _ = bench_balances(postgres)
    assert accounts == branches == tellers == history


# -- asyncpg -------------------------------------------------------------------------------


@pytest.fixture
def worker_table(postgres: EmbeddedPostgres) -> Iterator[str]:
    name = f"t_clients_{time.monotonic_ns()}"
    with psycopg.connect(postgres.dsn("app", "app", "app-secret"), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (worker int, n int, label text)")
    yield name
    with psycopg.connect(postgres.dsn("app", "app", "app-secret"), autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}")


async def test_asyncpg_without_statement_cache(postgres, pooler, worker_table) -> None:
    p = pooler()

    async def worker(w: int) -> None:
        conn = await asyncpg.connect(p.dsn(), statement_cache_size=0, timeout=CONNECT_TIMEOUT)
        try:
            for i in range(5):
                assert await conn.fetchval("SELECT $1::int * 2", w * 100 + i) == 2 * (w * 100 + i)
            row = await conn.fetchrow("SELECT $1::text AS label, $2::int AS n", f"w{w}", w)
            assert row is not None and (row["label"], row["n"]) == (f"w{w}", w)
            await conn.executemany(
                f"INSERT INTO {worker_table} VALUES ($1, $2, $3)",
                [(w, n, f"w{w}-{n}") for n in range(10)],
            )
            async with conn.transaction():
                await conn.execute(f"INSERT INTO {worker_table} VALUES ($1, 100, 'kept')", w)
                got = [r["n"] async for r in conn.cursor(
                    f"SELECT n FROM {worker_table} WHERE worker = $1 ORDER BY n", w, prefetch=3
                )]
                assert got == [*range(10), 100]
            with pytest.raises(asyncpg.UniqueViolationError):
                async with conn.transaction():
                    await conn.execute(f"INSERT INTO {worker_table} VALUES ($1, 200, 'lost')", w)
                    raise asyncpg.UniqueViolationError("roll back")
            count = await conn.fetchval(
                f"SELECT count(*) FROM {worker_table} WHERE worker = $1", w
            )
            assert count == 11
        finally:
            await conn.close()

    with peak_servers(postgres, "app") as peak:
        await asyncio.wait_for(asyncio.gather(*(worker(w) for w in range(12))), 40)
    assert 1 <= max(peak, default=0) <= 5, peak
    rows = postgres.execute(
        f"SELECT count(*), count(DISTINCT worker) FROM {worker_table} WHERE label <> 'lost'",
        dbname="app",
    )
    assert rows == [(12 * 11, 12)]


# -- psql ----------------------------------------------------------------------------------


def test_psql(postgres, pooler, tmp_path) -> None:
    p = pooler()
    out = run_tool(postgres, p.port, "psql", "-X", "-At", "-v", "ON_ERROR_STOP=1",
                   "-c", "SELECT 40 + 2", dbname="app")
    assert out.strip() == "42"
    script = tmp_path / "script.sql"
    script.write_text(
        "BEGIN;\n"
        "CREATE TEMP TABLE psql_t (x int) ON COMMIT DROP;\n"
        "INSERT INTO psql_t SELECT generate_series(1, 10);\n"
        "SELECT sum(x) FROM psql_t;\n"
        "COMMIT;\n"
        "SELECT current_database(), current_user;\n"
        "\\copy (SELECT g FROM generate_series(1, 3) g) TO STDOUT\n"
    )
    out = run_tool(postgres, p.port, "psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1",
                   "-f", str(script), dbname="app")
    assert out.split() == ["55", "app|app", "1", "2", "3"]
