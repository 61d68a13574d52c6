"""Real client libraries that prepare statements by default, through a pool smaller than
their connection count (max_prepared_statements on, transaction pooling).

Each of these breaks under a transaction pooler that passes statement names through:
the next transaction lands on another server, where the statement does not exist (or
another client's statement of the same name does).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import textwrap

import pytest

from .node_clients import node_pg

APP_PASSWORD = "app-secret"

QUERIES = [
    ("SELECT $1::int + 1", lambda i: i + 1),
    ("SELECT $1::int * 2", lambda i: i * 2),
    ("SELECT length($1::int::text)", lambda i: len(str(i))),
    ("SELECT $1::int - 7", lambda i: i - 7),
]


async def test_asyncpg_with_its_default_statement_cache(pooler):
    """A pool of 20 asyncpg connections, ~2000 fetches at once, over 5 servers."""
    asyncpg = pytest.importorskip("asyncpg")
    p = pooler(ini_overrides={"default_pool_size": "5"})
    pool = await asyncpg.create_pool(p.dsn(), min_size=20, max_size=20)
    try:
        async def fetch(i: int) -> None:
            sql, expect = QUERIES[i % len(QUERIES)]
            async with pool.acquire() as conn:
                assert await conn.fetchval(sql, i) == expect(i)

        await asyncio.gather(*(fetch(i) for i in range(2000)))
        # Statements asyncpg prepared explicitly, and one closed by asyncpg itself.
        async with pool.acquire() as conn:
            stmt = await conn.prepare("SELECT $1::int, $2::text")
            for i in range(20):
                async with conn.transaction():
                    assert await stmt.fetchrow(i, "x") == (i, "x")
        async with pool.acquire() as conn:
            rows = await conn.fetch("SELECT generate_series(1, $1::int) AS n", 100)
            assert [r["n"] for r in rows] == list(range(1, 101))
    finally:
        await pool.close()


async def test_psycopg_prepares_everything_also_in_pipeline_mode(pooler):
    psycopg = pytest.importorskip("psycopg")
    p = pooler(ini_overrides={"default_pool_size": "3"})

    async def client(i: int) -> None:
        async with await psycopg.AsyncConnection.connect(
            p.dsn(), prepare_threshold=0, autocommit=True
        ) as conn:
            for j in range(40):
                sql, expect = QUERIES[(i + j) % len(QUERIES)]
                cur = await conn.execute(sql.replace("$1", "%s"), (j,))
                assert (await cur.fetchone())[0] == expect(j)
            async with conn.pipeline():
                curs = []
                for j in range(30):
                    sql, _ = QUERIES[j % len(QUERIES)]
                    curs.append(await conn.execute(sql.replace("$1", "%s"), (j,)))
            for j, cur in enumerate(curs):
                assert (await cur.fetchone())[0] == QUERIES[j % len(QUERIES)][1](j)
            # A transaction, and a failing statement inside a pipeline.
            async with conn.transaction():
                cur = await conn.execute("SELECT %s::int + 100", (i,))
                assert (await cur.fetchone())[0] == i + 100
            with pytest.raises(psycopg.errors.DivisionByZero):
                async with conn.pipeline():
                    await conn.execute("SELECT %s::int / 0", (i,))
            cur = await conn.execute("SELECT %s::int + 100", (i,))
            assert (await cur.fetchone())[0] == i + 100

    await asyncio.gather(*(client(i) for i in range(10)))


def test_psycopg_sync_client_many_statements(pooler):
    """More distinct statements than psycopg's cache (100): it Closes the oldest ones."""
    psycopg = pytest.importorskip("psycopg")
    p = pooler(ini_overrides={"default_pool_size": "2", "max_prepared_statements": "20"})
    with psycopg.connect(p.dsn(), prepare_threshold=0, autocommit=True) as conn:
        for j in range(250):
            cur = conn.execute(f"SELECT %s::int + {j}", (j,))
            assert cur.fetchone()[0] == 2 * j


