"""A bounded fuzz run of logged-in sessions: random but well-framed frontend traffic.

Each of a few dozen short-lived connections logs in (trust), sends a random sequence of
frontend messages (simple queries that open, fail and end transactions or start a COPY;
Parse/Bind/Describe/Execute/Close/Sync/Flush with valid and invalid bodies; CopyData,
CopyDone and CopyFail out of place; unknown message types; sometimes a frame cut short), reads
what comes back for a moment and leaves, with a Terminate, a plain close or a reset.

Afterwards the pooler must be up and serving, must not have leaked a transaction (no backend
of `app` idle in transaction, every query a client runs starts a fresh one), must hold no
more backends than default_pool_size, and must not have logged a Python traceback. The seed
is fixed: every run sends the same bytes. A longer campaign sets PYPOOL_FUZZ_SEED and
PYPOOL_FUZZ_CONNECTIONS (and a larger --timeout) and runs this test again per seed.
"""

from __future__ import annotations

import os
import random
import socket
import struct
import time
from collections import deque
from collections.abc import Callable

import psycopg
import pytest

from pypool.embedded import EmbeddedPostgres
from pypool.protocol import messages as m
from tests.conftest import Pooler

from . import pgwire as w
from .polling import wait_for
from .rawclient import RawClient

pytestmark = pytest.mark.timeout(60)

SEED = int(os.environ.get("PYPOOL_FUZZ_SEED", "20261201"))
CONNECTIONS = int(os.environ.get("PYPOOL_FUZZ_CONNECTIONS", "50"))
POOL_SIZE = 2
LINGERING = 2  # connections left open while the next ones run, so some wait for a server
IDLE_READ = 0.15  # a connection stops reading after this long without a byte
READ_CAP = 1.0  # and reads for at most this long in all

SQL = [
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "SELECT 1",
    "SELECT 1/0",
    "SELEC 1",
    "",
    ";",
    "BEGIN; SELECT 1/0",
    "BEGIN; SELECT 1",
    "SELECT 1; SELECT 2",
    "SAVEPOINT s1",
    "ROLLBACK TO s1",
    "SELECT generate_series(1, 50)",
    "SELECT pg_sleep(0.02)",
    "COPY (SELECT 1) TO STDOUT",
    "CREATE TEMP TABLE IF NOT EXISTS fz (x int)",
    "COPY fz FROM STDIN",
    "BEGIN; CREATE TEMP TABLE IF NOT EXISTS fz (x int); COPY fz FROM STDIN",
    "PREPARE fzp AS SELECT 1",
    "EXECUTE fzp",
    "DEALLOCATE ALL",
    "DISCARD ALL",
]
STATEMENT_SQL = [
    "SELECT 1",
    "SELECT $1::int",
    "SELECT 1/0",
    "BEGIN",
    "COMMIT",
    "SELEC",
    "SELECT 1; SELECT 2",
    "COPY fz FROM STDIN",
    "",
]
NAMES = ["", "s1", "s2", "nosuch"]


def frontend_message(rng: random.Random) -> bytes:
    """One well-framed frontend message, valid or not."""
    if rng.random() < 0.03:  # a type byte the protocol does not have (or not after login)
        kind = rng.choice([b"\x00", b"\xff", b"A", b"F", b"p", b"Z", b"1", b"?", b"z"])
        return w.message(kind, rng.randbytes(rng.randrange(12)))
    pick = rng.randrange(15)
    name = rng.choice(NAMES)
    if pick <= 3:
        return w.query(rng.choice(SQL))
    if pick == 4:
        return w.parse(name, rng.choice(STATEMENT_SQL), rng.choice([(), (23,), (0, 0)]))
    if pick == 5:
        params = [rng.choice(["1", "x", None, ""]) for _ in range(rng.randrange(3))]
        return w.bind(rng.choice(["", "p1"]), name, params, result_binary=rng.random() < 0.2)
    if pick == 6:
        return w.describe(rng.choice("SP"), rng.choice(["", "p1", name]))
    if pick == 7:
        return w.execute(rng.choice(["", "p1"]), rng.choice([0, 0, 1]))
    if pick == 8:
        return w.sync()
    if pick == 9:
        return w.flush()
    if pick == 10:
        return w.close(rng.choice("SP"), name)
    if pick == 11:  # COPY messages, most often where no COPY is in progress
        return rng.choice(
            [
                w.message(b"d", b"1\n" * rng.randrange(4)),
                w.message(b"c"),
                w.message(b"f", b"boom\x00"),
            ]
        )
    if pick == 12:  # a known type with a body that does not parse
        return rng.choice(
            [
                w.message(b"P", b"s1"),  # no NUL anywhere
                w.message(b"P", b"s1\x00SELECT 1\x00" + struct.pack("!H", 9)),  # 9 types, none
                w.message(b"B", b"\x00"),
                w.message(b"B", b"\x00s1\x00" + struct.pack("!HH", 0, 5)),  # 5 params, none
                w.message(b"D", b""),
                w.message(b"D", b"Z\x00"),
                w.message(b"E", b"\x00"),  # no row count
                w.message(b"C", b"Q"),
                w.message(b"Q", b"SELECT 1"),  # no NUL
                w.message(b"S", b"extra"),
                w.message(b"H", b"\x00\x00"),
            ]
        )
    if pick == 13:
        return w.query(rng.choice(SQL)) + w.sync()
    return w.parse("", "SELECT 1") + w.bind("", "") + w.execute() + w.sync()


