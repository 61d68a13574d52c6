"""Pipelining (pypool/net/pipeline.py), against a real PostgreSQL: while clients wait for a
server, a waiting client's transaction is written to a busy server right behind the linked
client's, when that one is sure to be over at its Sync.

What must hold: every client gets its own replies; nothing is queued behind a transaction
that may stay open (BEGIN, or anything sent inside a transaction block); a client that dies
in the line, a CancelRequest from a client still queued, and a server that dies under the
line hurt nobody else and leave no transaction open.

The raw-protocol tests form the line on purpose: a holder takes the only server with BEGIN,
the clients A, B, C queue in that order (each Bind/Execute/Sync of a statement the server
has already prepared), and the holder's COMMIT hands the server to A, with B and C written
behind it. `pypool_pipelined_transactions_total` says how many were.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
import urllib.request
from dataclasses import dataclass, field

import asyncpg
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pypool.embedded import free_port
from pypool.protocol import messages as m

from . import pgwire
from .app_client import CONNECT_TIMEOUT
from .polling import wait_for
from .rawclient import RawClient

pytestmark = pytest.mark.timeout(30)

POOL = {"database": "app", "user": "app"}
PIPELINED = "pypool_pipelined_transactions_total"
WAITING = "pgbouncer_pools_client_waiting_connections"
ACTIVE_SERVERS = "pgbouncer_pools_server_active_connections"
MISSES = "pypool_prepared_statement_misses_total"

# A neutral statement (it starts with SELECT) that sleeps $1 seconds and returns $2.
SLEEPY = "SELECT $2::int AS v FROM pg_sleep($1::float8)"


# --- the pooler and its metrics ------------------------------------------------------------


@dataclass
class Started:
    host: str
    port: int
    metrics_port: int

    def metric(self, name: str) -> float:
        """The sum of `name`'s samples for the pool app/app (0 when there are none yet)."""
        url = f"http://{self.host}:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in POOL.items()
                ):
                    total += sample.value
        return total

    def wait_metric(self, name: str, want: float, timeout: float = 5.0) -> None:
        assert wait_for(lambda: self.metric(name) == want, timeout), (
            f"{name} is {self.metric(name)}, expected {want}"
        )


def start(pooler, pool_size: int = 1, depth: int | None = 4, trust: bool = True,
          **settings: str) -> Started:
    """A pooler with pipelining on (it is opt-in), unless `depth` says otherwise (None: the
    default, off)."""
    metrics_port = free_port()
    overrides = {"default_pool_size": str(pool_size), "metrics_port": str(metrics_port),
                 **settings}
    if trust:
        overrides["auth_type"] = "trust"
    if depth is not None:
        overrides["pipeline_depth"] = str(depth)
    p = pooler(ini_overrides=overrides)
    return Started(p.host, p.port, metrics_port)


# --- raw clients -----------------------------------------------------------------------------


@dataclass
class Reply:
    rows: list[tuple[str | None, ...]] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    error: dict[str, str] | None = None
    status: str = ""

    @property
    def sqlstate(self) -> str | None:
        return None if self.error is None else self.error.get("C")


_opened: list[RawClient] = []


@pytest.fixture(autouse=True)
def _close_clients(pooler):
    """Close the test's raw clients before its poolers stop (a pooler stops once its clients
    have left), also when the test failed halfway."""
    yield
    while _opened:
        _opened.pop().close()


