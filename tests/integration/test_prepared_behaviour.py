"""Prepared statements under transaction pooling, message by message: what PgBouncer does,
and where pypool does better (see docs/prepared-statements.md).

Most tests compare the pooler's replies with a direct connection's for the same messages.
"""

from __future__ import annotations

import pytest

from . import pgwire
from .pgwire import Wire, kinds

P, B, D, E, C, S, H, Q = (pgwire.parse, pgwire.bind, pgwire.describe, pgwire.execute,
                          pgwire.close, pgwire.sync, pgwire.flush, pgwire.query)


async def connect(p, database: str = "app") -> Wire:
    return await Wire.connect(p.host, p.port, "app", "app-secret", database)


async def direct(postgres, database: str = "app") -> Wire:
    return await Wire.connect(postgres.host, postgres.port, "app", "app-secret", database)


async def backend_pid(wire: Wire) -> str:
    got = await wire.run(Q("SELECT pg_backend_pid()"))
    return str(got[1][1][0])


async def same_on_both(pooled: Wire, plain: Wire, *messages: bytes, syncs: int = 1):
    got = await pooled.run(*messages, syncs=syncs)
    want = await plain.run(*messages, syncs=syncs)
    assert got == want
    return got


async def test_statement_follows_the_client_to_another_server(pooler):
    p = pooler(ini_overrides={"default_pool_size": "2"})
    a, b = await connect(p), await connect(p)
    got = await a.run(P("s1", "SELECT $1::int * 10 AS v"), S())
    assert kinds(got) == "1Z"
    first = await backend_pid(a)
    # b takes the server a just released (the idle stack is LIFO) and keeps it.
    assert await b.run(Q("BEGIN")) == [("C", "BEGIN"), ("Z", "T")]
    assert await backend_pid(b) == first
    got = await a.run(B("", "s1", ["4"]), E(), S())
    assert got == [("2",), ("D", ("40",)), ("C", "SELECT 1"), ("Z", "I")]
    assert await backend_pid(a) != first  # a second server, which had to be given s1
    await b.run(Q("COMMIT"))
    for wire in (a, b):
        await wire.close()


async def test_a_name_whose_parse_failed_can_be_parsed_again(pooler, postgres):
    """PgBouncer closes the client here ("prepared statement name is already in use")."""
    p = pooler(ini_overrides={"default_pool_size": "2"})
    pooled, plain = await connect(p), await direct(postgres)
    got = await same_on_both(pooled, plain, P("s1", "SELEC 1"), S())
    assert got[0][:2] == ("E", "42601")
    got = await same_on_both(pooled, plain, P("s1", "SELECT 1 AS one"), B("", "s1"), E(), S())
    assert kinds(got) == "12DCZ"
    for wire in (pooled, plain):
        await wire.close()


@pytest.mark.parametrize("in_transaction", [False, True], ids=["autocommit", "in-block"])
async def test_duplicate_parse_is_postgresqls_own_error(pooler, postgres, in_transaction):
    p = pooler(ini_overrides={"default_pool_size": "2"})
    pooled, plain = await connect(p), await direct(postgres)
    if in_transaction:
        await same_on_both(pooled, plain, Q("BEGIN"))
    await same_on_both(pooled, plain, P("s1", "SELECT 1"), S())
    got = await same_on_both(pooled, plain, P("s1", "SELECT 2"), B("", "s1"), E(), S())
    assert got == [("E", "42P05", 'prepared statement "s1" already exists'),
                   ("Z", "E" if in_transaction else "I")]
    if in_transaction:
        got = await same_on_both(pooled, plain, P("s2", "SELECT 2"), S())
        assert got[0][:2] == ("E", "25P02")
        await same_on_both(pooled, plain, Q("ROLLBACK"))
    # The client carries on, with its first statement.
    got = await same_on_both(pooled, plain, B("", "s1"), E(), S())
    assert got[1] == ("D", ("1",))
    for wire in (pooled, plain):
        await wire.close()


