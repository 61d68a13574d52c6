"""Faults on either side of the pooler, against a real PostgreSQL: servers that die idle or
mid-query, a PostgreSQL restart, clients that vanish mid-transaction or mid-result.

The rules under test (COMPAT.md, "Transaction pooling"): a server is never handed on with
replies owed or a transaction open; one client's bad luck is nobody else's; the pool heals.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import psycopg
import pytest

from tests.integration.app_client import connect
from tests.integration.polling import settle, wait_for

pytestmark = pytest.mark.timeout(40)

TERMINATE_APP_BACKENDS = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
    " WHERE datname = 'app' AND usename = 'app' AND backend_type = 'client backend'"
)




def _open_servers(conns: list[psycopg.Connection]) -> set[int]:
    pids = set()
    for conn in conns:
        conn.execute("BEGIN")
        pids.add(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
    for conn in conns:
        conn.execute("COMMIT")
    return pids


# -- servers that die -----------------------------------------------------------------


def test_idle_servers_terminated_are_replaced(postgres, pooler, pg_activity) -> None:
    settle(postgres, pg_activity)
    p = pooler()
    conns = [connect(p.dsn()) for _ in range(3)]
    try:
        old = _open_servers(conns)
        assert len(old) == 3
        postgres.execute(TERMINATE_APP_BACKENDS)
        assert wait_for(lambda: pg_activity(postgres) == 0, 5)
        time.sleep(0.2)  # the pooler reads the EOFs
        # The same client connections go on: their next transactions get new servers.
        for i in range(9):
            conn = conns[i % 3]
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            assert pid not in old
        assert 1 <= pg_activity(postgres) <= 3
    finally:
        for conn in conns:
            conn.close()


def test_server_terminated_mid_query_hurts_only_its_client(postgres, pooler, pg_activity) -> None:
    settle(postgres, pg_activity)
    p = pooler()
    victim = connect(p.dsn())
    victim_error: list[BaseException] = []
    others_errors: list[BaseException] = []
    others_done = [0]
    stop = threading.Event()

    def run_victim() -> None:
        try:
            victim.execute("SELECT pg_sleep(10) /* victim */")
        except BaseException as exc:  # noqa: BLE001 - checked below
            victim_error.append(exc)

    def run_other() -> None:
        try:
            with connect(p.dsn()) as conn:
                while not stop.is_set():
                    assert conn.execute("SELECT 1, pg_sleep(0.01)").fetchone()[0] == 1
                    others_done[0] += 1
        except BaseException as exc:  # noqa: BLE001 - checked below
            others_errors.append(exc)

    threads = [threading.Thread(target=run_victim)]
    threads += [threading.Thread(target=run_other) for _ in range(3)]
    try:
        for t in threads:
            t.start()

        def victim_pid() -> int | None:
            rows = postgres.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = 'app'"
                " AND query LIKE 'SELECT pg_sleep(10) /* victim */%'"
            )
            return rows[0][0] if rows else None

        assert wait_for(lambda: victim_pid() is not None, 5)
        pid = victim_pid()
        start = time.monotonic()
        postgres.execute("SELECT pg_terminate_backend(%s)", params=(pid,))
        threads[0].join(5)
        assert victim_error, "the victim's query did not fail"
        assert isinstance(victim_error[0], psycopg.OperationalError), victim_error
        assert time.monotonic() - start < 3
        time.sleep(0.3)  # the others keep going after the crash
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        victim.close()
    assert not others_errors, others_errors
    assert others_done[0] > 10
    with connect(p.dsn()) as conn:
        assert conn.execute("SELECT 8").fetchone()[0] == 8
    assert pg_activity(postgres) <= 5


def test_postgres_restart(postgres, pooler, pg_activity) -> None:
    p = pooler(ini_overrides={"server_login_retry": "1", "query_wait_timeout": "10"})
    conns = [connect(p.dsn()) for _ in range(3)]
    try:
        old = _open_servers(conns)
        postgres.restart()
        # Clients that held no server never noticed: their next transactions just work.
        start = time.monotonic()
        for conn in conns:
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            assert pid not in old
        assert time.monotonic() - start < 5
        with connect(p.dsn()) as conn:
            assert conn.execute("SELECT 9").fetchone()[0] == 9
        assert p.proc.poll() is None
        assert pg_activity(postgres) <= 5
    finally:
        for conn in conns:
            conn.close()


# -- clients that vanish -------------------------------------------------------------------

_HOLD_TRANSACTION = """
import sys, time, psycopg
conn = psycopg.connect(sys.argv[1], autocommit=True, connect_timeout=5)
conn.execute("BEGIN")
conn.execute(f"INSERT INTO {sys.argv[2]} VALUES (1)")
pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
print(pid, flush=True)
time.sleep(60)
"""


def test_client_killed_mid_transaction(postgres, pooler, app_table) -> None:
    p = pooler(ini_overrides={"default_pool_size": "1"})
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD_TRANSACTION, p.dsn(), app_table],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip(), "the client never got its transaction going"
        old_pid = int(line)
        assert postgres.execute(
            "SELECT state FROM pg_stat_activity WHERE pid = %s", params=(old_pid,)
        ) == [("idle in transaction",)]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(5)
    # Pool size 1: the next client gets that server slot, and no transaction with it.
    with connect(p.dsn()) as conn:
        assert conn.execute(f"SELECT count(*) FROM {app_table}").fetchone()[0] == 0
        assert conn.execute("SELECT pg_current_xact_id_if_assigned()").fetchone()[0] is None
        assert conn.execute("SELECT now() = statement_timestamp()").fetchone()[0] is True
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        conn.execute(f"INSERT INTO {app_table} VALUES (2)")

    def old_transaction_gone() -> bool:
        rows = postgres.execute(
            "SELECT state FROM pg_stat_activity WHERE pid = %s", params=(old_pid,)
        )
        return not rows or rows[0][0] == "idle"

    assert wait_for(old_transaction_gone, 5)
    rows = postgres.execute(f"SELECT array_agg(x) FROM {app_table}", dbname="app")
    assert rows == [([2],)]


def _startup_packet(params: dict[str, str]) -> bytes:
    body = (196608).to_bytes(4, "big")
    for key, value in params.items():
        body += key.encode() + b"\x00" + value.encode() + b"\x00"
    body += b"\x00"
    return (len(body) + 4).to_bytes(4, "big") + body


def _read_until_ready(sock: socket.socket) -> None:
    """Read messages until ReadyForQuery; fail on an ErrorResponse."""
    buf = b""
    while True:
        while len(buf) >= 5:
            kind, length = buf[0:1], struct.unpack("!I", buf[1:5])[0]
            if len(buf) < 1 + length:
                break
            body, buf = buf[5 : 1 + length], buf[1 + length :]
            assert kind != b"E", body
            if kind == b"Z":
                return
        chunk = sock.recv(65536)
        assert chunk, "connection closed during login"
        buf += chunk


def test_client_killed_mid_result(postgres, pooler, pg_activity) -> None:
    settle(postgres, pg_activity)
    # trust: this raw client speaks the protocol by hand and skips SCRAM
    p = pooler(ini_overrides={"default_pool_size": "1", "auth_type": "trust"})
    sock = socket.create_connection((p.host, p.port), timeout=5)
    try:
        sock.sendall(_startup_packet({"user": "app", "database": "app"}))
        _read_until_ready(sock)
        sql = b"SELECT repeat('x', 1000) FROM generate_series(1, 200000) /* huge */\x00"
        sock.sendall(b"Q" + struct.pack("!I", 4 + len(sql)) + sql)
        got = 0
        while got < 256 * 1024:
            chunk = sock.recv(65536)
            assert chunk
            got += len(chunk)
        assert pg_activity(postgres) == 1
    finally:
        # An abrupt close: RST, with most of the result still unread.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    # Pool size 1: the slot comes back, and the new client is not handed the tail of
    # someone else's result.
    start = time.monotonic()
    with connect(p.dsn()) as conn:
        assert conn.execute("SELECT 'fresh'").fetchone()[0] == "fresh"
        assert conn.execute("SELECT 2 + 2").fetchone()[0] == 4
    assert time.monotonic() - start < 3

    def huge_query_gone() -> bool:
        rows = postgres.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%/* huge */%'"
            " AND pid <> pg_backend_pid() AND state = 'active'"
        )
        return rows == [(0,)]

    assert wait_for(huge_query_gone, 5)
    assert pg_activity(postgres) <= 1
    assert p.proc.poll() is None