class Client(RawClient):
    """A trust login as app to db app, with the BackendKeyData the pooler gave."""

    def __init__(self, s: Started) -> None:
        super().__init__(s.host, s.port, timeout=10.0)
        _opened.append(self)
        login = self.login("app", "app")
        assert login.error is None, login.error
        assert login.backend_key is not None
        self.key = login.backend_key

    def reply(self) -> Reply:
        """The messages up to the next ReadyForQuery, summed up."""
        out = Reply()
        for kind, body in self.read_until(m.READY_FOR_QUERY):
            if kind == m.DATA_ROW:
                out.rows.append(tuple(m.parse_data_row(body)))
            elif kind == m.COMMAND_COMPLETE:
                out.tags.append(m.parse_command_tag(body))
            elif kind == m.ERROR_RESPONSE:
                out.error = m.parse_error_fields(body)
            elif kind == m.READY_FOR_QUERY:
                out.status = chr(body[0])
        return out

    def run(self, statement: str, *params: str) -> None:
        """Send one transaction: Bind/Execute of a named statement, Sync."""
        self.send(execute(statement, *params) + pgwire.sync())

    def silent_for(self, seconds: float) -> bool:
        """True if nothing at all (no byte, no EOF) arrives within `seconds`."""
        if self._buf:
            return False
        self.sock.settimeout(seconds)
        try:
            self.sock.recv(1, socket.MSG_PEEK)
        except TimeoutError:
            return True
        finally:
            self.sock.settimeout(10.0)
        return False

    def first_error(self) -> dict[str, str]:
        """Read until an ErrorResponse (a timeout or EOF before one fails the test)."""
        seen = []
        while True:
            msg = self.read_message()
            assert msg is not None, f"closed without an ErrorResponse; got {seen!r}"
            if msg[0] == m.ERROR_RESPONSE:
                return m.parse_error_fields(msg[1])
            seen.append(msg)

    def reset(self) -> None:
        """Close with a TCP RST instead of a FIN."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def execute(statement: str, *params: str) -> bytes:
    return pgwire.bind("", statement, list(params)) + pgwire.execute()


def cancel(s: Started, key: tuple[int, int]) -> None:
    with socket.create_connection((s.host, s.port), timeout=5) as sock:
        sock.sendall(m.cancel_request(*key))
        assert sock.recv(1024) == b""  # closed, no answer


def queue_up(s: Started, holder: Client, *requests: tuple[Client, str, tuple[str, ...]]) -> None:
    """With `holder` in a transaction on the only server, send each request in turn, each
    once the one before it waits for the server, so that the queue is in this order."""
    before = s.metric(WAITING)
    for n, (client, statement, params) in enumerate(requests, 1):
        client.run(statement, *params)
        s.wait_metric(WAITING, before + n)


def sleepy_line(s: Started, holder: Client, *runs: tuple[str, str]) -> tuple[int, list[Client]]:
    """One sleepy client per (seconds, value), queued in that order while `holder` keeps the
    only server in a transaction; the holder's COMMIT hands the server to the first, with the
    others written behind it. Returns the server's backend pid and the clients."""
    clients = sleepy_clients(s, len(runs))
    pid = begin(holder)
    queue_up(s, holder, *((client, "z", run) for client, run in zip(clients, runs, strict=True)))
    commit(holder)
    return pid, clients


def begin(holder: Client) -> int:
    """The holder opens a transaction on the only server; returns that backend's pid."""
    rows, _, status = holder.simple_query("BEGIN; SELECT pg_backend_pid()")
    assert status == m.TX_IN_BLOCK
    return int(rows[0][0])


def commit(holder: Client) -> None:
    _, tag, status = holder.simple_query("COMMIT")
    assert (tag, status) == ("COMMIT", m.TX_IDLE)


def sleepy_clients(s: Started, count: int) -> list[Client]:
    """Clients that have each prepared SLEEPY as "z" and run it once (so the one server has
    it prepared, and their Binds of it are plain hits)."""
    out = []
    for i in range(count):
        c = Client(s)
        c.send(pgwire.parse("z", SLEEPY) + execute("z", "0", str(-i)) + pgwire.sync())
        got = c.reply()
        assert got.rows == [(str(-i),)] and got.status == "I", got
        out.append(c)
    return out


def backends_idle_in_transaction(postgres) -> int:
    rows = postgres.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = 'app' AND usename = 'app'"
        " AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()"
    )
    assert rows is not None
    return int(rows[0][0])


def active_sleeps(postgres) -> list[int]:
    rows = postgres.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = 'app' AND state = 'active'"
        " AND query LIKE %s AND pid <> pg_backend_pid()",
        params=("%pg_sleep($1::float8)%",),
    )
    assert rows is not None
    return [int(r[0]) for r in rows]


def still_serves(s: Started) -> None:
    with Client(s) as c:
        c.send(pgwire.parse("q", "SELECT $1::int * 2") + execute("q", "21") + pgwire.sync())
        got = c.reply()
        assert (got.rows, got.error, got.status) == ([("42",)], None, "I")