async def test_unknown_statement_is_26000(pooler, postgres):
    p = pooler(ini_overrides={"default_pool_size": "2"})
    pooled, plain = await connect(p), await direct(postgres)
    for messages in ([B("", "nope"), E(), S()], [D("S", "nope"), S()],
                     [P("s1", "SELECT 1"), B("", "nope"), E(), S()]):
        got = await same_on_both(pooled, plain, *messages)
        assert ("E", "26000", 'prepared statement "nope" does not exist') in got
    await same_on_both(pooled, plain, Q("BEGIN"))
    got = await same_on_both(pooled, plain, B("", "nope"), S())
    assert got == [("E", "26000", 'prepared statement "nope" does not exist'), ("Z", "E")]
    await same_on_both(pooled, plain, Q("ROLLBACK"))
    for wire in (pooled, plain):
        await wire.close()


async def test_close_then_parse_the_name_again(pooler, postgres):
    p = pooler(ini_overrides={"default_pool_size": "2"})
    pooled, plain = await connect(p), await direct(postgres)
    await same_on_both(pooled, plain, P("s1", "SELECT 1"), S())
    got = await same_on_both(pooled, plain, C("S", "s1"), P("s1", "SELECT 2 AS two"),
                             B("", "s1"), E(), C("S", "never"), S())
    assert kinds(got) == "312DC3Z"
    for wire in (pooled, plain):
        await wire.close()


async def test_sql_level_prepare_execute_deallocate_across_servers(pooler, postgres):
    """PgBouncer forwards these blindly: the next transaction's server lacks the statement,
    or has another client's of the same name."""
    p = pooler(ini_overrides={"default_pool_size": "2"})
    a, b = await connect(p), await connect(p)
    plain_a, plain_b = await direct(postgres), await direct(postgres)
    await same_on_both(a, plain_a, Q("PREPARE q (int) AS SELECT $1 + 1 AS plus"))
    await same_on_both(b, plain_b, Q("PREPARE q (int) AS SELECT $1 * 3 AS times"))
    for _ in range(3):  # the two clients take turns on the two servers
        got = await same_on_both(a, plain_a, Q("EXECUTE q(10)"))
        assert got[1] == ("D", ("11",))
        got = await same_on_both(b, plain_b, Q("EXECUTE q(10)"))
        assert got[1] == ("D", ("30",))
        holder = await connect(p)
        await holder.run(Q("BEGIN"))  # pins one server: the others must use the other one
        got = await same_on_both(a, plain_a, Q("EXECUTE q(1)"))
        assert got[1] == ("D", ("2",))
        await holder.run(Q("COMMIT"))
        await holder.close()
    got = await same_on_both(a, plain_a, Q("PREPARE q AS SELECT 1"))
    assert got[0] == ("E", "42P05", 'prepared statement "q" already exists')
    await same_on_both(a, plain_a, Q("DEALLOCATE PREPARE q"))
    got = await same_on_both(a, plain_a, Q("EXECUTE q(10)"))
    assert got[0] == ("E", "26000", 'prepared statement "q" does not exist')
    got = await same_on_both(b, plain_b, Q("EXECUTE q(2)"))
    assert got[1] == ("D", ("6",))
    # DEALLOCATE ALL drops protocol-level statements too.
    await same_on_both(b, plain_b, P("s1", "SELECT 5"), S())
    await same_on_both(b, plain_b, Q("DEALLOCATE ALL"))
    got = await same_on_both(b, plain_b, Q("EXECUTE q(2)"))
    assert got[0][:2] == ("E", "26000")
    got = await same_on_both(b, plain_b, B("", "s1"), E(), S())
    assert got[0] == ("E", "26000", 'prepared statement "s1" does not exist')
    for wire in (a, b, plain_a, plain_b):
        await wire.close()


