"""query_wait_timeout with pipelining on, against a real PostgreSQL: a client queued on a busy
server's line is still refused at its deadline if its transaction has not started, and then
it never runs (pypool/net/pipeline.py, pypool/pooling/pipeline_guard.py).

What must hold: the refused client gets PgBouncer's `query_wait_timeout` about when it would
without pipelining (its deadline plus the janitor's margin), well before the transaction
ahead of it ends; its INSERT is never in the table; a follower whose turn comes in time is
served as if nothing were in front of it; the server that carried a refused follower keeps
serving, with no reply of the guard's or of the refused client's reaching anyone.
"""

from __future__ import annotations

import time
import urllib.request

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import pq

from pypool.pooling.prepared import GUARD_NAME
from pypool.pooling.prepared.guard_statement import GUARD_SQL
from pypool.protocol import messages as m

from . import pgwire
from .polling import wait_for
from .test_pipeline import (  # noqa: F401 - _close_clients: the autouse fixture
    PIPELINED,
    SLEEPY,
    Client,
    Started,
    _close_clients,
    active_sleeps,
    backends_idle_in_transaction,
    execute,
    start,
    still_serves,
)

pytestmark = pytest.mark.timeout(40)

QUERY_WAIT_TIMEOUTS = "pypool_errors_total"


def insert(table: str, value: int) -> bytes:
    """An autocommit INSERT as a driver's one-off query sends it: the unnamed statement."""
    return (pgwire.parse("", f"INSERT INTO {table} VALUES ($1::int)")
            + pgwire.bind("", "", [str(value)]) + pgwire.execute() + pgwire.sync())


def sleepers(s: Started, count: int, postgres) -> list[Client]:
    """`count` clients that have prepared SLEEPY as "z" together, each on its own server (so
    every server has it, and their later Binds of it are plain hits)."""
    clients = [Client(s) for _ in range(count)]
    for i, c in enumerate(clients):
        c.send(pgwire.parse("z", SLEEPY) + execute("z", "0.5", str(i)) + pgwire.sync())
    for i, c in enumerate(clients):
        got = c.reply()
        assert (got.rows, got.status) == ([(str(i),)], "I"), got
    return clients


def app_backends(postgres) -> set[int]:
    rows = postgres.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = 'app' AND usename = 'app'"
        " AND backend_type = 'client backend'")
    return {int(r[0]) for r in rows or []}


def _errors(s: Started, kind: str) -> float:
    """pypool_errors_total{kind=...} for database app."""
    url = f"http://{s.host}:{s.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples
               if sample.name == QUERY_WAIT_TIMEOUTS and sample.labels.get("kind") == kind
               and sample.labels.get("database") == "app")


def rows_of(postgres, table: str) -> list[int]:
    rows = postgres.execute(f"SELECT x FROM {table} ORDER BY x", dbname="app")
    return [int(r[0]) for r in rows or []]


# --- the guard statement itself ---------------------------------------------------------------


@pytest.mark.parametrize("plans", ["force_custom_plan", "force_generic_plan", "auto"])
def test_the_guard_fails_only_once_its_deadline_has_passed(postgres, plans) -> None:
    """Parsed and bound as the pooler does (timestamptz $1, in binary): to a deadline ahead
    the guard returns no row, every time (past the five executions after which PostgreSQL
    may switch to a generic plan); past the deadline its cast fails with 22P02, and only
    then: nothing is folded at plan time."""

    def run(deadline: float) -> pq.abc.PGresult:
        micros = round((deadline - 946684800.0) * 1e6).to_bytes(8, "big", signed=True)
        return pg.exec_prepared(b"g", [micros], [1])

    with psycopg.connect(postgres.dsn("app"), autocommit=True) as conn:
        conn.execute(f"SET plan_cache_mode = {plans}")
        pg = conn.pgconn
        assert pg.prepare(b"g", GUARD_SQL, [1184]).status == pq.ExecStatus.COMMAND_OK
        for _ in range(8):
            res = run(time.time() + 3600)
            assert (res.status, res.ntuples, res.command_status) == (
                pq.ExecStatus.TUPLES_OK, 0, b"SELECT 0")
        deadline = time.time() + 0.3
        res = run(deadline)
        assert (res.status, res.ntuples) == (pq.ExecStatus.TUPLES_OK, 0)
        time.sleep(0.4)
        res = run(deadline)
        assert res.status == pq.ExecStatus.FATAL_ERROR
        assert res.error_field(pq.DiagnosticField.SQLSTATE) == b"22P02"
        assert b"pypool: query_wait_timeout at " in (res.error_message or b"")
        plan = pg.exec_(b"EXPLAIN EXECUTE g('2030-01-01 00:00:00+00')")
        lines = b" ".join(plan.get_value(i, 0) or b"" for i in range(plan.ntuples))
        if plans == "force_generic_plan":
            assert b"$1" in lines, lines
        else:
            assert b"2030" in lines or b"$1" in lines, lines


