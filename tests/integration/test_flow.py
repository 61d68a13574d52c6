"""Flow control: what the pooler buffers for a client it cannot serve yet is bounded.

A client waiting for a server has what it sends kept in its outbox; once more than
OUTBOX_HIGH_WATER (1 MiB) waits there the pooler stops reading that client, so the kernel's
socket buffers fill and the client's sends block, instead of the pooler's memory growing
with whatever the client writes.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from pypool.embedded import EmbeddedPostgres
from pypool.protocol import messages as m
from tests.conftest import rss_mib, server_connections
from tests.integration.rawclient import RawClient

pytestmark = pytest.mark.timeout(90)

MIB = 1 << 20
FLOOD_SECONDS = 1.5
# The pooler's outbox (1 MiB) plus what the kernel holds on loopback: the client's send
# buffer (tcp_wmem max 4 MiB) and the pooler's receive buffer, which autotuning grows
# only while the pooler reads. Measured with the pause: ~6 MiB accepted. A pooler that
# never pauses reads all it is sent: ~700 MiB in 1.5 s on loopback.
ACCEPTED_BOUND = 16 * MIB


def _flood(sock: socket.socket, message: bytes, seconds: float) -> tuple[int, bytes]:
    """Write `message` over and over for `seconds` without reading. Returns the bytes the
    kernel accepted and the rest of the message last cut short (to send once the pooler
    reads again, so the stream ends on a message boundary)."""
    sock.setblocking(False)
    chunk = message * 512
    sent_bytes = 0
    deadline = time.monotonic() + seconds
    pending = b""
    while time.monotonic() < deadline:
        if not pending:
            pending = chunk
        try:
            n = sock.send(pending)
        except BlockingIOError:
            time.sleep(0.005)
            continue
        sent_bytes += n
        pending = pending[n:]
    sock.setblocking(True)
    sock.settimeout(30)
    partial = sent_bytes % len(message)
    return sent_bytes, message[partial:] if partial else b""


def test_waiting_client_outbox_is_bounded(pooler) -> None:
    """With the only server held in a transaction, a client that writes queries without
    reading gets its writes refused by the kernel after a few MiB: the pooler stops
    reading it past its 1 MiB outbox. Once the server comes free every query it did send
    is answered, in order, with no error."""
    p = pooler({"auth_type": "trust", "default_pool_size": "1", "query_wait_timeout": "60"})
    with psycopg.connect(p.dsn()) as holder:
        holder.execute("SELECT 1")  # BEGIN (psycopg's default) holds the only server
        with RawClient(p.host, p.port, timeout=30) as client:
            login = client.login("app", "app")
            assert login.error is None
            # small queries, padded so that a few MiB are thousands of them, not millions
            query = m.query("SELECT 1 -- " + "x" * 500)
            accepted, tail = _flood(client.sock, query, FLOOD_SECONDS)
            queries = (accepted + len(tail)) // len(query)
            assert accepted < ACCEPTED_BOUND, (
                f"the kernel accepted {accepted / MIB:.1f} MiB from a waiting client"
            )
            assert accepted > MIB, "the pooler should take at least its outbox's worth"
            holder.commit()
            # the rest of the last query, sent while this thread reads the replies
            finisher = threading.Thread(target=client.sock.sendall, args=(tail,))
            finisher.start()
            ready = 0
            while ready < queries:
                msg = client.read_message()
                assert msg is not None, f"closed after {ready} of {queries} replies"
                kind, body = msg
                assert kind != m.ERROR_RESPONSE, m.parse_error_fields(body)
                if kind == m.DATA_ROW:
                    assert m.parse_data_row(body) == ["1"]
                elif kind == m.READY_FOR_QUERY:
                    ready += 1
            finisher.join(30)
            assert not finisher.is_alive()
            client.sock.settimeout(0.5)
            with pytest.raises(socket.timeout):
                client.read_message()  # nothing more than one reply per query


SMALL_ROW = 7000  # one reply (T, D, C, Z) under PostgreSQL's 8 KiB send buffer: one send
SMALL_QUERIES = 1500  # ~10 MB: more than the kernel holds between pooler and client
BIG_ROWS, BIG_ROW = 200_000, 1000  # ~200 MB


def test_back_pressure_carries_to_the_next_link(pooler) -> None:
    """A client that does not read gets small replies, each its own transaction, until
    the pooler's write buffer for it is above its high-water mark. The transport says so
    once (pause_writing) and not again, so the servers its later transactions are linked
    to must start with their reading paused (carry_back_pressure): then a ~200 MB result
    for that client waits in PostgreSQL, not in the pooler's memory. Without the carry the
    pooler reads the whole result into the client's write buffer (RSS grows ~200 MB)."""
    p = pooler({"auth_type": "trust", "default_pool_size": "2"})
    with RawClient(p.host, p.port, timeout=30) as client:
        sock = client.sock
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        assert client.login("app", "app").error is None
        small = m.query(f"SELECT repeat('x', {SMALL_ROW})")
        for _ in range(SMALL_QUERIES):
            client.send(small)
            time.sleep(0.002)  # its reply arrives and the transaction ends before the next
        time.sleep(0.5)
        before = rss_mib(p.proc.pid)
        client.query(f"SELECT repeat('x', {BIG_ROW}) FROM generate_series(1, {BIG_ROWS})")
        time.sleep(3)  # read nothing while PostgreSQL produces the whole result
        grown = rss_mib(p.proc.pid) - before
        assert grown < 40, f"pooler RSS grew {grown:.0f} MiB while the client did not read"
        # The replies held back are still there, in order (the first few are read; reading
        # all ~210 MB through a 4 KiB receive buffer is slow when transactions pipelined).
        smalls = 0
        while smalls < 10:
            kind, body = client.read_message() or (0, b"")
            assert kind not in (0, m.ERROR_RESPONSE), (kind, body[:200])
            if kind == m.DATA_ROW:
                assert len(body) == 2 + 4 + SMALL_ROW
            elif kind == m.READY_FOR_QUERY:
                smalls += 1


