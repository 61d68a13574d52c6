"""The protocol end to end through the pooler, with real clients (psycopg sync and async,
asyncpg, psql, a raw socket) against the real PostgreSQL: what comes back must be exactly
what PostgreSQL sent, rows, SQLSTATEs, notices, COPY data and all."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import struct
import subprocess
import uuid
from collections.abc import Callable

import asyncpg
import psycopg
import pytest
from psycopg import errors as pg_errors

from pypool.protocol import messages as m

from .rawclient import RawClient

pytestmark = pytest.mark.timeout(90)

# psycopg switches to named server-side prepared statements after 5 runs of a query;
# these tests are about the protocol, not the prepared-statement mapping.
NO_PREPARE = {"prepare_threshold": None, "connect_timeout": 5}


def connect(p, **kwargs) -> psycopg.Connection:  # type: ignore[no-untyped-def]
    return psycopg.connect(p.dsn(), **{**NO_PREPARE, "autocommit": True, **kwargs})


# --- psycopg (sync) -----------------------------------------------------------------------


def test_simple_and_extended_queries(pooler: Callable) -> None:
    p = pooler()
    with connect(p) as conn:
        # No parameters: the simple query protocol.
        assert conn.execute("SELECT 1, 'two', NULL::int").fetchone() == (1, "two", None)
        # Parameters: Parse/Bind/Describe/Execute/Sync, text and binary.
        assert conn.execute("SELECT %s::int + %s::int, %s::text", (40, 2, "x")).fetchone() == (
            42, "x"
        )
        cur = conn.cursor(binary=True)
        assert cur.execute("SELECT %s::bigint * 2, %s::bytea", (2**40, b"\x00\xff")).fetchone() \
            == (2**41, b"\x00\xff")
        assert conn.execute("SELECT %s::text IS NULL", (None,)).fetchone() == (True,)
        rows = conn.execute(
            "SELECT g, %s::text || g FROM generate_series(1, %s) g", ("n", 5)
        ).fetchall()
        assert rows == [(i, f"n{i}") for i in range(1, 6)]


def test_executemany_pipelines(pooler: Callable) -> None:
    p = pooler()
    table = f"t_many_{uuid.uuid4().hex[:8]}"
    with connect(p) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
        try:
            with conn.cursor() as cur:
                cur.executemany(f"INSERT INTO {table} VALUES (%s, %s)",
                                [(i, f"v{i}") for i in range(500)])
            assert conn.execute(f"SELECT count(*), sum(id) FROM {table}").fetchone() == (
                500, sum(range(500))
            )
        finally:
            conn.execute(f"DROP TABLE {table}")


def test_multi_statement_simple_query(pooler: Callable) -> None:
    p = pooler()
    with connect(p) as conn:
        cur = conn.execute("SELECT 1 AS a; SELECT 2 AS b, 3 AS c; SELECT 'x'")
        results = [cur.fetchall()]
        while cur.nextset():
            results.append(cur.fetchall())
        assert results == [[(1,)], [(2, 3)], [("x",)]]
        # A failing statement in the middle: the rest is skipped, the connection stays.
        with pytest.raises(pg_errors.DivisionByZero):
            conn.execute("SELECT 1; SELECT 1/0; SELECT 3")
        assert conn.execute("SELECT 'after'").fetchone() == ("after",)


def test_empty_query(pooler: Callable) -> None:
    p = pooler()
    with connect(p) as conn:
        cur = conn.cursor()
        cur.execute("")
        assert cur.pgresult is not None
        assert cur.pgresult.status == psycopg.pq.ExecStatus.EMPTY_QUERY
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_errors_keep_their_sqlstate_and_the_connection(pooler: Callable) -> None:
    p = pooler()
    with connect(p) as conn:
        with pytest.raises(pg_errors.DivisionByZero) as info:
            conn.execute("SELECT 1/0")
        assert info.value.sqlstate == "22012"
        assert info.value.diag.message_primary == "division by zero"
        assert conn.execute("SELECT 1").fetchone() == (1,)

        with pytest.raises(pg_errors.UndefinedTable) as undefined:
            conn.execute("SELECT * FROM no_such_table_here")
        assert undefined.value.sqlstate == "42P01"
        assert conn.execute("SELECT 2").fetchone() == (2,)

        # The same errors through the extended protocol.
        with pytest.raises(pg_errors.DivisionByZero):
            conn.execute("SELECT %s::int / 0", (1,))
        with pytest.raises(pg_errors.InvalidTextRepresentation):
            conn.execute("SELECT %s::int", ("not a number",))
        with pytest.raises(pg_errors.SyntaxError):
            conn.execute("SELEKT %s", (1,))
        assert conn.execute("SELECT %s::int", (3,)).fetchone() == (3,)


def test_error_inside_a_transaction_block(pooler: Callable) -> None:
    p = pooler()
    with connect(p, autocommit=False) as conn:
        conn.execute("SELECT 1")
        with pytest.raises(pg_errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        with pytest.raises(pg_errors.InFailedSqlTransaction) as info:
            conn.execute("SELECT 1")
        assert info.value.sqlstate == "25P02"
        conn.rollback()
        assert conn.execute("SELECT 'again'").fetchone() == ("again",)
        conn.commit()


def test_transaction_keeps_its_server(pooler: Callable) -> None:
    p = pooler({"default_pool_size": "2", "query_wait_timeout": "10"})
    with connect(p) as a, connect(p) as b:
        with a.transaction():
            pid = a.execute("SELECT pg_backend_pid()").fetchone()
            b.execute("SELECT 1")  # another client in between
            assert a.execute("SELECT pg_backend_pid()").fetchone() == pid
            a.execute("CREATE TEMP TABLE t_keep (x int) ON COMMIT DROP")
            b.execute("SELECT 2")
            assert a.execute("SELECT count(*) FROM t_keep").fetchone() == (0,)


def test_copy_from_stdin_and_to_stdout(pooler: Callable) -> None:
    p = pooler()
    table = f"t_copy_{uuid.uuid4().hex[:8]}"
    rows = [(i, f"row {i}\twith tab", None if i % 7 == 0 else i * 1.5) for i in range(20000)]
    with connect(p) as conn:
        conn.execute(f"CREATE TABLE {table} (id int, t text, f float8)")
        try:
            with conn.cursor() as cur:
                with cur.copy(f"COPY {table} FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
                assert cur.rowcount == len(rows)
            assert conn.execute(f"SELECT count(*), sum(id) FROM {table}").fetchone() == (
                len(rows), sum(r[0] for r in rows)
            )
            got = []
            with conn.cursor() as cur:
                with cur.copy(f"COPY (SELECT * FROM {table} ORDER BY id) TO STDOUT") as copy:
                    copy.set_types(["int4", "text", "float8"])
                    got = list(copy.rows())
            assert got == rows
            # Raw COPY text out, byte for byte.
            buf = io.BytesIO()
            with conn.cursor() as cur:
                with cur.copy("COPY (SELECT g, 'é' FROM generate_series(1,3) g) TO STDOUT"
                              ) as copy:
                    for chunk in copy:
                        buf.write(chunk)
            assert buf.getvalue() == "1\té\n2\té\n3\té\n".encode()
        finally:
            conn.execute(f"DROP TABLE {table}")


def test_copy_in_a_transaction_and_copy_errors(pooler: Callable) -> None:
    p = pooler()
    with connect(p) as conn:
        with conn.transaction():
            conn.execute("CREATE TEMP TABLE t_copy_tx (x int) ON COMMIT DROP")
            with conn.cursor().copy("COPY t_copy_tx FROM STDIN") as copy:
                copy.write(b"1\n2\n3\n")
            assert conn.execute("SELECT sum(x) FROM t_copy_tx").fetchone() == (6,)
        # Bad data: the server's error, and the connection still usable.
        with pytest.raises(pg_errors.InvalidTextRepresentation):
            with conn.transaction():
                conn.execute("CREATE TEMP TABLE t_copy_bad (x int) ON COMMIT DROP")
                with conn.cursor().copy("COPY t_copy_bad FROM STDIN") as copy:
                    copy.write(b"1\nnot-a-number\n")
        assert conn.execute("SELECT 'after bad copy'").fetchone() == ("after bad copy",)
        # The client gives up half-way: psycopg sends CopyFail, the server ends the COPY with
        # an error, psycopg re-raises the client's own exception.
        with pytest.raises(RuntimeError, match="client gives up"):
            with conn.transaction():
                conn.execute("CREATE TEMP TABLE t_copy_fail (x int) ON COMMIT DROP")
                with conn.cursor().copy("COPY t_copy_fail FROM STDIN") as copy:
                    copy.write(b"1\n")
                    raise RuntimeError("client gives up")
        assert conn.execute("SELECT 'after copy fail'").fetchone() == ("after copy fail",)


def test_large_result_is_intact(pooler: Callable) -> None:
    p = pooler()
    n = 200_000
    with connect(p) as conn:
        cur = conn.execute(
            "SELECT g, md5(g::text), repeat('x', g %% 50) FROM generate_series(1, %s) g", (n,)
        )
        rows = cur.fetchall()
    assert len(rows) == n
    total = 0
    for i, (g, digest, pad) in enumerate(rows, start=1):
        assert g == i
        assert digest == hashlib.md5(str(i).encode()).hexdigest()
        assert pad == "x" * (i % 50)
        total += len(digest) + len(pad)
    assert total > 5_000_000  # several MB went through


def test_large_values_in_both_directions(pooler: Callable) -> None:
    p = pooler()
    blob = os.urandom(3 * 1024 * 1024)
    with connect(p) as conn:
        cur = conn.cursor(binary=True)
        got = cur.execute("SELECT %s::bytea, length(%s::bytea)", (blob, blob)).fetchone()
        assert got == (blob, len(blob))
        text = "é" * 1_000_000
        assert conn.execute("SELECT md5(%s)", (text,)).fetchone() == (
            hashlib.md5(text.encode()).hexdigest(),
        )


def test_notice_passes_through(pooler: Callable) -> None:
    p = pooler()
    notices: list[tuple[str | None, str | None, str | None]] = []
    with connect(p) as conn:
        conn.add_notice_handler(
            lambda d: notices.append((d.severity_nonlocalized, d.sqlstate, d.message_primary))
        )
        conn.execute("DO $$ BEGIN RAISE NOTICE 'hello from %', 'plpgsql'; "
                     "RAISE WARNING 'careful'; END $$")
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert notices == [("NOTICE", "00000", "hello from plpgsql"),
                       ("WARNING", "01000", "careful")]


def test_listen_notify_in_session_mode(pooler: Callable) -> None:
    p = pooler({"pool_mode": "session"})
    with connect(p) as listener, connect(p) as sender:
        listener.execute("LISTEN pypool_test")
        # To itself, within the same connection.
        listener.execute("NOTIFY pypool_test, 'self'")
        got = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
        assert got == ["self"]
        # From another client, while the listener sits idle.
        sender.execute("SELECT pg_notify('pypool_test', 'other')")
        got = [(n.channel, n.payload) for n in listener.notifies(timeout=5, stop_after=1)]
        assert got == [("pypool_test", "other")]
        pid = listener.execute("SELECT pg_backend_pid()").fetchone()
        sender.execute("NOTIFY pypool_test, 'pid'")
        notes = list(listener.notifies(timeout=5, stop_after=1))
        assert [n.payload for n in notes] == ["pid"]
        assert pid is not None and notes[0].pid != pid[0]  # sent by the other backend


def test_session_parameters_follow_the_client_across_servers(
    pooler: Callable, postgres, pg_activity: Callable  # type: ignore[no-untyped-def]
) -> None:
    p = pooler({"default_pool_size": "2", "query_wait_timeout": "10"})
    clients = [connect(p) for _ in range(5)]
    try:
        for i, conn in enumerate(clients):
            conn.execute(f"SET application_name = 'client-{i}'")
            conn.execute("SET TimeZone = %s" % ("'UTC'" if i % 2 else "'Asia/Tokyo'"))
            conn.execute("SET DateStyle = %s" % ("'SQL, DMY'" if i % 2 else "'ISO, MDY'"))
        for _round in range(4):
            for i, conn in enumerate(clients):
                row = conn.execute(
                    "SELECT current_setting('application_name'), current_setting('TimeZone'),"
                    " current_setting('DateStyle')"
                ).fetchone()
                assert row == (
                    f"client-{i}",
                    "UTC" if i % 2 else "Asia/Tokyo",
                    "SQL, DMY" if i % 2 else "ISO, MDY",
                ), (i, row)
                # The client's own view (from ParameterStatus) agrees.
                assert conn.info.parameter_status("application_name") == f"client-{i}"
                assert conn.info.parameter_status("TimeZone") == (
                    "UTC" if i % 2 else "Asia/Tokyo"
                )
        # Five clients shared at most two servers.
        assert pg_activity(postgres, "app", "app") <= 2
    finally:
        for conn in clients:
            conn.close()


def test_startup_application_name_is_tracked(pooler: Callable) -> None:
    p = pooler({"default_pool_size": "1", "query_wait_timeout": "5"})
    with connect(p, application_name="first-app") as a, \
            connect(p, application_name="second-app") as b:
        for _ in range(3):
            assert a.execute("SHOW application_name").fetchone() == ("first-app",)
            assert b.execute("SHOW application_name").fetchone() == ("second-app",)


def test_function_call_message(pooler: Callable) -> None:
    """FunctionCall ('F'), which no common library sends: int4pl(20, 22) in text format."""
    p = pooler({"auth_type": "trust", "default_pool_size": "1", "query_wait_timeout": "5"})
    with RawClient(p.host, p.port) as raw:
        assert raw.login("app", "app").error is None
        rows, _, _ = raw.simple_query("SELECT 'int4pl'::regproc::oid")
        oid = int(rows[0][0] or 0)
        args = [b"20", b"22"]
        body = struct.pack("!IHH", oid, 1, 0)  # one format code: text for all arguments
        body += struct.pack("!H", len(args))
        for arg in args:
            body += struct.pack("!I", len(arg)) + arg
        body += struct.pack("!H", 0)  # text result
        raw.send(m.message(m.FUNCTION_CALL, body))
        replies = raw.read_until(m.READY_FOR_QUERY)
        kinds = [chr(k) for k, _ in replies]
        assert kinds == ["V", "Z"]
        result = replies[0][1]
        (size,) = struct.unpack_from("!i", result)
        assert result[4 : 4 + size] == b"42"
        assert replies[1][1] == b"I"
        # The server went back to the pool and the client goes on.
        assert raw.simple_query("SELECT 'after F'")[0] == [["after F"]]
    # A FunctionCall that fails: ErrorResponse, then ReadyForQuery.
    with RawClient(p.host, p.port) as raw:
        assert raw.login("app", "app").error is None
        body = struct.pack("!IHHH", 0, 0, 0, 0)  # function oid 0 does not exist
        raw.send(m.message(m.FUNCTION_CALL, body))
        replies = raw.read_until(m.READY_FOR_QUERY)
        assert [chr(k) for k, _ in replies] == ["E", "Z"]
        assert raw.simple_query("SELECT 1")[0] == [["1"]]


def test_psql(pooler: Callable, postgres) -> None:  # type: ignore[no-untyped-def]
    p = pooler()
    env = {**os.environ, "PGPASSWORD": "app-secret", "PGCONNECT_TIMEOUT": "5"}
    result = subprocess.run(
        [postgres.tool("psql"), "-h", p.host, "-p", str(p.port), "-U", "app", "-d", "app",
         "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1",
         "-c", "SELECT 6 * 7", "-c", "SELECT current_user"],
        env=env, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["42", "app"]
    failing = subprocess.run(
        [postgres.tool("psql"), "-h", p.host, "-p", str(p.port), "-U", "app", "-d", "app",
         "-X", "-v", "ON_ERROR_STOP=1", "-c", "SELECT 1/0"],
        env=env, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )
    assert failing.returncode != 0
    assert "division by zero" in failing.stderr


# --- psycopg (async) ----------------------------------------------------------------------


async def test_psycopg_async(pooler: Callable) -> None:
    p = pooler({"default_pool_size": "2", "query_wait_timeout": "10"})

    async def one(i: int) -> None:
        async with await psycopg.AsyncConnection.connect(
            p.dsn(), autocommit=True, **NO_PREPARE
        ) as conn:
            for j in range(10):
                cur = await conn.execute("SELECT %s::int * %s::int", (i, j))
                assert await cur.fetchone() == (i * j,)
            with pytest.raises(pg_errors.DivisionByZero):
                await conn.execute("SELECT %s::int / 0", (i,))
            cur = await conn.execute("SELECT count(*) FROM generate_series(1, 10000)")
            assert await cur.fetchone() == (10000,)
            async with conn.cursor() as acur:
                async with acur.copy("COPY (SELECT generate_series(1, 100)) TO STDOUT") as cp:
                    values = [int(row[0]) async for row in cp.rows()]
            assert values == list(range(1, 101))

    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(6))), 60)


# --- asyncpg ------------------------------------------------------------------------------


async def test_asyncpg(pooler: Callable) -> None:
    p = pooler()
    conn = await asyncpg.connect(p.dsn(), statement_cache_size=0, timeout=5)
    try:
        assert await conn.fetchval("SELECT 1") == 1
        assert await conn.fetchrow("SELECT $1::int + $2::int AS s, $3::text AS t", 40, 2, "x") \
            == (42, "x")
        with pytest.raises(asyncpg.exceptions.DivisionByZeroError) as info:
            await conn.fetchval("SELECT $1::int / 0", 1)
        assert info.value.sqlstate == "22012"
        with pytest.raises(asyncpg.exceptions.UndefinedTableError) as undefined:
            await conn.execute("SELECT * FROM no_such_table_here")
        assert undefined.value.sqlstate == "42P01"
        assert await conn.fetchval("SELECT 'still here'") == "still here"
        # Multi-statement script via the simple protocol.
        await conn.execute("SELECT 1; SELECT 2")
        rows = await conn.fetch("SELECT g, md5(g::text) FROM generate_series(1, 100000) g")
        assert len(rows) == 100000
        assert rows[-1]["md5"] == hashlib.md5(b"100000").hexdigest()
        async with conn.transaction():
            await conn.execute("CREATE TEMP TABLE t_apg (x int, y text) ON COMMIT DROP")
            await conn.copy_records_to_table("t_apg", records=[(i, str(i)) for i in range(1000)])
            assert await conn.fetchval("SELECT sum(x) FROM t_apg") == sum(range(1000))
            out = io.BytesIO()
            await conn.copy_from_query("SELECT x FROM t_apg WHERE x < 3 ORDER BY x", output=out)
            assert out.getvalue() == b"0\n1\n2\n"
        notices: list[str] = []
        conn.add_log_listener(lambda _c, msg: notices.append(msg.message))
        await conn.execute("DO $$ BEGIN RAISE NOTICE 'asyncpg notice'; END $$")
        await conn.fetchval("SELECT 1")
        assert notices == ["asyncpg notice"]
    finally:
        await asyncio.wait_for(conn.close(), 10)


def test_pipeline_mode_keeps_one_server_until_the_last_sync(pooler: Callable) -> None:
    """psycopg's pipeline: many Sync-terminated batches in flight at once. The server goes
    back to the pool only when the last ReadyForQuery is owed no more."""
    p = pooler({"default_pool_size": "1", "query_wait_timeout": "5"})
    with connect(p) as a, connect(p) as b:
        for _round in range(3):
            with a.pipeline():
                curs = [a.execute("SELECT %s::int, pg_backend_pid()", (i,)) for i in range(50)]
            results = [c.fetchone() for c in curs]
            assert [r[0] for r in results if r] == list(range(50))
            assert len({r[1] for r in results if r}) == 1  # one server for the whole batch
            # The other client, on the only server, gets its own answers.
            assert b.execute("SELECT %s::text", ("b",)).fetchone() == ("b",)


def test_pipeline_with_an_error_in_the_middle(pooler: Callable) -> None:
    p = pooler({"default_pool_size": "1", "query_wait_timeout": "5"})
    with connect(p) as a, connect(p) as b:
        with pytest.raises(pg_errors.DivisionByZero):
            with a.pipeline():
                a.execute("SELECT %s::int", (1,))
                a.execute("SELECT %s::int / 0", (1,))
                a.execute("SELECT %s::int", (3,))
        assert a.execute("SELECT %s::int", (4,)).fetchone() == (4,)
        assert b.execute("SELECT %s::int", (5,)).fetchone() == (5,)


def test_client_encoding_follows_the_client(pooler: Callable) -> None:
    p = pooler({"default_pool_size": "1", "query_wait_timeout": "5"})
    with connect(p, client_encoding="LATIN1") as latin, connect(p) as utf8:
        for _ in range(3):
            assert latin.execute("SHOW client_encoding").fetchone() == ("LATIN1",)
            assert latin.execute("SELECT 'é' || %s", ("ü",)).fetchone() == ("éü",)
            assert utf8.execute("SHOW client_encoding").fetchone() == ("UTF8",)
            assert utf8.execute("SELECT 'é' || %s", ("€",)).fetchone() == ("é€",)


def test_cancel_reaches_the_right_server(pooler: Callable) -> None:
    p = pooler({"default_pool_size": "2", "query_wait_timeout": "10"})
    with connect(p) as conn, connect(p) as other:
        import threading
        import time

        timer = threading.Timer(0.5, conn.cancel_safe)
        timer.start()
        started = time.monotonic()
        try:
            with pytest.raises(pg_errors.QueryCanceled) as info:
                conn.execute("SELECT pg_sleep(20)")
        finally:
            timer.cancel()
        assert info.value.sqlstate == "57014"
        assert time.monotonic() - started < 10
        assert conn.execute("SELECT 'alive'").fetchone() == ("alive",)
        assert other.execute("SELECT 'untouched'").fetchone() == ("untouched",)


def test_a_query_skipped_after_an_extended_error_holds_no_server(pooler: Callable) -> None:
    """A Query sent inside an extended-protocol segment that failed before it: PostgreSQL
    skips it, no ReadyForQuery answers it. With one server, another client gets that
    server at once (when the ledger still owed the Query's reply, the first client kept it
    and the second failed with query_wait_timeout)."""
    p = pooler({"auth_type": "trust", "default_pool_size": "1", "query_wait_timeout": "3",
                "max_prepared_statements": "20"})
    bad_parse = m.message(m.PARSE, b"s1\x00SELECT 1/\x00\x00\x00")  # a syntax error
    with RawClient(p.host, p.port) as first, RawClient(p.host, p.port) as second:
        assert first.login("app", "app").error is None
        assert second.login("app", "app").error is None
        # The Query in the same segment, and one sent after the error is back.
        first.send(bad_parse + m.query("SELECT 'skipped'") + m.sync())
        assert [chr(k) for k, _ in first.read_until(m.READY_FOR_QUERY)] == ["E", "Z"]
        first.send(bad_parse + m.message(m.FLUSH, b""))
        assert [chr(k) for k, _ in first.read_until(m.ERROR_RESPONSE)] == ["E"]
        first.send(m.query("SELECT 'dropped'") + m.sync())
        assert [chr(k) for k, _ in first.read_until(m.READY_FOR_QUERY)] == ["Z"]
        assert second.simple_query("SELECT 'second'")[0] == [["second"]]
        assert first.simple_query("SELECT 'first'")[0] == [["first"]]


def test_startup_and_query_in_one_packet(pooler: Callable) -> None:
    """A client that does not wait for ReadyForQuery before its first query."""
    p = pooler({"auth_type": "trust"})
    for _ in range(2):  # first with a cold pool, then with its parameters known
        with RawClient(p.host, p.port) as raw:
            body = b"user\x00app\x00database\x00app\x00\x00"
            startup = struct.pack("!II", len(body) + 8, 196608) + body
            raw.send(startup + m.query("SELECT 'eager'") + m.query("SELECT 2"))
            login = raw.read_until(m.READY_FOR_QUERY)
            assert m.ERROR_RESPONSE not in [k for k, _ in login]
            first = raw.read_until(m.READY_FOR_QUERY)
            assert [k for k, _ in first] == [m.ROW_DESCRIPTION, m.DATA_ROW,
                                             m.COMMAND_COMPLETE, m.READY_FOR_QUERY]
            assert first[1][1].endswith(b"eager")
            second = raw.read_until(m.READY_FOR_QUERY)
            assert second[1][1].endswith(b"2")


async def test_asyncpg_many_clients_on_few_servers(
    pooler: Callable, postgres, pg_activity: Callable  # type: ignore[no-untyped-def]
) -> None:
    """asyncpg sends Parse/Describe/Flush, then Bind/Execute/Sync: the server must stay with
    the client between the two (the unnamed statement lives only on that server)."""
    p = pooler({"default_pool_size": "2", "query_wait_timeout": "10"})

    async def one(i: int) -> None:
        conn = await asyncpg.connect(p.dsn(), statement_cache_size=0, timeout=10)
        try:
            for j in range(20):
                got = await conn.fetchrow("SELECT $1::int * $2::int AS v, $3::text AS t",
                                          i, j, f"c{i}")
                assert got is not None and (got["v"], got["t"]) == (i * j, f"c{i}")
        finally:
            await conn.close()

    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(8))), 60)
    assert pg_activity(postgres, "app", "app") <= 2