# --- 1. many clients, a pool of two ------------------------------------------------------------


CLIENTS = 30
ROUNDS = 60


async def asyncpg_client(dsn: str, i: int) -> int:
    """Named statements (asyncpg's cache): Bind/Execute/Sync once prepared."""
    conn = await asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT)
    try:
        mine = f"client-{i}"
        for j in range(ROUNDS):
            value = i * 1000 + j
            row = await conn.fetchrow("SELECT $1::int AS v, $2::text AS who", value, mine)
            assert (row["v"], row["who"]) == (value, mine)
            assert await conn.fetchval("SELECT $1::int * 2", value) == value * 2
        return ROUNDS
    finally:
        await conn.close()


async def psycopg_client(dsn: str, i: int) -> int:
    """prepare_threshold=0: named statements from the first execution on; Bind/Describe
    portal/Execute/Sync once prepared."""
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, prepare_threshold=0, connect_timeout=CONNECT_TIMEOUT
    ) as conn:
        mine = f"client-{i}"
        for j in range(ROUNDS):
            value = i * 1000 + j
            cur = await conn.execute("SELECT %s::int AS v, %s::text AS who", (value, mine))
            assert await cur.fetchall() == [(value, mine)]
            cur = await conn.execute("SELECT %s::int * 2", (value,))
            assert await cur.fetchall() == [(value * 2,)]
        return ROUNDS


@pytest.mark.timeout(60)
@pytest.mark.parametrize("depth", [4, None], ids=["pipeline_depth=4", "default-off"])
@pytest.mark.parametrize("driver", [psycopg_client, asyncpg_client], ids=["psycopg", "asyncpg"])
async def test_many_prepared_clients_each_get_their_own_results(pooler, driver, depth) -> None:
    """30 connections running prepared statements over 2 servers: every reply is the client's
    own; with pipeline_depth = 4 transactions were pipelined, with the default (off) none
    was."""
    s = start(pooler, pool_size=2, depth=depth, trust=False)
    dsn = f"postgresql://app:app-secret@{s.host}:{s.port}/app"
    runs = [driver(dsn, i) for i in range(CLIENTS)]
    done = await asyncio.wait_for(asyncio.gather(*runs), 45)
    assert sum(done) == CLIENTS * ROUNDS
    pipelined = await asyncio.to_thread(s.metric, PIPELINED)
    if not depth:
        assert pipelined == 0
    else:
        assert pipelined > 0, "no transaction was pipelined"


# --- 2. transaction control is never pipelined behind ------------------------------------------


def test_nothing_is_queued_behind_a_prepared_begin(pooler, postgres, app_table) -> None:
    """A's BEGIN (a prepared statement, extended protocol) and then its INSERT inside the
    block are not "sure to end at their Sync": B, waiting all along, is not written behind
    them. B's row is inserted after A's ROLLBACK, and only B's row exists."""
    s = start(pooler, pool_size=1)
    insert = f"INSERT INTO {app_table} VALUES ($1::int)"
    holder, a, b = Client(s), Client(s), Client(s)
    for c in (a, b):
        # Every statement on the one server and the client's map; nothing left behind.
        c.send(pgwire.parse("begin", "BEGIN") + pgwire.parse("ins", insert)
               + pgwire.parse("rollback", "ROLLBACK")
               + execute("begin") + execute("ins", "0") + execute("rollback") + pgwire.sync())
        got = c.reply()
        assert got.error is None and got.tags == ["BEGIN", "INSERT 0 1", "ROLLBACK"], got
        assert got.status == "I"
    begin(holder)
    queue_up(s, holder, (a, "begin", ()), (b, "ins", ("2",)))
    commit(holder)  # the server goes to A, with B still waiting
    got = a.reply()
    assert (got.tags, got.error, got.status) == (["BEGIN"], None, "T")
    a.run("ins", "1")  # neutral text, but sent inside a transaction block
    got = a.reply()
    assert (got.tags, got.error, got.status) == (["INSERT 0 1"], None, "T")
    assert b.silent_for(0.5), "B got a reply while A's transaction was open"
    assert s.metric(WAITING) == 1
    assert [tuple(r) for r in postgres.execute(f"SELECT x FROM {app_table}", dbname="app")] == []
    a.run("rollback")
    got = a.reply()
    assert (got.tags, got.error, got.status) == (["ROLLBACK"], None, "I")
    got = b.reply()
    assert (got.tags, got.error, got.status) == (["INSERT 0 1"], None, "I")
    rows = postgres.execute(f"SELECT x FROM {app_table} ORDER BY x", dbname="app")
    assert [tuple(r) for r in rows] == [(2,)]
    assert s.metric(PIPELINED) == 0
    assert backends_idle_in_transaction(postgres) == 0