class ScriptedProxy:
    """A TCP proxy in front of PostgreSQL whose next connections follow `script`: "slow"
    forwards after `delay` seconds, "refuse" answers the startup packet with a FATAL
    ErrorResponse (as PostgreSQL at max_connections), anything else forwards at once."""

    def __init__(self, upstream: tuple[str, int], delay: float) -> None:
        self.upstream, self.delay = upstream, delay
        self.script: list[str] = []
        self.accepted: list[str] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            action = self.script.pop(0) if self.script else "pass"
            self.accepted.append(action)
            threading.Thread(target=self._serve, args=(conn, action), daemon=True).start()

    def _serve(self, conn: socket.socket, action: str) -> None:
        try:
            if action == "refuse":
                length = struct.unpack("!I", _recv_exactly(conn, 4))[0]
                _recv_exactly(conn, length - 4)
                conn.sendall(m.error_response("sorry, too many clients already", "53300",
                                              "FATAL"))
                conn.close()
                return
            if action == "slow":
                time.sleep(self.delay)
            up = socket.create_connection(self.upstream)
        except OSError:
            conn.close()
            return
        threading.Thread(target=_pipe, args=(up, conn), daemon=True).start()
        _pipe(conn, up)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("closed")
        data += chunk
    return data


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture
def proxy(postgres: EmbeddedPostgres) -> Iterator[ScriptedProxy]:
    px = ScriptedProxy((postgres.host, postgres.port), delay=2.0)
    yield px
    px.close()


def _drop_app_servers(postgres: EmbeddedPostgres) -> None:
    postgres.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'app'"
        " AND usename = 'app' AND pid <> pg_backend_pid()"
    )
    deadline = time.monotonic() + 10
    while server_connections(postgres) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server_connections(postgres) == 0


@pytest.mark.timeout(60)
def test_failed_login_beside_a_working_one_fails_no_client(postgres, pooler, proxy) -> None:
    """The pool has no server. Client B's query starts a login that takes 2 s; client C's
    starts a second one, which PostgreSQL refuses (53300). With B's login still in flight
    the failure must neither drop C (waiting) nor refuse D, which logs in and queries
    after it ("server login has been failing" is for a pool with nothing left to serve
    it): once B's login succeeds that one server serves B, C and D in turn."""
    p = pooler(
        {"auth_type": "trust", "default_pool_size": "2", "query_wait_timeout": "30"},
        databases={"app": f"host=127.0.0.1 port={proxy.port} dbname=app"},
    )
    # A first login through the proxy, so the pool knows the server's parameters and
    # clients log in without a server; then its server goes.
    with RawClient(p.host, p.port) as warm:
        assert warm.login("app", "app").error is None
        assert warm.simple_query("SELECT 1")[0] == [["1"]]
    _drop_app_servers(postgres)
    time.sleep(0.3)  # the pooler sees its idle server close
    proxy.script[:] = ["slow", "refuse"]
    clients = [RawClient(p.host, p.port, timeout=20) for _ in range(3)]
    try:
        b, c, d = clients
        assert b.login("app", "app").error is None
        assert c.login("app", "app").error is None
        b.query("SELECT 'b'")
        time.sleep(0.3)  # B's login is under way (slow)
        c.query("SELECT 'c'")
        time.sleep(0.5)  # C's login has been refused
        assert proxy.accepted[-2:] == ["slow", "refuse"], proxy.accepted
        assert "too many clients already" in p.log()  # the pooler saw that login fail
        login = d.login("app", "app")
        assert login.error is None, login.error
        d.query("SELECT 'd'")
        for name, client in zip("bcd", clients, strict=True):
            rows: list[list[str | None]] = []
            for kind, body in client.read_until(m.READY_FOR_QUERY):
                assert kind != m.ERROR_RESPONSE, (name, m.parse_error_fields(body))
                if kind == m.DATA_ROW:
                    rows.append(m.parse_data_row(body))
            assert rows == [[name]]
    finally:
        for client in clients:
            client.close()
    assert proxy.accepted[-2:] == ["slow", "refuse"]  # no other login was tried