# --- refused -------------------------------------------------------------------------------------


def test_a_pipelined_waiter_is_refused_at_query_wait_timeout_and_never_runs(
    pooler, postgres, app_table
) -> None:
    """pipeline_depth = 4, two servers busy in pg_sleep(4), query_wait_timeout = 1: a waiter
    (psycopg, autocommit INSERT) is written behind one of them, and refused after about 1 s
    with query_wait_timeout; its row is never inserted. The sleepers get their own results,
    no server was closed, and every client after gets exactly its own rows."""
    s = start(pooler, pool_size=2, query_wait_timeout="1")
    a, b = sleepers(s, 2, postgres)
    backends = app_backends(postgres)
    assert len(backends) == 2
    a.run("z", "4", "1")
    b.run("z", "4", "2")
    assert wait_for(lambda: len(active_sleeps(postgres)) == 2, 5)
    dsn = f"postgresql://app@{s.host}:{s.port}/app"
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError) as refused:
            conn.execute(f"INSERT INTO {app_table} VALUES (%s)", (1,))
        waited = time.monotonic() - started
    assert "query_wait_timeout" in str(refused.value)
    assert 1.0 <= waited < 2.5, waited  # its deadline plus the margin; not the sleeps' 4 s
    assert s.metric(PIPELINED) == 1  # it was on a server's line, not in the pool's queue
    assert _errors(s, "query_wait_timeout") == 1
    for client, value in ((a, "1"), (b, "2")):
        got = client.reply()
        assert (got.rows, got.error, got.status) == ([(value,)], None, "I")
    assert rows_of(postgres, app_table) == []  # its transaction never started
    assert app_backends(postgres) == backends  # the server that carried it serves on
    for round_ in range(3):
        for client, value in ((a, f"1{round_}"), (b, f"2{round_}")):
            client.run("z", "0", value)
            got = client.reply()
            assert (got.rows, got.error, got.status) == ([(value,)], None, "I")
        still_serves(s)
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f"INSERT INTO {app_table} VALUES (%s)", (7,))
        assert conn.execute(f"SELECT x FROM {app_table}").fetchall() == [(7,)]
    assert backends_idle_in_transaction(postgres) == 0


def test_a_follower_whose_turn_comes_after_its_deadline_is_refused_by_its_guard(
    pooler, postgres, app_table
) -> None:
    """One server, busy 2 s; W joins its line 0.85 s in, so its deadline (1 s later) passes
    just before its turn, and before the janitor's margin is up: the guard fails on the
    server. W gets only the FATAL query_wait_timeout (no reply of the guard's, no
    ReadyForQuery), its INSERT never runs, and the same backend serves the next client."""
    s = start(pooler, pool_size=1, query_wait_timeout="1")
    (a,) = sleepers(s, 1, postgres)
    backends = app_backends(postgres)
    w = Client(s)
    a.run("z", "2", "1")
    sent = time.monotonic()
    time.sleep(0.85)
    w.send(insert(app_table, 1))
    assert wait_for(lambda: s.metric(PIPELINED) == 1, 2)
    first = w.read_message()
    waited = time.monotonic() - sent
    assert first is not None and first[0] == m.ERROR_RESPONSE, first
    fields = m.parse_error_fields(first[1])
    assert (fields["S"], fields["C"], fields["M"]) == ("FATAL", "08P01", "query_wait_timeout")
    assert w.read_message() is None  # then closed: nothing else
    assert 1.7 <= waited < 3.0, waited
    got = a.reply()
    assert (got.rows, got.error, got.status) == ([("1",)], None, "I")
    a.run("z", "0", "5")
    got = a.reply()
    assert (got.rows, got.error, got.status) == ([("5",)], None, "I")
    assert rows_of(postgres, app_table) == []
    assert app_backends(postgres) == backends
    still_serves(s)
    assert backends_idle_in_transaction(postgres) == 0