def test_nothing_is_queued_behind_an_unnamed_begin(pooler, postgres, app_table) -> None:
    """The same with the unnamed statement (Parse "" of BEGIN, as a driver's one-off query
    would send it): B is not written behind it; the unnamed SELECT after the ROLLBACK is."""
    s = start(pooler, pool_size=1)
    insert = f"INSERT INTO {app_table} VALUES ($1::int)"
    holder, a, b = Client(s), Client(s), Client(s)
    b.send(pgwire.parse("ins", insert) + execute("ins", "0") + pgwire.sync())
    assert b.reply().error is None
    postgres.execute(f"DELETE FROM {app_table}", dbname="app")
    begin(holder)
    before = s.metric(WAITING)
    a.send(pgwire.parse("", "BEGIN") + execute("") + pgwire.sync())
    s.wait_metric(WAITING, before + 1)
    b.run("ins", "2")
    s.wait_metric(WAITING, before + 2)
    commit(holder)
    got = a.reply()
    assert (got.tags, got.error, got.status) == (["BEGIN"], None, "T")
    assert b.silent_for(0.5), "B got a reply while A's transaction was open"
    a.send(m.query("ROLLBACK"))
    assert a.reply().status == "I"
    got = b.reply()
    assert (got.tags, got.error, got.status) == (["INSERT 0 1"], None, "I")
    assert s.metric(PIPELINED) == 0
    # A neutral unnamed statement does let the next client in behind it.
    begin(holder)
    before = s.metric(WAITING)
    a.send(pgwire.parse("", "SELECT 1 FROM pg_sleep(0.2)") + execute("") + pgwire.sync())
    s.wait_metric(WAITING, before + 1)
    b.run("ins", "3")
    s.wait_metric(WAITING, before + 2)
    commit(holder)
    assert a.reply().rows == [("1",)]
    assert b.reply().tags == ["INSERT 0 1"]
    assert s.metric(PIPELINED) == 1
    rows = postgres.execute(f"SELECT x FROM {app_table} ORDER BY x", dbname="app")
    assert [tuple(r) for r in rows] == [(2,), (3,)]
    assert backends_idle_in_transaction(postgres) == 0


def test_clients_queued_behind_a_neutral_select_get_their_own_replies(pooler) -> None:
    """A runs a prepared SELECT pg_sleep(0.3); B and C, queued behind it on the same server,
    each get their own value, right after A's."""
    s = start(pooler, pool_size=1)
    holder = Client(s)
    _, (a, b, c) = sleepy_line(s, holder, ("0.3", "1"), ("0", "2"), ("0", "3"))
    started = time.monotonic()  # A's 0.3 s query began at the commit just before
    for client, value in ((a, "1"), (b, "2"), (c, "3")):
        got = client.reply()
        assert (got.rows, got.error, got.status) == ([(value,)], None, "I")
    assert time.monotonic() - started < 3
    assert s.metric(PIPELINED) == 2  # B behind A, C behind B
    # The line is over: each goes on as usual, on the one server.
    for client, value in ((c, "30"), (a, "10"), (b, "20")):
        client.run("z", "0", value)
        got = client.reply()
        assert (got.rows, got.error, got.status) == ([(value,)], None, "I")


