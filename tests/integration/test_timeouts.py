"""The pooler's timeouts against a real PostgreSQL: each one fires when it should, says
what COMPAT.md says it says, takes down only what it should, and the pooler keeps serving.

The janitor runs every 0.5 s, so a timeout of 1 s fires between 1 and about 1.6 s.
"""

from __future__ import annotations

import socket
import threading
import time

import psycopg
import pytest

from pypool.embedded import free_port
from tests.conftest import rows_in
from tests.integration.app_client import Login, assert_pooler_error, connect
from tests.integration.polling import settle, wait_for

pytestmark = pytest.mark.timeout(30)







# -- waiting for a server ---------------------------------------------------------------


@pytest.mark.parametrize("limits, text", [
    ({"query_wait_timeout": "1"}, "query_wait_timeout"),
    # As PgBouncer: query_timeout runs from when a query came, queued or not; one refused
    # before it ran is told `query_timeout`.
    ({"query_wait_timeout": "30", "query_timeout": "1"}, "query_timeout"),
], ids=["query_wait_timeout", "query_timeout_counts_the_wait"])
def test_query_wait_timeout(pooler, limits: dict[str, str], text: str) -> None:
    p = pooler(ini_overrides={"default_pool_size": "1", **limits})
    with connect(p.dsn()) as holder, connect(p.dsn()) as waiter:
        holder.execute("BEGIN")
        holder.execute("SELECT 1")
        start = time.monotonic()
        with pytest.raises(psycopg.OperationalError) as info:
            waiter.execute("SELECT 1")
        elapsed = time.monotonic() - start
        assert_pooler_error(info.value, text)
        assert 0.9 <= elapsed <= 3.5, elapsed
        assert waiter.closed
        # The holder never noticed and the pooler keeps serving.
        assert holder.execute("SELECT 2").fetchone()[0] == 2
        holder.execute("COMMIT")
    with connect(p.dsn()) as later:
        assert later.execute("SELECT 3").fetchone()[0] == 3


def test_query_wait_timeout_applies_while_waiting_at_login(postgres, pooler) -> None:
    """A client whose pool cannot get a first server (max_db_connections taken by another
    user's pool) waits at login; query_wait_timeout ends that wait too."""
    p = pooler(ini_overrides={"max_db_connections": "1", "query_wait_timeout": "1"})
    with connect(p.dsn()) as holder:
        holder.execute("BEGIN")
        holder.execute("SELECT 1")
        start = time.monotonic()
        with pytest.raises(psycopg.OperationalError) as info:
            connect(p.dsn(user="pool_admin", password="admin-secret"))
        assert "query_wait_timeout" in str(info.value)
        assert time.monotonic() - start <= 3.5
        holder.execute("COMMIT")


def test_query_timeout(postgres, pooler) -> None:
    p = pooler(ini_overrides={"query_timeout": "1"})
    with connect(p.dsn()) as conn, connect(p.dsn()) as other:
        assert conn.execute("SELECT pg_sleep(0.2), 1").fetchone()[1] == 1  # short: fine
        start = time.monotonic()
        with pytest.raises(psycopg.OperationalError) as info:
            conn.execute("SELECT pg_sleep(5)")
        elapsed = time.monotonic() - start
        assert_pooler_error(info.value, "query timeout")
        assert 0.9 <= elapsed <= 3.5, elapsed
        assert conn.closed
        assert other.execute("SELECT 4").fetchone()[0] == 4


def test_query_timeout_leaves_idle_clients_alone(postgres, pooler) -> None:
    """PgBouncer 1.26: query_timeout ends queries, not clients that run none (idle, or idle
    in a transaction: that is idle_transaction_timeout's business)."""
    p = pooler(ini_overrides={"query_timeout": "1"})
    with connect(p.dsn()) as idle, connect(p.dsn()) as in_transaction:
        assert idle.execute("SELECT 1").fetchone() == (1,)
        in_transaction.execute("BEGIN")
        in_transaction.execute("SELECT 1")
        time.sleep(2.5)  # two janitor sweeps past query_timeout
        assert idle.execute("SELECT 2").fetchone() == (2,)
        assert in_transaction.execute("SELECT 3").fetchone() == (3,)
        in_transaction.execute("COMMIT")