# --- served ---------------------------------------------------------------------------------------


def test_a_follower_whose_turn_comes_in_time_is_served_as_usual(
    pooler, postgres, app_table
) -> None:
    """W waits behind a 0.5 s query with query_wait_timeout = 2: its guard passes and W gets
    exactly what it would directly (ParseComplete, BindComplete, CommandComplete,
    ReadyForQuery); the server has the guard statement afterwards, parsed once."""
    s = start(pooler, pool_size=1, query_wait_timeout="2")
    (a,) = sleepers(s, 1, postgres)
    w, v = Client(s), Client(s)
    for value in (1, 2):
        a.run("z", "0.5", "1")
        assert wait_for(lambda: len(active_sleeps(postgres)) == 1, 5)
        w.send(insert(app_table, value))
        got = w.read_until(m.READY_FOR_QUERY)
        assert "".join(chr(kind) for kind, _ in got) == "12CZ", got
        assert m.parse_command_tag(got[2][1]) == "INSERT 0 1" and got[3][1] == b"I"
        got = a.reply()
        assert (got.rows, got.error, got.status) == ([("1",)], None, "I")
    assert s.metric(PIPELINED) == 2
    assert rows_of(postgres, app_table) == [1, 2]
    rows, _, _ = v.simple_query("SELECT name, statement FROM pg_prepared_statements"
                                " WHERE name LIKE 'PYPOOL_GUARD%'")
    assert [r[0] for r in rows] == [GUARD_NAME.decode()]


def test_behind_a_refused_follower_the_next_one_is_served(pooler, postgres, app_table) -> None:
    """A line of three on one server: A (3 s), W1 (refused at about 1 s by the janitor) and
    W2, which joins 2.2 s in and whose turn comes in time. W1's guard fails on the server and
    its replies are dropped; W2 gets exactly its own; only W2's row exists."""
    s = start(pooler, pool_size=1, query_wait_timeout="1.5")
    (a,) = sleepers(s, 1, postgres)
    w1, w2 = Client(s), Client(s)
    a.run("z", "3", "1")
    assert wait_for(lambda: len(active_sleeps(postgres)) == 1, 5)
    sent = time.monotonic()
    w1.send(insert(app_table, 1))
    error = w1.first_error()
    assert (error["C"], error["M"]) == ("08P01", "query_wait_timeout")
    assert 1.5 <= time.monotonic() - sent < 2.6
    assert w1.read_message() is None
    time.sleep(max(0.0, 2.2 - (time.monotonic() - sent)))
    w2.send(insert(app_table, 2))
    got = w2.read_until(m.READY_FOR_QUERY)
    assert "".join(chr(kind) for kind, _ in got) == "12CZ", got
    got = a.reply()
    assert (got.rows, got.error, got.status) == ([("1",)], None, "I")
    assert s.metric(PIPELINED) == 2
    assert rows_of(postgres, app_table) == [2]
    a.run("z", "0", "9")
    got = a.reply()
    assert (got.rows, got.error, got.status) == ([("9",)], None, "I")
    assert backends_idle_in_transaction(postgres) == 0


# --- what is not pipelined, and no guard without query_wait_timeout -------------------------------


def test_a_simple_query_waits_in_the_pool_while_query_wait_timeout_is_set(
    pooler, postgres, app_table
) -> None:
    """No guard fits a simple Query's implicit transaction: it is not pipelined, waits in the
    pool and is refused there at query_wait_timeout, never sent."""
    s = start(pooler, pool_size=1, query_wait_timeout="1")
    (a,) = sleepers(s, 1, postgres)
    w = Client(s)
    a.run("z", "2", "1")
    assert wait_for(lambda: len(active_sleeps(postgres)) == 1, 5)
    w.send(m.query(f"INSERT INTO {app_table} VALUES (1)"))
    error = w.first_error()
    assert error["M"] == "query_wait_timeout"
    assert a.reply().rows == [("1",)]
    assert s.metric(PIPELINED) == 0
    assert rows_of(postgres, app_table) == []


