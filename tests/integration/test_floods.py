"""Floods: a client that sends faster than the pooler can pass its bytes on.

Whatever a client sends before it has a server, while its requests wait on a reply, or
faster than it reads, must stop being read (back-pressure: the kernel's buffers fill and
the client's send blocks), never be buffered without bound; the work per message must not
grow with the backlog; and everyone else keeps being served meanwhile. Each test floods
for a few seconds with a canary client beside it, then bounds the pooler's memory.
"""

from __future__ import annotations

import signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from pypool.protocol import messages as m
from tests.conftest import rss_mib
from tests.integration.rawclient import RawClient, TlsRawClient

from .tls_ca import Certificates, certs, tls_settings

pytestmark = pytest.mark.timeout(120)
__all__ = ["certs"]  # the fixture (tls_ca.py)

MiB = 1 << 20


def _flood(sock: socket.socket, chunk: bytes, seconds: float, limit: int) -> int:
    """Send `chunk` again and again for `seconds` or until `limit` bytes went, whichever
    first; returns how many bytes the kernel took. A pooler that stops reading makes the
    sends block (then time out) long before the limit."""
    sock.settimeout(0.5)
    sent = 0
    deadline = time.monotonic() + seconds
    view = memoryview(chunk)
    while time.monotonic() < deadline and sent < limit:
        try:
            sent += sock.send(view)
        except (TimeoutError, BlockingIOError):
            continue
        except OSError:
            break
    return sent


class Canary:
    """A client querying every 200 ms on its own pool: the slowest answer it waited for."""

    def __init__(self, host: str, port: int) -> None:
        self.client = RawClient(host, port, timeout=30)
        self.client.login("app", "bench")
        self.worst = 0.0
        self.answers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            rows, _, _ = self.client.simple_query("SELECT 1")
            assert rows == [["1"]]
            self.worst = max(self.worst, time.monotonic() - started)
            self.answers += 1
            self._stop.wait(0.2)

    @contextmanager
    def beside(self) -> Iterator[Canary]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(timeout=40)
            self.client.close()


def _quit(p) -> None:
    """SIGQUIT: exit now. SIGTERM would wait for every client, and the flooding one's close
    never reaches the pooler while it is not read: the client's FIN waits in its own full
    send buffer behind the bytes the pooler's zero window refuses (TCP; PgBouncer is in the
    same place). A client whose FIN does arrive is let go: test_a_client_that_leaves_..."""
    p.proc.send_signal(signal.SIGQUIT)
    assert p.proc.wait(10) == 0


def _bounded(p, flood: Callable[[], int], grown_mib: float = 48) -> tuple[int, Canary]:
    """Run `flood` beside a canary; the pooler's RSS may grow at most `grown_mib` while it
    runs, and comes back (within the same) once the flooding client has left."""
    before = rss_mib(p.proc.pid)
    canary = Canary(p.host, p.port)
    with canary.beside():
        sent = flood()
        during = rss_mib(p.proc.pid)
        time.sleep(0.6)
    assert canary.answers >= 2, "the canary was not served during the flood"
    assert during - before < grown_mib, f"RSS grew {during - before:.0f} MiB during a flood"
    time.sleep(0.6)
    after = rss_mib(p.proc.pid)
    assert after - before < grown_mib, f"RSS stayed {after - before:.0f} MiB up after it"
    return sent, canary