def test_idle_transaction_timeout(postgres, pooler, app_table) -> None:
    p = pooler(ini_overrides={"idle_transaction_timeout": "1"})
    with connect(p.dsn()) as conn:
        conn.execute("BEGIN")
        conn.execute(f"INSERT INTO {app_table} VALUES (1)")
        time.sleep(1.8)
        with pytest.raises(psycopg.OperationalError) as info:
            conn.execute("SELECT 1")
        assert_pooler_error(info.value, "idle transaction timeout")
    assert rows_in(postgres, app_table) == 0
    with connect(p.dsn()) as conn:
        assert conn.execute(f"SELECT count(*) FROM {app_table}").fetchone()[0] == 0
        assert conn.execute("SELECT pg_current_xact_id_if_assigned()").fetchone()[0] is None


def test_idle_transaction_timeout_spares_busy_transactions(postgres, pooler, app_table) -> None:
    p = pooler(ini_overrides={"idle_transaction_timeout": "1"})
    with connect(p.dsn()) as conn:
        conn.execute("BEGIN")
        conn.execute(f"INSERT INTO {app_table} VALUES (1)")
        conn.execute("SELECT pg_sleep(1.6)")  # running, not idle
        for _ in range(4):
            time.sleep(0.4)
            conn.execute("SELECT 1")
        conn.execute("COMMIT")
    assert rows_in(postgres, app_table) == 1


def test_client_idle_timeout(pooler) -> None:
    p = pooler(ini_overrides={"client_idle_timeout": "1"})
    with connect(p.dsn()) as idle, connect(p.dsn()) as busy, connect(p.dsn()) as in_tx:
        in_tx.execute("BEGIN")
        in_tx.execute("SELECT 1")
        for _ in range(6):
            time.sleep(0.35)
            busy.execute("SELECT 1")
        with pytest.raises(psycopg.OperationalError) as info:
            idle.execute("SELECT 1")
        assert_pooler_error(info.value, "client_idle_timeout")
        assert busy.execute("SELECT 5").fetchone()[0] == 5
        # A client inside a transaction is not idle in PgBouncer's sense.
        assert in_tx.execute("SELECT 6").fetchone()[0] == 6
        in_tx.execute("COMMIT")


def test_client_login_timeout(pooler) -> None:
    p = pooler(ini_overrides={"client_login_timeout": "1"})
    silent = socket.create_connection((p.host, p.port), timeout=5)
    # This one starts a SCRAM login and never answers the challenge.
    stalled = socket.create_connection((p.host, p.port), timeout=5)
    stalled.sendall(_startup_packet({"user": "app", "database": "app"}))
    try:
        start = time.monotonic()
        for sock in (silent, stalled):
            while sock.recv(4096):  # whatever comes, then EOF
                pass
        assert time.monotonic() - start <= 3.0
    finally:
        silent.close()
        stalled.close()
    with connect(p.dsn()) as conn:
        assert conn.execute("SELECT 1").fetchone()[0] == 1


def _startup_packet(params: dict[str, str]) -> bytes:
    body = (196608).to_bytes(4, "big")
    for key, value in params.items():
        body += key.encode() + b"\x00" + value.encode() + b"\x00"
    body += b"\x00"
    return (len(body) + 4).to_bytes(4, "big") + body


# -- servers ------------------------------------------------------------------------------