async def test_sql_execute_and_deallocate_of_a_protocol_level_statement(pooler, postgres):
    p = pooler(ini_overrides={"default_pool_size": "2"})
    pooled, plain = await connect(p), await direct(postgres)
    await same_on_both(pooled, plain, P("s1", "SELECT $1::int - 1 AS minus"), S())
    holder = await connect(p)
    await holder.run(Q("BEGIN"))  # the next transaction lands on the other server
    got = await same_on_both(pooled, plain, Q("EXECUTE s1(10)"))
    assert got[:2] == [("T", (("minus", 23, 0),)), ("D", ("9",))]
    got = await same_on_both(pooled, plain, Q("EXECUTE s1('x')"))
    assert got[0][:2] == ("E", "22P02")
    await same_on_both(pooled, plain, Q("DEALLOCATE s1"))
    got = await same_on_both(pooled, plain, B("", "s1"), E(), S())
    assert got[0] == ("E", "26000", 'prepared statement "s1" does not exist')
    await holder.run(Q("COMMIT"))
    for wire in (pooled, plain, holder):
        await wire.close()


async def test_discard_all(pooler, postgres):
    p = pooler(ini_overrides={"default_pool_size": "2"})
    pooled, plain = await connect(p), await direct(postgres)
    await same_on_both(pooled, plain, P("s1", "SELECT 1"), S())
    await same_on_both(pooled, plain, Q("PREPARE q AS SELECT 2"))
    await same_on_both(pooled, plain, Q("DISCARD ALL"))
    got = await same_on_both(pooled, plain, B("", "s1"), E(), S())
    assert got[0][:2] == ("E", "26000")
    got = await same_on_both(pooled, plain, Q("EXECUTE q"))
    assert got[0][:2] == ("E", "26000")
    await same_on_both(pooled, plain, P("s1", "SELECT 3"), B("", "s1"), E(), S())
    for wire in (pooled, plain):
        await wire.close()


async def test_servers_keep_at_most_max_prepared_statements(pooler, postgres):
    p = pooler(ini_overrides={"default_pool_size": "1", "max_prepared_statements": "3"})
    pooled = await connect(p)
    for i in range(10):
        got = await pooled.run(P(f"s{i}", f"SELECT {i}"), B("", f"s{i}"), E(), S())
        assert got[2] == ("D", (str(i),))
    got = await pooled.run(Q("SELECT name FROM pg_prepared_statements ORDER BY name"))
    names = [row[1][0] for row in got if row[0] == "D"]
    assert names == ["PYPOOL_10", "PYPOOL_8", "PYPOOL_9"]
    # The evicted ones come back when used.
    got = await pooled.run(B("", "s0"), E(), B("", "s5"), E(), S())
    assert [row for row in got if row[0] == "D"] == [("D", ("0",)), ("D", ("5",))]
    await pooled.close()


async def test_per_client_cap(pooler):
    p = pooler(ini_overrides={"max_client_prepared_statements": "3"})
    pooled = await connect(p)
    for i in range(3):
        await pooled.run(P(f"s{i}", f"SELECT {i}"), S())
    got = await pooled.run(P("s3", "SELECT 3"), B("", "s3"), E(), S())
    assert got == [("E", "54000", "too many prepared statements for this client "
                                  "(max_client_prepared_statements = 3)"), ("Z", "I")]
    await pooled.run(C("S", "s0"), S())
    assert kinds(await pooled.run(P("s3", "SELECT 3"), S())) == "1Z"
    await pooled.close()


async def test_max_prepared_statements_0_passes_names_through(pooler):
    p = pooler(ini_overrides={"max_prepared_statements": "0", "default_pool_size": "1"})
    pooled = await connect(p)
    await pooled.run(P("mine", "SELECT 1"), S())
    got = await pooled.run(Q("SELECT name FROM pg_prepared_statements"))
    assert ("D", ("mine",)) in got
    got = await pooled.run(P("mine", "SELECT 1"), S())
    assert got[0] == ("E", "42P05", 'prepared statement "mine" already exists')
    await pooled.run(C("S", "mine"), S())
    await pooled.close()