def session_bytes(rng: random.Random) -> bytes:
    """A connection's whole send: 1-12 messages, often a Sync, now and then a cut frame."""
    data = b"".join(frontend_message(rng) for _ in range(rng.randint(1, 12)))
    if rng.random() < 0.5:
        data += w.sync()
    if rng.random() < 0.15:  # a frame whose length promises more than ever comes
        whole = w.query("SELECT 'never finished'")
        data += whole[: rng.randrange(1, len(whole) - 1)]
    return data


def read_for_a_moment(raw: RawClient) -> list[int]:
    """The types of the messages that arrive until the pooler goes quiet or closes."""
    kinds: list[int] = []
    raw.sock.settimeout(IDLE_READ)
    deadline = time.monotonic() + READ_CAP
    while time.monotonic() < deadline:
        try:
            msg = raw.read_message()
        except (TimeoutError, OSError):
            break
        if msg is None:
            break
        kinds.append(msg[0])
    return kinds


def leave(raw: RawClient, how: int) -> None:
    try:
        if how == 0:
            raw.send(w.terminate())
        elif how == 1:  # a reset (RST), as a crashed client's kernel would send
            raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass  # the pooler closed first
    raw.close()


def idle_in_transaction(postgres: EmbeddedPostgres) -> list[tuple[object, ...]]:
    rows = postgres.execute(
        "SELECT pid, state, query FROM pg_stat_activity"
        " WHERE usename = 'app' AND state LIKE 'idle in transaction%'"
    )
    return list(rows or [])


def test_fuzzed_sessions_leave_no_transaction_open_and_the_pooler_serving(
    pooler: Callable[..., Pooler], postgres: EmbeddedPostgres, pg_activity: Callable[..., int]
) -> None:
    p = pooler({"auth_type": "trust", "default_pool_size": str(POOL_SIZE)})
    rng = random.Random(SEED)
    answered = errors = 0
    started = time.monotonic()
    lingering: deque[tuple[RawClient, int]] = deque()
    for number in range(CONNECTIONS):
        data = session_bytes(rng)
        how = rng.randrange(3)
        raw = RawClient(p.host, p.port, timeout=5)
        login = raw.login("app", "app")
        assert login.error is None, (number, login.error)
        try:
            raw.send(data)
        except OSError:
            pass  # closed on an early message: that is an answer too
        kinds = read_for_a_moment(raw)
        answered += kinds.count(m.READY_FOR_QUERY)
        errors += kinds.count(m.ERROR_RESPONSE)
        # Some stay a while, perhaps holding a server in a transaction or a COPY.
        if rng.random() < 0.3:
            lingering.append((raw, how))
        else:
            leave(raw, how)
        while len(lingering) > LINGERING:
            leave(*lingering.popleft())
        assert p.proc.poll() is None, f"pypool died after connection {number}\n{p.log()[-3000:]}"
    while lingering:
        leave(*lingering.popleft())
    elapsed = time.monotonic() - started
    # The run did reach servers and their errors, not just the pooler's door.
    assert answered >= CONNECTIONS // 4 and errors >= CONNECTIONS // 4, (answered, errors)

    # Up, and serving a normal client.
    with psycopg.connect(p.dsn(), connect_timeout=5) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)

    # No dead client's transaction is handed to the next one: every query starts afresh.
    with RawClient(p.host, p.port, timeout=5) as raw:
        assert raw.login("app", "app").error is None
        for _ in range(2 * POOL_SIZE + 2):
            rows, _tag, status = raw.simple_query(
                "SELECT now() = statement_timestamp(), txid_current_if_assigned() IS NULL"
            )
            assert (rows, chr(status)) == ([["t", "t"]], "I")
        raw.send(w.terminate())

    # And none is left open on the server side either.
    assert wait_for(lambda: not idle_in_transaction(postgres), 1.5), idle_in_transaction(postgres)
    assert pg_activity(postgres, "app", "app") <= POOL_SIZE
    assert p.proc.poll() is None
    log = p.log()
    assert "Traceback" not in log, log[-5000:]
    assert elapsed < 15 * max(1, CONNECTIONS / 50), f"the fuzz run took {elapsed:.1f} s"