def _silent_server() -> tuple[socket.socket, list[socket.socket]]:
    """A server that accepts TCP and never answers, and the connections it accepted."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    accepted: list[socket.socket] = []

    def accept() -> None:
        try:
            while True:
                accepted.append(silent.accept()[0])
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    return silent, accepted


def test_a_client_whose_login_waits_for_a_server_stops_being_read(pooler, postgres):
    """Its pool's server accepts TCP and never answers: the client is welcomed only once a
    server is, and what it sends meanwhile is read up to a point, then not at all."""
    silent, accepted = _silent_server()
    p = pooler({"auth_type": "trust", "server_connect_timeout": "30",
                "server_login_retry": "30"}, databases={
        "silent": f"host=127.0.0.1 port={silent.getsockname()[1]} dbname=x",
        "bench": f"host={postgres.host} port={postgres.port} dbname=bench"})
    try:
        client = RawClient(p.host, p.port, timeout=10)
        client.send_startup({"user": "app", "database": "silent"})
        query = m.query("SELECT 1")
        sent, _ = _bounded(p, lambda: _flood(client.sock, query * 2048, 2.5, 512 * MiB))
        assert sent < 64 * MiB, f"the pooler read {sent / MiB:.0f} MiB it could not send"
        client.close()
        _quit(p)
    finally:
        silent.close()
        for sock in accepted:
            sock.close()


def test_a_client_that_leaves_while_not_read_is_let_go(pooler, postgres):
    """A client waiting at login sends past the high-water mark (so the pooler stops reading
    it) and closes: its FIN reaches the pooler's socket, unread; the janitor's poll sees it
    (POLLRDHUP), the client is closed at once, and SIGTERM, which waits for every client,
    ends the process without waiting for a login that would never come."""
    silent, accepted = _silent_server()
    p = pooler({"auth_type": "trust", "server_connect_timeout": "30",
                "server_login_retry": "30"}, databases={
        "silent": f"host=127.0.0.1 port={silent.getsockname()[1]} dbname=x"})
    try:
        client = RawClient(p.host, p.port, timeout=10)
        client.send_startup({"user": "app", "database": "silent"})
        query = m.query("SELECT 1")
        client.send(query * ((1 << 20) // len(query) + 4096))  # 1 MiB and some 60 KiB
        time.sleep(0.5)
        client.sock.close()
        assert _wait(lambda: "closing because: client closed the connection" in p.log(), 5), \
            p.log()
        p.proc.send_signal(signal.SIGTERM)
        assert p.proc.wait(10) == 0
    finally:
        silent.close()
        for sock in accepted:
            sock.close()


def _wait(predicate: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


def _parse(name: bytes, sql: bytes) -> bytes:
    return _message(b"P", name + b"\0" + sql + b"\0" + struct.pack("!H", 0))


def _bind(statement: bytes) -> bytes:
    return _message(b"B", b"\0" + statement + b"\0" + struct.pack("!HHH", 0, 0, 0))


EXECUTE = _message(b"E", b"\0" + struct.pack("!I", 0))
SYNC = _message(b"S", b"")


def test_a_client_whose_requests_wait_on_the_rewriter_stops_being_read(pooler):
    """A Bind of a statement whose Parse is still in flight behind a slow query waits for
    it; the Syncs the client streams meanwhile are read up to a point, then not at all."""
    p = pooler({"auth_type": "trust", "max_prepared_statements": "100"})
    client = RawClient(p.host, p.port, timeout=10)
    client.login("app", "app")
    client.send(_parse(b"s1", b"SELECT pg_sleep(8)") + _bind(b"s1") + EXECUTE + SYNC
                + _bind(b"s1") + EXECUTE + SYNC)
    sent, _ = _bounded(p, lambda: _flood(client.sock, SYNC * 8192, 2.5, 512 * MiB))
    assert sent < 64 * MiB, f"the pooler read {sent / MiB:.0f} MiB it could not send"
    client.close()
    _quit(p)


@pytest.mark.parametrize("extended", [False, True], ids=["simple", "extended"])
def test_pipelined_queries_never_read_back_leave_everyone_served(pooler, extended):
    """The client pipelines queries and reads nothing: the pooler stops reading it once its
    replies back up, and the canary beside it is answered all along."""
    p = pooler({"auth_type": "trust"})
    client = RawClient(p.host, p.port, timeout=10)
    client.login("app", "app")
    if extended:
        batch = (_parse(b"", b"SELECT 1") + _bind(b"") + EXECUTE + SYNC) * 512
    else:
        batch = m.query("SELECT 1") * 2048
    sent, canary = _bounded(p, lambda: _flood(client.sock, batch, 3.0, 512 * MiB))
    assert sent < 256 * MiB
    # The event loop never stalled for long (it stalled 5-6 s when each ReadyForQuery
    # took the oldest of a million owed requests off a list's front, and 2-4 s while every
    # read of the flood was handled in a row; with a turn after each large read,
    # net/flow_control.py, the canary waits about 0.4 s compiled, 0.7 s as pure Python).
    assert canary.worst < 1.5, f"the canary waited {canary.worst:.1f} s"
    client.close()


def test_a_flood_over_tls_leaves_everyone_served(pooler, certs: Certificates):
    """The same flood over TLS: the pooler is handed it as decrypted pieces, whose size
    uvloop's TLS layer decides, and the canary beside it (in plaintext) is still answered
    all along."""
    p = pooler({"auth_type": "trust", **tls_settings(certs)})
    client = TlsRawClient(p.host, p.port, certs.ca.root)
    client.login("app", "app")
    sent, canary = _bounded(p, lambda: _flood(client.sock, m.query("SELECT 1") * 2048, 3.0,
                                              512 * MiB))
    assert sent < 256 * MiB
    assert canary.worst < 1.5, f"the canary waited {canary.worst:.1f} s"
    client.close()


class _PeakRss:
    """The pooler's largest RSS while the block runs, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_mib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_mib(self.pid))

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def test_a_256_mib_query_streams_through_in_the_default_configuration(pooler):
    """session_state = follow and prepared-statement rewriting (the defaults) classify a
    simple Query on its start: a 256 MiB one streams to its server (as PgBouncer's does)
    instead of being read whole (+260 MB), and its answer is right."""
    p = pooler({"auth_type": "trust"})
    client = RawClient(p.host, p.port, timeout=90)
    client.login("app", "app")
    assert client.simple_query("SELECT 1")[0] == [["1"]]  # a server, warm
    size = 256 * MiB
    before = rss_mib(p.proc.pid)
    with _PeakRss(p.proc.pid) as rss:
        client.send(m.query("SELECT length('" + "x" * size + "')"))
        rows: list[list[str | None]] = []
        for kind, body in client.read_until(m.READY_FOR_QUERY):
            assert kind != m.ERROR_RESPONSE, m.parse_error_fields(body)
            if kind == m.DATA_ROW:
                rows.append(m.parse_data_row(body))
    assert rows == [[str(size)]]
    assert rss.peak - before < 64, f"RSS grew {rss.peak - before:.0f} MiB for the Query"
    assert client.simple_query("SELECT 2")[0] == [["2"]]
    client.close()