def test_no_line_grows_on_a_server_past_its_lifetime(pooler) -> None:
    """A server due to close once free (here: server_lifetime over) takes no more clients
    into its line: under a steady load a line kept topped up would keep it from ever being
    free. B joins A's line while the server is young; C, arriving after its lifetime, waits
    for a new server."""
    s = start(pooler, pool_size=1, server_lifetime="2")
    a, b, c = sleepy_clients(s, 3)  # the one server is born here
    a.run("z", "3", "1")
    s.wait_metric(ACTIVE_SERVERS, 1)
    b.run("z", "0", "2")
    s.wait_metric(PIPELINED, 1)
    time.sleep(2.1)  # past the server's lifetime now, with A still running
    c.run("z", "0", "3")
    for client, value in ((a, "1"), (b, "2"), (c, "3")):
        got = client.reply()
        assert (got.rows, got.error, got.status) == ([(value,)], None, "I"), got.error
    assert s.metric(PIPELINED) == 1  # C was not queued behind B on the old server


# --- 3. a client that dies in the line ------------------------------------------------------------


@pytest.mark.parametrize("how", ["close", "reset"])
@pytest.mark.parametrize("who", ["queued", "head"])
def test_client_that_dies_in_a_pipeline(pooler, postgres, who, how) -> None:
    """B is written behind A's slow SELECT, C behind B; then B ("queued") or A ("head", mid
    query) disconnects before its reply: the others get theirs, the server serves on (same
    backend: its replies went by, the line moved on), nothing is left in a transaction."""
    s = start(pooler, pool_size=1)
    holder = Client(s)
    pid, (a, b, c) = sleepy_line(s, holder, ("0.5", "1"), ("0", "2"), ("0", "3"))
    s.wait_metric(PIPELINED, 2)  # B and C are on the server, behind A
    assert wait_for(lambda: len(active_sleeps(postgres)) == 1, 5)  # A's query runs
    dead, survivors = (b, [(a, "1"), (c, "3")]) if who == "queued" else (a, [(b, "2"), (c, "3")])
    if how == "reset":
        dead.reset()
    else:
        dead.close()
    for client, value in survivors:
        got = client.reply()
        assert (got.rows, got.error, got.status) == ([(value,)], None, "I")
    still_serves(s)
    rows, _, _ = holder.simple_query("SELECT pg_backend_pid()")
    assert rows == [[str(pid)]]
    for client, value in survivors:
        client.run("z", "0", value + "0")
        got = client.reply()
        assert (got.rows, got.error, got.status) == ([(value + "0",)], None, "I")
    assert backends_idle_in_transaction(postgres) == 0


def test_an_error_in_a_pipelined_transaction_is_its_own(pooler, postgres) -> None:
    """B's Bind fails (22P02) in the middle of the line: the server skips to B's Sync only;
    A before it and C after it get their results."""
    s = start(pooler, pool_size=1)
    holder = Client(s)
    _, (a, b, c) = sleepy_line(s, holder, ("0.3", "1"), ("0", "not a number"), ("0", "3"))
    got = a.reply()
    assert (got.rows, got.error, got.status) == ([("1",)], None, "I")
    got = b.reply()
    assert (got.rows, got.sqlstate, got.status) == ([], "22P02", "I")
    got = c.reply()
    assert (got.rows, got.error, got.status) == ([("3",)], None, "I")
    assert s.metric(PIPELINED) == 2
    b.run("z", "0", "2")
    got = b.reply()
    assert (got.rows, got.error, got.status) == ([("2",)], None, "I")
    assert backends_idle_in_transaction(postgres) == 0


def test_a_queued_client_that_sends_more_waits_for_its_own_turn(pooler) -> None:
    """B, written behind A, sends a second transaction before its first reply, with C
    already behind B: on this server it would come after C's, where nobody expects its
    replies. It waits, runs once B's first is over, and everyone gets their own replies."""
    s = start(pooler, pool_size=1)
    holder = Client(s)
    _, (a, b, c) = sleepy_line(s, holder, ("0.3", "1"), ("0", "2"), ("0", "3"))
    s.wait_metric(PIPELINED, 2)
    b.run("z", "0", "22")
    for client, value in ((a, "1"), (b, "2"), (c, "3"), (b, "22")):
        got = client.reply()
        assert (got.rows, got.error, got.status) == ([(value,)], None, "I")


