"""A server whose prepared statements are dropped behind the pooler's back, by a query of
another client (docs/prepared-statements.md, "When the server forgets").

Client A loops over prepared statements (psycopg, `prepare_threshold=0`: named server-side
statements, Bind/Execute/Sync per query) while client B, on the same one-server pool, runs
something that drops every prepared statement on that server. Before the fix, A got
SQLSTATE 26000 for every query until the server was recycled.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from . import pgwire
from .pgwire import Wire

QUERIES = [
    ("SELECT %s::int + 1", lambda i: i + 1),
    ("SELECT %s::int * 2", lambda i: i * 2),
    ("SELECT length(%s::int::text)", lambda i: len(str(i))),
]
DO_DEALLOCATE = "DO $$ BEGIN EXECUTE 'DEALLOCATE ALL'; END $$"
POISON_FUNCTION = ("CREATE OR REPLACE FUNCTION pypool_test_deallocate() RETURNS int "
                   "LANGUAGE plpgsql AS $$ BEGIN EXECUTE 'DEALLOCATE ALL'; RETURN 1; END $$")


async def client_a(dsn: str, stop: asyncio.Event) -> tuple[int, int, int]:
    """Prepared queries until `stop`: (queries run, 26000 errors seen, 26000 errors in the
    queries run once the poisoning stopped)."""
    runs = missing = after = 0
    async with await psycopg.AsyncConnection.connect(
        dsn, prepare_threshold=0, autocommit=True
    ) as conn:
        while not stop.is_set() or runs < 50:
            sql, expect = QUERIES[runs % len(QUERIES)]
            try:
                cur = await conn.execute(sql, (runs,))
                assert (await cur.fetchone())[0] == expect(runs)
            except psycopg.errors.InvalidSqlStatementName:
                missing += 1
            runs += 1
        # Whatever happened, the next transactions work.
        for j in range(len(QUERIES)):
            sql, expect = QUERIES[j]
            try:
                cur = await conn.execute(sql, (j,))
                assert (await cur.fetchone())[0] == expect(j)
            except psycopg.errors.InvalidSqlStatementName:
                after += 1
    return runs, missing, after


async def poisoned(p, poison, rounds: int = 20) -> tuple[int, int, int]:
    """Client A's `client_a` counts while `poison(conn)` runs `rounds` times."""
    stop = asyncio.Event()
    a = asyncio.create_task(client_a(p.dsn(), stop))
    try:
        async with await psycopg.AsyncConnection.connect(
            p.dsn(), prepare_threshold=0, autocommit=True
        ) as b:
            await asyncio.sleep(0.1)
            for i in range(rounds):
                await poison(b, i)
                await asyncio.sleep(0.02)
    finally:
        stop.set()
    return await a


@pytest.mark.parametrize("prepare", [False, True], ids=["simple-query", "prepared"])
async def test_a_do_block_that_deallocates_all_costs_other_clients_no_error(pooler, prepare):
    """The pooler sees the DO block (simple Query, or a statement psycopg prepares) and
    forgets the server's statements when it is done: A's next Bind parses its statement
    again, and A sees not one 26000."""
    p = pooler(ini_overrides={"default_pool_size": "1"})

    async def poison(b: psycopg.AsyncConnection, i: int) -> None:
        await b.execute(DO_DEALLOCATE, prepare=prepare)
        cur = await b.execute("SELECT %s::int * 3", (i,))  # B's own results are right
        assert (await cur.fetchone())[0] == i * 3

    runs, missing, after = await poisoned(p, poison)
    assert runs >= 50 and (missing, after) == (0, 0)


async def test_a_multi_statement_deallocate_costs_other_clients_no_error(pooler, postgres):
    """`SELECT 1; DEALLOCATE x` in one simple Query: the pooler sees its DEALLOCATE tag."""
    p = pooler(ini_overrides={"default_pool_size": "1"})

    async def poison(b: psycopg.AsyncConnection, i: int) -> None:
        await b.execute(f"PREPARE b_{i} AS SELECT {i}", prepare=False)
        cur = await b.execute(f"EXECUTE b_{i}", prepare=False)
        assert (await cur.fetchone())[0] == i
        await b.execute(f"SELECT 1; DEALLOCATE b_{i}", prepare=False)
        try:  # A's first statement, by the name the pooler gave it (if it is there now)
            await b.execute('SELECT 1; DEALLOCATE "PYPOOL_1"', prepare=False)
        except psycopg.errors.InvalidSqlStatementName:
            pass

    runs, missing, after = await poisoned(p, poison)
    assert runs >= 50 and (missing, after) == (0, 0)


async def test_a_function_that_deallocates_costs_one_error_per_call_at_most(pooler, postgres):
    """`SELECT f()` where f runs DEALLOCATE ALL cannot be seen. Transparent retry is not
    possible from the rewriter alone (the failed Bind/Execute would have to be sent again
    from the server's side of the glue), so the 26000 reaches the one request that found a
    statement missing, the pooler forgets that server's statements, and the next
    transactions work: at most one error per poisoning, not one per query until the server
    is recycled."""
    postgres.execute(POISON_FUNCTION, dbname="app")
    p = pooler(ini_overrides={"default_pool_size": "1"})
    rounds = 10

    async def poison(b: psycopg.AsyncConnection, i: int) -> None:
        cur = await b.execute("SELECT pypool_test_deallocate()", prepare=False)
        assert (await cur.fetchone())[0] == 1
        await asyncio.sleep(0.05)  # A runs a few queries in between

    runs, missing, after = await poisoned(p, poison, rounds)
    assert runs >= 50 and missing <= rounds and after == 0


async def test_a_prepare_left_by_a_multi_statement_query_does_not_collide(pooler, postgres):
    """`PREPARE q ...; SELECT 1/0` leaves q on the server (a later error does not undo a
    PREPARE): another client's `PREPARE q` must still succeed, as on its own connection."""
    p = pooler(ini_overrides={"default_pool_size": "1"})
    a = await Wire.connect(p.host, p.port, "app", "app-secret", "app")
    b = await Wire.connect(p.host, p.port, "app", "app-secret", "app")
    got = await a.run(pgwire.query("PREPARE q AS SELECT 1; SELECT 1/0"))
    assert got[0] == ("C", "PREPARE") and got[1][:2] == ("E", "22012")
    got = await b.run(pgwire.query("PREPARE q AS SELECT 2"))
    assert got == [("C", "PREPARE"), ("Z", "I")]
    got = await b.run(pgwire.query("EXECUTE q"))
    assert got[1] == ("D", ("2",))
    for wire in (a, b):
        await wire.close()