@pytest.mark.parametrize("made,seen,left", [
    ("SET myapp.blob = '{value}'", "SELECT length(current_setting('myapp.blob'))",
     "SELECT coalesce(current_setting('myapp.blob', true), '')"),
    ("PREPARE blob AS SELECT length('{value}')", "EXECUTE blob",
     "SELECT count(*) FILTER (WHERE name = 'blob')::text || '' FROM pg_prepared_statements"),
], ids=["set", "prepare"])
def test_a_large_set_or_prepare_pins_its_client_and_never_reaches_another(
        pooler, made, seen, left):
    """A SET or SQL-level PREPARE whose text is longer than the start the pooler reads
    cannot be recorded to replay elsewhere: its client keeps its server (and has what it
    made there), and the next client of that server finds nothing of it
    (docs/session-state.md, docs/prepared-statements.md)."""
    p = pooler({"auth_type": "trust", "default_pool_size": "1"})
    value = "y" * (4 * MiB)
    first = RawClient(p.host, p.port, timeout=30)
    first.login("app", "app")
    pid = first.simple_query("SELECT pg_backend_pid()")[0]
    first.simple_query(made.format(value=value))
    assert first.simple_query(seen)[0] == [[str(len(value))]]
    assert first.simple_query("SELECT pg_backend_pid()")[0] == pid  # pinned to it
    assert "pinned to its server (untracked state)" in p.log()
    first.close()
    second = RawClient(p.host, p.port, timeout=30)
    second.login("app", "app")
    rows = second.simple_query(f"SELECT pg_backend_pid(), ({left})")[0]
    assert rows[0][0] == pid[0][0]  # the same server
    assert rows[0][1] in ("", "0"), "what the first client made reached the second"
    second.close()


def test_large_queries_stream_beside_others_with_pipelining(pooler):
    """pipeline_depth = 4, pool 1: two clients each send a 4 MiB Query (streamed) between
    small ones, taking turns on the one server; every answer is its own and right."""
    p = pooler({"auth_type": "trust", "pipeline_depth": "4", "default_pool_size": "1"})
    clients = [RawClient(p.host, p.port, timeout=60) for _ in range(2)]
    try:
        for client in clients:
            client.login("app", "app")
        for round_ in range(3):
            for n, client in enumerate(clients):
                size = 4 * MiB + n * 1000 + round_
                client.send(m.query(f"SELECT {n}") + m.query("SELECT length('" + "y" * size
                                                             + "')"))
            for n, client in enumerate(clients):
                assert _rows(client) == [[str(n)]]
                assert _rows(client) == [[str(4 * MiB + n * 1000 + round_)]]
    finally:
        for client in clients:
            client.close()


def _rows(client: RawClient) -> list[list[str | None]]:
    """The rows of the next query's answer, up to its ReadyForQuery (no error allowed)."""
    rows: list[list[str | None]] = []
    for kind, body in client.read_until(m.READY_FOR_QUERY):
        assert kind != m.ERROR_RESPONSE, m.parse_error_fields(body)
        if kind == m.DATA_ROW:
            rows.append(m.parse_data_row(body))
    return rows