def test_a_follower_whose_statement_the_server_lacks(pooler) -> None:
    """With max_prepared_statements = 2, B's statement was evicted from the server: it is
    parsed again in the middle of the line. B gets exactly what it would have (no stray
    ParseComplete or CloseComplete of the pooler's), A and C theirs."""
    metrics_port = free_port()
    p = pooler(ini_overrides={"auth_type": "trust", "default_pool_size": "1",
                              "pipeline_depth": "4",
                              "max_prepared_statements": "2",
                              "metrics_port": str(metrics_port)})
    s = Started(p.host, p.port, metrics_port)
    holder = Client(s)
    a, b, c = Client(s), Client(s), Client(s)
    b.send(pgwire.parse("w", "SELECT $1::int + 100") + execute("w", "0") + pgwire.sync())
    assert b.reply().rows == [("100",)]
    for i, client in enumerate((a, b, c)):  # SLEEPY is used last: "w" is the oldest
        client.send(pgwire.parse("z", SLEEPY) + execute("z", "0", str(i)) + pgwire.sync())
        assert client.reply().rows == [(str(i),)]
    begin(holder)
    # The holder's statement takes the place of "w" on the server.
    holder.send(pgwire.parse("h", "SELECT 7") + execute("h") + pgwire.sync())
    got = holder.reply()
    assert (got.rows, got.status) == ([("7",)], "T")
    misses = s.metric(MISSES)
    queue_up(s, holder, (a, "z", ("0.3", "1")), (b, "w", ("2",)), (c, "z", ("0", "3")))
    commit(holder)
    for client, value in ((a, "1"), (b, "102"), (c, "3")):
        got = client.read_until(m.READY_FOR_QUERY)
        assert "".join(chr(kind) for kind, _ in got) == "2DCZ", got
        assert m.parse_data_row(got[1][1]) == [value]
        assert got[3][1] == b"I"
    assert s.metric(MISSES) == misses + 1  # B's "w", parsed again behind A
    assert s.metric(PIPELINED) == 1  # B behind A; C not behind B, whose Bind needed a Parse


# --- 4. a cancel from a client still queued ------------------------------------------------------


def test_cancel_from_a_queued_client_does_not_cancel_the_one_ahead(pooler, postgres) -> None:
    """B is queued behind A's SELECT pg_sleep(1) and sends a CancelRequest while A's query
    runs: A's query completes; B's is canceled (57014) or completes."""
    s = start(pooler, pool_size=1)
    holder = Client(s)
    a, b = sleepy_clients(s, 2)
    begin(holder)
    queue_up(s, holder, (a, "z", ("1", "1")), (b, "z", ("1", "2")))
    started = time.monotonic()
    commit(holder)
    s.wait_metric(PIPELINED, 1)  # B is written behind A
    assert wait_for(lambda: len(active_sleeps(postgres)) == 1, 5)
    cancel(s, b.key)
    got = a.reply()
    assert (got.rows, got.error, got.status) == ([("1",)], None, "I"), got.error
    assert time.monotonic() - started >= 0.9
    got = b.reply()
    assert got.status == "I"
    assert got.sqlstate == "57014" or (got.rows, got.error) == ([("2",)], None), got
    # Both go on.
    for client, value in ((a, "3"), (b, "4")):
        client.run("z", "0", value)
        got = client.reply()
        assert (got.rows, got.error, got.status) == ([(value,)], None, "I")


def test_cancel_from_a_queued_client_does_not_cancel_the_one_behind(pooler, postgres) -> None:
    """B (a quick query) is queued between A's SELECT pg_sleep(0.5) and C's SELECT
    pg_sleep(1), and sends a CancelRequest while A's query runs. By the time B heads the line
    its query is long done and C's runs: C's query must not be the one canceled."""
    s = start(pooler, pool_size=1)
    holder = Client(s)
    _, (a, b, c) = sleepy_line(s, holder, ("0.5", "1"), ("0", "2"), ("1", "3"))
    s.wait_metric(PIPELINED, 2)
    assert wait_for(lambda: len(active_sleeps(postgres)) == 1, 5)
    cancel(s, b.key)
    got = a.reply()
    assert (got.rows, got.error, got.status) == ([("1",)], None, "I"), got.error
    got = b.reply()
    assert got.status == "I"
    assert got.sqlstate == "57014" or (got.rows, got.error) == ([("2",)], None), got
    got = c.reply()
    assert (got.rows, got.error, got.status) == ([("3",)], None, "I"), got.error