@pytest.mark.parametrize("mode", ["prepared", "extended"])
def test_pgbench(pooler, postgres, mode):
    """-j equal to -c: with fewer threads than clients and a smaller pool, pgbench's
    prepared mode can deadlock against any transaction pooler."""
    p = pooler(ini_overrides={"default_pool_size": "4"})
    result = subprocess.run(
        [postgres.tool("pgbench"), "-n", "-M", mode, "-c", "12", "-j", "12", "-T", "3",
         "-h", p.host, "-p", str(p.port), "-U", "app", "bench"],
        env={**os.environ, "PGPASSWORD": APP_PASSWORD},
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stdout + result.stderr + p.log()[-3000:]
    assert "number of failed transactions: 0" in result.stdout, result.stdout
    processed = int(result.stdout.split("number of transactions actually processed: ")[1]
                    .split()[0].split("/")[0])
    assert processed > 100


async def test_sqlalchemy_on_asyncpg(pooler):
    pytest.importorskip("asyncpg")
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.ext.asyncio import create_async_engine

    p = pooler(ini_overrides={"default_pool_size": "3"})
    url = p.dsn().replace("postgresql://", "postgresql+asyncpg://")
    engine = create_async_engine(url, pool_size=12, max_overflow=0)
    table = sqlalchemy.table("pgbench_accounts", sqlalchemy.column("aid"),
                             sqlalchemy.column("abalance"))
    try:
        async def work(i: int) -> None:
            for j in range(25):
                async with engine.connect() as conn:
                    value = await conn.scalar(sqlalchemy.select(sqlalchemy.literal(i) + j))
                    assert value == i + j
                    result = await conn.execute(
                        sqlalchemy.text("SELECT CAST(:a AS int) * CAST(:b AS int)"),
                        {"a": i, "b": j},
                    )
                    assert result.scalar() == i * j

        await asyncio.gather(*(work(i) for i in range(12)))
    finally:
        await engine.dispose()
    bench = create_async_engine(p.dsn("bench").replace("postgresql://", "postgresql+asyncpg://"),
                                pool_size=6, max_overflow=0)
    try:
        async def read(i: int) -> None:
            async with bench.connect() as conn:
                for aid in range(1 + i, 200, 6):
                    stmt = sqlalchemy.select(table.c.aid).where(table.c.aid == aid)
                    assert await conn.scalar(stmt) == aid
                    await conn.commit()

        await asyncio.gather(*(read(i) for i in range(6)))
    finally:
        await bench.dispose()


NODE_SCRIPT = textwrap.dedent("""
    const { Client } = require('pg');
    const [host, port] = [process.argv[2], Number(process.argv[3])];
    async function run(i) {
      const client = new Client({ host, port, user: 'app', password: 'app-secret',
                                  database: 'app' });
      await client.connect();
      for (let j = 0; j < 40; j++) {
        const q = j % 2 ? { name: 'plus', text: 'SELECT $1::int + 1 AS v', values: [j] }
                        : { name: 'times', text: 'SELECT $1::int * 2 AS v', values: [j] };
        const res = await client.query(q);
        const want = j % 2 ? j + 1 : j * 2;
        if (res.rows[0].v !== want) throw new Error(`client ${i}: ${res.rows[0].v} != ${want}`);
      }
      await client.query('BEGIN');
      const r = await client.query({ name: 'plus', text: 'SELECT $1::int + 1 AS v',
                                     values: [41] });
      await client.query('COMMIT');
      await client.end();
      return r.rows[0].v;
    }
    Promise.all([...Array(8).keys()].map(run))
      .then((vs) => { console.log(JSON.stringify(vs)); })
      .catch((e) => { console.error(e); process.exit(1); });
""")


__all__ = ["node_pg"]  # the fixture


def test_node_postgres_named_queries(pooler, node_pg):
    p = pooler(ini_overrides={"default_pool_size": "3"})
    script = node_pg / "named.js"
    script.write_text(NODE_SCRIPT)
    result = subprocess.run(["node", str(script), p.host, str(p.port)], cwd=node_pg,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr + p.log()[-3000:]
    assert json.loads(result.stdout) == [42] * 8