def _open_servers(dsn: str, n: int) -> set[int]:
    conns = [connect(dsn) for _ in range(n)]
    try:
        pids = set()
        for conn in conns:
            conn.execute("BEGIN")
            pids.add(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        for conn in conns:
            conn.execute("COMMIT")
        return pids
    finally:
        for conn in conns:
            conn.close()


def test_server_idle_timeout_closes_idle_servers(postgres, pooler, pg_activity) -> None:
    settle(postgres, pg_activity)
    p = pooler(ini_overrides={"server_idle_timeout": "1"})
    assert len(_open_servers(p.dsn(), 3)) == 3
    assert pg_activity(postgres) == 3
    time.sleep(0.2)
    assert pg_activity(postgres) == 3  # not yet
    assert wait_for(lambda: pg_activity(postgres) == 0, 3), pg_activity(postgres)
    with connect(p.dsn()) as conn:
        assert conn.execute("SELECT 1").fetchone()[0] == 1


def test_server_lifetime_replaces_old_servers(postgres, pooler, pg_activity) -> None:
    settle(postgres, pg_activity)
    p = pooler(ini_overrides={"server_lifetime": "1"})
    with connect(p.dsn()) as conn:
        first = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        pids = {first}
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline and len(pids) < 2:
            time.sleep(0.2)
            pids.add(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        assert len(pids) >= 2, "server_lifetime never replaced the server"
    # The replaced server is really gone, not just set aside.
    assert wait_for(lambda: postgres.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", params=(first,)
    ) == [(0,)], 3)
    assert wait_for(lambda: pg_activity(postgres) <= 1, 3)


def test_server_lifetime_never_cuts_a_transaction(postgres, pooler) -> None:
    p = pooler(ini_overrides={"server_lifetime": "1"})
    with connect(p.dsn()) as conn:
        conn.execute("BEGIN")
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        for _ in range(5):
            time.sleep(0.4)
            assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
        conn.execute("COMMIT")


# -- servers that cannot be reached -----------------------------------------------------


class SilentServer:
    """Accepts TCP connections (the kernel does, from the backlog) and never says a word."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]

    def close(self) -> None:
        self.sock.close()


class Forwarder:
    """A TCP forwarder to PostgreSQL on a fixed port, started and stopped at will."""

    def __init__(self, target_port: int, port: int) -> None:
        self.target_port = target_port
        self.port = port
        self.sock: socket.socket | None = None
        self._conns: list[socket.socket] = []

    def start(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(16)
        self.sock = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                client, _ = sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        for conn in self._conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        self._conns.clear()


def test_server_connect_timeout(postgres, pooler) -> None:
    """A server that never answers: its connect times out after server_connect_timeout;
    the client queued for it waits on (its query_timeout refuses it, as PgBouncer's), a new
    one gets the cached error at once."""
    silent = SilentServer()
    server = f"host={postgres.host} port={postgres.port}"
    try:
        p = pooler(
            ini_overrides={"server_connect_timeout": "1", "server_login_retry": "5",
                           "query_timeout": "3"},
            databases={"app": f"{server} dbname=app",
                       "hang": f"host=127.0.0.1 port={silent.port} dbname=app"},
        )
        first = Login(p.dsn("hang"))
        assert wait_for(lambda: "server connect timeout" in p.log(), 3), p.log()
        start = time.monotonic()
        with pytest.raises(psycopg.OperationalError) as second:
            connect(p.dsn("hang"))
        assert time.monotonic() - start <= 2.0
        assert "server login has been failing, cached error: " in str(second.value)
        assert "timeout" in str(second.value)
        assert "(server_login_retry)" in str(second.value)
        first.join(5)
        assert not first.is_alive()
        assert "query_timeout" in str(first.error), first.error
        assert 2.5 <= first.elapsed <= 4.5, first.elapsed
        # Other databases never noticed.
        with connect(p.dsn("app")) as conn:
            assert conn.execute("SELECT 1").fetchone()[0] == 1
        assert p.proc.poll() is None
    finally:
        silent.close()


def test_server_login_retry_then_recovery(postgres, pooler) -> None:
    """PostgreSQL unreachable when a client comes, back a moment later: the queued client is
    served by the retry after server_login_retry (PgBouncer's behaviour), not failed; a
    client that comes meanwhile gets the cached error; afterwards logins work again."""
    forwarder = Forwarder(postgres.port, free_port())
    try:
        p = pooler(
            ini_overrides={"server_login_retry": "2", "query_wait_timeout": "10"},
            databases={"fwd": f"host=127.0.0.1 port={forwarder.port} dbname=app"},
        )
        first = Login(p.dsn("fwd"), "SELECT current_database()")
        assert wait_for(lambda: "server login failed" in p.log(), 3), p.log()
        with pytest.raises(psycopg.OperationalError) as second:
            connect(p.dsn("fwd"))
        assert "server login has been failing, cached error: " in str(second.value)
        assert "(server_login_retry)" in str(second.value)
        forwarder.start()  # the server comes back
        first.join(8)
        assert not first.is_alive()
        assert first.result == ("app",), first.error
        assert 1.5 <= first.elapsed <= 6, first.elapsed
        with connect(p.dsn("fwd")) as conn:  # the cached error went with the success
            assert conn.execute("SELECT current_database()").fetchone()[0] == "app"
        assert p.proc.poll() is None
    finally:
        forwarder.stop()


def test_pool_idle_timeout_forgets_an_unused_pool(postgres, pooler) -> None:
    """PgBouncer 1.26: no client and no server for pool_idle_timeout, and the pool goes
    from SHOW POOLS; the next client of that database and user makes it anew."""
    from tests.admin.console_client import console, show

    p = pooler(ini_overrides={"pool_idle_timeout": "1", "server_idle_timeout": "1"})

    def pools() -> set[tuple[str, str]]:
        with console(p) as admin:
            return {(r["database"], r["user"]) for r in show(admin, "POOLS")}

    with connect(p.dsn()) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert ("app", "app") in pools()
    assert wait_for(lambda: ("app", "app") not in pools(), 10)
    assert "cleaning up idle pool for user app on db app because: pool idle timeout" in p.log()
    with connect(p.dsn()) as conn:
        assert conn.execute("SELECT 2").fetchone() == (2,)
    assert ("app", "app") in pools()