def test_without_query_wait_timeout_no_guard_is_sent(pooler, postgres, app_table) -> None:
    """query_wait_timeout = 0: followers (a simple Query too) are pipelined without a guard;
    the server never gets the guard statement."""
    s = start(pooler, pool_size=1, query_wait_timeout="0")
    (a,) = sleepers(s, 1, postgres)
    w, q, v = Client(s), Client(s), Client(s)
    a.run("z", "0.5", "1")
    assert wait_for(lambda: len(active_sleeps(postgres)) == 1, 5)
    w.send(insert(app_table, 1))
    got = w.read_until(m.READY_FOR_QUERY)
    assert "".join(chr(kind) for kind, _ in got) == "12CZ", got
    assert a.reply().rows == [("1",)]
    a.run("z", "0.5", "2")
    assert wait_for(lambda: len(active_sleeps(postgres)) == 1, 5)
    rows, tag, status = q.simple_query(f"INSERT INTO {app_table} VALUES (2)")
    assert (rows, tag, status) == ([], "INSERT 0 1", m.TX_IDLE)
    assert a.reply().rows == [("2",)]
    assert s.metric(PIPELINED) == 2
    rows, _, _ = v.simple_query("SELECT count(*) FROM pg_prepared_statements"
                                " WHERE name = 'PYPOOL_GUARD'")
    assert rows == [["0"]]
    assert rows_of(postgres, app_table) == [1, 2]


# --- what a guarded client sends next ------------------------------------------------------------


def test_what_a_refused_follower_sent_next_never_runs(pooler, postgres, app_table) -> None:
    """W's first INSERT is queued behind a 3 s query; W sends a second one at once (a
    pipelining driver would). Refused at query_wait_timeout, neither runs: the second waited
    for the first to start, and was dropped with W."""
    s = start(pooler, pool_size=1, query_wait_timeout="1")
    (a,) = sleepers(s, 1, postgres)
    w = Client(s)
    a.run("z", "3", "1")
    assert wait_for(lambda: len(active_sleeps(postgres)) == 1, 5)
    w.send(insert(app_table, 1))
    assert wait_for(lambda: s.metric(PIPELINED) == 1, 2)
    w.send(insert(app_table, 2))
    error = w.first_error()
    assert (error["C"], error["M"]) == ("08P01", "query_wait_timeout")
    assert w.read_message() is None
    got = a.reply()
    assert (got.rows, got.error, got.status) == ([("1",)], None, "I")
    still_serves(s)
    assert rows_of(postgres, app_table) == []


def test_a_guarded_begin_goes_on_once_its_transaction_has_started(
    pooler, postgres, app_table
) -> None:
    """W's queued transaction is an extended-protocol BEGIN: after its guard passes, W is
    inside a block on that server, and what it sends next (sent before its BEGIN's reply,
    and after) reaches the server: W is not left waiting for a release only they bring."""
    s = start(pooler, pool_size=1, query_wait_timeout="5")
    (a,) = sleepers(s, 1, postgres)
    w = Client(s)
    a.run("z", "0.5", "1")
    assert wait_for(lambda: len(active_sleeps(postgres)) == 1, 5)
    w.send(pgwire.parse("", "BEGIN") + pgwire.bind("", "") + pgwire.execute() + pgwire.sync())
    assert wait_for(lambda: s.metric(PIPELINED) == 1, 2)
    w.send(insert(app_table, 1))  # before BEGIN's reply: waits for the guard
    got = w.read_until(m.READY_FOR_QUERY)
    assert "".join(chr(kind) for kind, _ in got) == "12CZ" and got[-1][1] == b"T", got
    got = w.read_until(m.READY_FOR_QUERY)
    assert "".join(chr(kind) for kind, _ in got) == "12CZ" and got[-1][1] == b"T", got
    assert a.reply().rows == [("1",)]
    w.send(insert(app_table, 2))
    got = w.read_until(m.READY_FOR_QUERY)
    assert got[-1][1] == b"T", got
    _, tag, status = w.simple_query("COMMIT")
    assert (tag, status) == ("COMMIT", m.TX_IDLE)
    assert rows_of(postgres, app_table) == [1, 2]
    still_serves(s)
    assert backends_idle_in_transaction(postgres) == 0