async def test_session_mode_passes_names_through(pooler):
    p = pooler(ini_overrides={"pool_mode": "session", "default_pool_size": "1"})
    pooled = await connect(p)
    await pooled.run(P("mine", "SELECT 1"), S())
    got = await pooled.run(Q("SELECT name FROM pg_prepared_statements"))
    assert ("D", ("mine",)) in got
    await pooled.close()


async def test_pipelined_segments(pooler, postgres):
    """Several Syncs in one write; an error in one segment undoes what it would have done."""
    p = pooler(ini_overrides={"default_pool_size": "1"})
    pooled, plain = await connect(p), await direct(postgres)
    await same_on_both(pooled, plain,
                       P("a", "SELECT 1"), S(),
                       B("", "a", ["1"]), C("S", "a"), S(),  # the Bind fails: a stays
                       P("a", "SELECT 2"), S(),  # so this is a duplicate
                       P("b", "SELEC"), S(),
                       P("b", "SELECT 3"), B("", "b"), E(), S(),
                       syncs=5)
    for wire in (pooled, plain):
        await wire.close()


async def test_counters(pooler):
    p = pooler(ini_overrides={"default_pool_size": "1"})
    pooled = await connect(p)
    await pooled.run(P("a", "SELECT 1"), S())
    for _ in range(3):
        await pooled.run(B("", "a"), E(), S())
    admin = await Wire.connect(p.host, p.port, "pool_admin", "admin-secret", "pgbouncer")
    got = await admin.run(Q("SHOW STATS"))
    header = [name for name, _oid, _fmt in got[0][1]]
    row = dict(zip(header, next(r[1] for r in got if r[0] == "D" and r[1][0] == "app"),
                   strict=True))
    assert row["total_client_parse_count"] == "1"
    assert row["total_server_parse_count"] == "1"
    assert row["total_bind_count"] == "3"
    for wire in (pooled, admin):
        await wire.close()


async def test_malformed_message_while_waiting_for_a_server(pooler):
    p = pooler(ini_overrides={"default_pool_size": "1"})
    holder, bad, good = await connect(p), await connect(p), await connect(p)
    await holder.run(Q("BEGIN"))  # the only server: the next clients wait
    bad.send(pgwire.message(b"B", b"no terminating NULs"), S())
    await holder.run(Q("COMMIT"))  # bad is linked now, and its Bind cannot be read
    kind, body = await bad.read()
    assert kind == b"E" and pgwire.error_fields(body)["C"] == "08P01"
    got = await good.run(P("s1", "SELECT 1"), B("", "s1"), E(), S())
    assert kinds(got) == "12DCZ"
    for wire in (holder, good):
        await wire.close()


async def test_dropping_an_unsure_name_in_an_open_segment_never_fails_the_client(
        pooler, postgres):
    """A SQL-level name the pooler is unsure of (a DO block ran that may prepare) is dropped
    with a Close before another client's PREPARE of the same name. When that client's
    extended segment is still open, the Close joins it (no Sync): a hidden DEALLOCATE there
    fails and aborts the client's transaction."""
    p = pooler(ini_overrides={"default_pool_size": "1"})
    a, b = await connect(p), await connect(p)
    plain = await direct(postgres)
    try:
        assert kinds(await a.run(Q("PREPARE s AS SELECT 1"))) == "CZ"
        # A DEALLOCATE the pooler cannot follow: every SQL-level name on the server becomes
        # UNSURE, and `s` is in fact gone.
        assert kinds(await a.run(Q("SELECT 1; DEALLOCATE s"))) == "TDCCZ"
        for wire in (b, plain):
            assert kinds(await wire.run(Q("BEGIN"))) == "CZ"
        script = (P("", "SELECT 2"), B("", ""), E(), Q("PREPARE s AS SELECT 3"),
                  Q("EXECUTE s"), S())
        got = await b.run(*script, syncs=3)
        want = await plain.run(*script, syncs=3)
        assert got == want
        assert ("D", ("3",)) in got
        for wire in (b, plain):
            assert await wire.run(Q("COMMIT")) == [("C", "COMMIT"), ("Z", "I")]
    finally:
        for wire in (a, b, plain):
            await wire.close()