# --- 5. the server dies under the line --------------------------------------------------------


def test_server_terminated_under_a_pipeline(pooler, postgres) -> None:
    """pg_terminate_backend on the server while A's slow query runs and B, C are queued
    behind it: all three get an error, none hangs; new clients are served."""
    s = start(pooler, pool_size=1)
    holder = Client(s)
    _, (a, b, c) = sleepy_line(s, holder, ("5", "1"), ("0", "2"), ("0", "3"))
    s.wait_metric(PIPELINED, 2)
    assert wait_for(lambda: len(active_sleeps(postgres)) == 1, 5)
    (pid,) = active_sleeps(postgres)
    started = time.monotonic()
    rows = postgres.execute("SELECT pg_terminate_backend(%s)", params=(pid,))
    assert rows is not None and rows[0][0] is True
    for client in (a, b, c):
        error = client.first_error()
        assert error.get("C"), error
    assert time.monotonic() - started < 3  # not A's 5 s: nobody waited for a dead server
    still_serves(s)
    still_serves(s)
    assert backends_idle_in_transaction(postgres) == 0


# --- deferred writes (net/deferred_writes.py) -------------------------------------------------


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True


async def test_deferred_requests_go_out_in_one_write_and_nothing_overtakes_them() -> None:
    """Requests pipelined onto a server in one round of the event loop leave in one write at
    its end; anything sent to that server meanwhile (more of the head's request, read in the
    same round) goes behind them, never before."""
    from pypool.net.deferred_writes import send_soon
    from pypool.net.server import ServerConnection
    from pypool.pooler import Pooler
    from pypool.settings import from_url

    pooler = Pooler(from_url("postgresql://app:secret@127.0.0.1:1/app"))
    pool = pooler.pool_for("app", "app")
    assert pool is not None
    entry = pooler.settings.database("app")
    assert entry is not None
    server = ServerConnection(pooler, pool, "127.0.0.1", 1, "app",
                              pooler.credentials_for(entry, "app"), {})
    transport = RecordingTransport()
    server.transport = transport  # type: ignore[assignment]
    server.send(b"head-1 ")
    send_soon(server, b"head-2 ")
    send_soon(server, b"follower ")
    server.send(b"head-3")
    assert transport.writes == [b"head-1 "]
    await asyncio.sleep(0)  # the end of this round: the pooler flushes
    assert transport.writes == [b"head-1 ", b"head-2 follower head-3"]
    server.send(b"next")
    assert transport.writes[-1] == b"next"
    # Closed with requests still deferred (a client sent a query and its Terminate in one
    # packet): they go out before the server closes, as if written at once.
    send_soon(server, b"last")
    server.close("client gone")
    assert transport.writes[-1] == b"last" and transport.closed


@pytest.mark.timeout(30)
def test_clients_queued_on_a_line_count_as_waiting_for_the_reserve_pool(
    pooler, postgres
) -> None:
    """B is written behind A's 3 s query on the only server, so it is not in the pool's
    queue; it waits all the same, and after reserve_pool_timeout the reserve pool opens a
    server (before, nobody counted as waiting and it never opened)."""
    s = start(pooler, pool_size=1, reserve_pool_size="1", reserve_pool_timeout="0.5")
    holder = Client(s)
    pid, (a, b) = sleepy_line(s, holder, ("3", "1"), ("0", "2"))
    assert s.metric(PIPELINED) == 1
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        rows = postgres.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = 'app' AND datname = 'app'",
            dbname="postgres")
        if int(rows[0][0]) >= 2:
            break
        time.sleep(0.1)
    assert int(rows[0][0]) == 2, "no reserve server opened for the client queued on the line"
    for client, value in ((a, "1"), (b, "2")):
        got = client.reply()
        assert (got.rows, got.error, got.status) == ([(value,)], None, "I")
