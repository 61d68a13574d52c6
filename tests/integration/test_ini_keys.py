"""Keys that were parsed but idle until they were made to work: server_check_query and
server_check_delay, server_reset_query_always, connect_query ([databases]),
application_name_add_host and shutdown_timeout, each against a real PostgreSQL, with a
counter-check that shows the key is what made the difference.

A server that died while idle in the pool is noticed at once when PostgreSQL closes the
socket (pg_terminate_backend): the pooler reads idle servers. The case server_check_query
is for is a connection that is gone without the pooler being told (a firewall dropped it, a
host went away): `CuttableProxy` below makes one, between the pooler and PostgreSQL, by
ending the PostgreSQL side and closing the pooler's side only once the pooler writes to it.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pypool.embedded import EmbeddedPostgres
from tests.integration.app_client import connect
from tests.integration.polling import settle, wait_for

pytestmark = pytest.mark.timeout(40)




def backend_pids(postgres: EmbeddedPostgres, dbname: str = "app") -> set[int]:
    rows = postgres.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND usename = 'app'"
        " AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
        params=(dbname,),
    )
    return {int(r[0]) for r in rows or []}


def databases_via(host: str, port: int, **extra: str) -> dict[str, str]:
    """The [databases] section with one entry, `app`, at host:port (plus `extra` keys)."""
    tail = "".join(f" {key}={value}" for key, value in extra.items())
    return {"app": f"host={host} port={port} dbname=app{tail}"}


def local_port(conn: psycopg.Connection[Any]) -> int:
    """The client's own port of its connection to the pooler."""
    sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
    try:
        return int(sock.getsockname()[1])
    finally:
        sock.close()


def answer_within(p: Any, sql: str, seconds: float) -> tuple[bool, object]:
    """Run `sql` on a new client of pooler `p` for at most `seconds`: (answered, the first
    row's first value or the exception). Unanswered, the pooler is stopped (SIGQUIT) to
    free the client."""
    outcome: list[object] = []
    conn = connect(p.dsn())

    def query() -> None:
        try:
            outcome.append(conn.execute(sql).fetchone()[0])
        except psycopg.Error as exc:
            outcome.append(exc)

    worker = threading.Thread(target=query, daemon=True)
    worker.start()
    worker.join(seconds)
    answered = not worker.is_alive()
    if not answered:
        p.proc.send_signal(signal.SIGQUIT)
        p.proc.wait(10)
        worker.join(5)
    conn.close()
    return answered, outcome[0] if outcome else None


# -- a connection that dies without the pooler being told -------------------------------------


class CuttableProxy:
    """A TCP relay pooler -> PostgreSQL. `cut()` ends every relayed connection's PostgreSQL
    side (its backend exits) but keeps the pooler's side open and silent, as a connection
    dropped on the way; the pooler's side is closed when the pooler next writes to it, as a
    write into a dead connection fails. Connections made after cut() relay normally."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._cut: set[socket.socket] = set()  # pooler sides whose PostgreSQL side is gone
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def cut(self) -> None:
        with self._lock:
            for front, back in self._pairs:
                back.close()
                self._cut.add(front)
            self._pairs = [(f, b) for f, b in self._pairs if f not in self._cut]

    def close(self) -> None:
        self._stop = True
        self._thread.join(5)
        with self._lock:
            for front, back in self._pairs:
                front.close()
                back.close()
            for front in self._cut:
                front.close()
        self.listener.close()

    def _run(self) -> None:
        while not self._stop:
            with self._lock:
                pairs = list(self._pairs)
                cut = list(self._cut)
            watched = [self.listener, *cut]
            for front, back in pairs:
                watched += [front, back]
            ready, _, _ = select.select(watched, [], [], 0.05)
            for sock in ready:
                if sock is self.listener:
                    front, _ = self.listener.accept()
                    back = socket.create_connection(self.target)
                    with self._lock:
                        self._pairs.append((front, back))
                    continue
                with self._lock:
                    if sock in self._cut:  # the pooler wrote into the dead connection
                        self._cut.discard(sock)
                        sock.close()
                        continue
                    pair = next((p for p in self._pairs if sock in p), None)
                if pair is None:
                    continue
                other = pair[1] if sock is pair[0] else pair[0]
                try:
                    data = sock.recv(65536)
                    if data:
                        other.sendall(data)
                except OSError:
                    data = b""
                if not data:
                    with self._lock:
                        if pair in self._pairs:
                            self._pairs.remove(pair)
                    pair[0].close()
                    pair[1].close()


@pytest.fixture
def proxy(postgres: EmbeddedPostgres) -> Iterator[CuttableProxy]:
    relay = CuttableProxy((postgres.host, postgres.port))
    yield relay
    relay.close()


# -- server_check_query / server_check_delay ----------------------------------------------------


@pytest.mark.parametrize("check_query", [None, "select 1"], ids=["default-empty", "select"])
def test_check_query_replaces_a_silently_dead_server(
        postgres, pooler, proxy, pg_activity, check_query) -> None:
    """The default (`<empty>`, an empty query) and a query of one's own alike."""
    settle(postgres, pg_activity)
    p = pooler(
        ini_overrides={"server_check_delay": "1", "default_pool_size": "1",
                       "server_check_query": check_query},
        databases=databases_via("127.0.0.1", proxy.port),
    )
    with connect(p.dsn()) as conn:
        first = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        proxy.cut()
        assert wait_for(lambda: first not in backend_pids(postgres), 5), "backend still there"
        time.sleep(1.3)  # idle for longer than server_check_delay
        second = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        assert second != first
        assert backend_pids(postgres) == {second}
    assert "server_check_query failed" in p.log(), p.log()


def test_without_check_query_the_dead_server_fails_the_client(
    postgres, pooler, proxy, pg_activity
) -> None:
    """The counter-check: `server_check_query =` (empty) turns the check off."""
    settle(postgres, pg_activity)
    p = pooler(
        ini_overrides={
            "server_check_delay": "1",
            "server_check_query": "",
            "default_pool_size": "1",
        },
        databases=databases_via("127.0.0.1", proxy.port),
    )
    assert "server_check_query = \n" in p.ini_path.read_text()
    with connect(p.dsn()) as conn:
        first = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        proxy.cut()
        assert wait_for(lambda: first not in backend_pids(postgres), 5), "backend still there"
        time.sleep(1.3)
        with pytest.raises(psycopg.OperationalError) as info:
            conn.execute("SELECT pg_backend_pid()")
        assert "server conn crashed?" in str(info.value), str(info.value)
    with connect(p.dsn()) as later:  # and the pool carries on with a new server
        assert later.execute("SELECT 1").fetchone()[0] == 1


def test_check_delay_not_reached_means_no_check(postgres, pooler, proxy, pg_activity) -> None:
    """Used again within server_check_delay: not checked, so the dead server fails the
    client (PgBouncer's trade-off: the delay is how long a server is trusted)."""
    settle(postgres, pg_activity)
    p = pooler(
        ini_overrides={"server_check_delay": "30", "default_pool_size": "1"},
        databases=databases_via("127.0.0.1", proxy.port),
    )
    with connect(p.dsn()) as conn:
        first = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        proxy.cut()
        assert wait_for(lambda: first not in backend_pids(postgres), 5), "backend still there"
        with pytest.raises(psycopg.OperationalError) as info:
            conn.execute("SELECT 1")
        assert "server conn crashed?" in str(info.value), str(info.value)


@pytest.mark.parametrize("check_query", ["select 1", ""], ids=["check", "no-check"])
def test_server_terminated_while_idle_is_noticed_without_a_check(
    postgres, pooler, pg_activity, check_query
) -> None:
    """pg_terminate_backend on an idle pooled server: PostgreSQL closes the socket, the
    pooler (which reads idle servers) drops the server at once, and the client's next query
    goes to a new one, with or without server_check_query."""
    settle(postgres, pg_activity)
    p = pooler(
        ini_overrides={
            "server_check_delay": "1",
            "server_check_query": check_query,
            "default_pool_size": "1",
        }
    )
    with connect(p.dsn()) as conn:
        first = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        postgres.execute("SELECT pg_terminate_backend(%s)", params=(first,))
        assert wait_for(lambda: first not in backend_pids(postgres), 5), "backend still there"
        time.sleep(1.3)
        second = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        assert second != first
        assert backend_pids(postgres) == {second}
    assert "server_check_query failed" not in p.log(), p.log()


def test_check_query_failing_on_one_server_replaces_it(postgres, pooler, pg_activity) -> None:
    """A check query that fails on one server only (a session setting a client left behind:
    transaction mode resets nothing): that server is closed, the client gets a new one, and
    none of its requests ran on the bad one. (Not `case ... then 1/0`: PostgreSQL folds
    the constant 1/0 while planning, in every branch.)"""
    settle(postgres, pg_activity)
    p = pooler(
        ini_overrides={
            "server_check_delay": "0",
            "server_check_query": (
                "select 1 / (case when current_setting('pypool.bad', true) = 'yes'"
                " then 0 else 1 end)"
            ),
            "default_pool_size": "1",
        }
    )
    with connect(p.dsn()) as spoiler, connect(p.dsn()) as other:
        first = spoiler.execute("SELECT pg_backend_pid()").fetchone()[0]
        spoiler.execute("SET pypool.bad = 'yes'")  # this server's next check fails
        row = other.execute(
            "SELECT pg_backend_pid(), current_setting('pypool.bad', true)"
        ).fetchone()
        assert row[0] != first
        assert row[1] in (None, "")
        assert backend_pids(postgres) == {row[0]}
    log = p.log()
    assert "server_check_query failed" in log, log
    assert "division by zero" in log, log


@pytest.mark.timeout(30)
def test_check_query_failing_everywhere_replaces_each_used_server(
        postgres, pooler, pg_activity) -> None:
    """A check query that fails on every server, with server_check_delay = 0: each used
    server the client is given is closed, and a fresh one, which is not checked (as in
    PgBouncer), serves it. The client never waits forever nor loops through servers."""
    settle(postgres, pg_activity)
    p = pooler(
        ini_overrides={
            "server_check_delay": "0",
            "server_check_query": "select 1/0",
            "default_pool_size": "1",
            "query_wait_timeout": "3",
        }
    )
    for _ in range(2):
        answered, outcome = answer_within(p, "SELECT 1", 8)
        assert answered, "no answer after 8 s"
        assert outcome == 1, outcome
    assert p.log().count("server_check_query failed") >= 1, p.log()


# -- server_reset_query_always ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("always", "seen"), [("1", "0"), ("0", "12345ms")], ids=["always", "default"]
)
def test_server_reset_query_always(postgres, pooler, pg_activity, always, seen) -> None:
    """statement_timeout is not a reported parameter: with session_state = ignore (PgBouncer's
    behaviour) A's SET stays on the server for B, unless server_reset_query_always runs
    DISCARD ALL after every transaction (the default, follow: tests/integration/
    test_session_state.py)."""
    settle(postgres, pg_activity)
    p = pooler(ini_overrides={"server_reset_query_always": always, "default_pool_size": "1",
                              "session_state": "ignore"})
    with connect(p.dsn()) as a, connect(p.dsn()) as b:
        a.execute("SET statement_timeout = 12345")
        pid_a = a.execute("SELECT pg_backend_pid()").fetchone()[0]
        row = b.execute("SELECT pg_backend_pid(), current_setting('statement_timeout')")
        pid_b, timeout = row.fetchone()
        assert pid_b == pid_a  # the same server: the pool has one
        assert timeout == seen
        assert b.execute("SHOW statement_timeout").fetchone()[0] == seen


# -- connect_query ----------------------------------------------------------------------------


def test_connect_query_runs_on_each_new_server(postgres, pooler, pg_activity) -> None:
    settle(postgres, pg_activity)
    p = pooler(
        databases=databases_via(
            postgres.host, postgres.port, connect_query="'SET statement_timeout = 4321'"
        ),
        ini_overrides={"default_pool_size": "2"},
    )
    assert "connect_query='SET statement_timeout = 4321'" in p.ini_path.read_text()
    with connect(p.dsn()) as a, connect(p.dsn()) as b:
        a.execute("BEGIN")  # holds the first server, so b gets a second, fresh one
        assert a.execute("SHOW statement_timeout").fetchone()[0] == "4321ms"
        b.execute("BEGIN")
        assert b.execute("SHOW statement_timeout").fetchone()[0] == "4321ms"
        pids = {
            a.execute("SELECT pg_backend_pid()").fetchone()[0],
            b.execute("SELECT pg_backend_pid()").fetchone()[0],
        }
        a.execute("COMMIT")
        b.execute("COMMIT")
    assert len(pids) == 2
    assert "pooler-issued query failed" not in p.log(), p.log()


@pytest.mark.parametrize(
    "app_name",
    [
        pytest.param(None, id="same-params"),
        pytest.param("other_app", id="needs-set"),
    ],
)
def test_failing_connect_query_does_not_break_the_pool(
    postgres, pooler, pg_activity, app_name
) -> None:
    """connect_query = 'select 1/0': the failure is logged and clients are still served on
    that server, also a first client whose parameters need a SET at link time."""
    settle(postgres, pg_activity)
    p = pooler(
        databases=databases_via(postgres.host, postgres.port, connect_query="'select 1/0'"),
        ini_overrides={"default_pool_size": "1"},
    )
    with connect(p.dsn()) as first:
        pid = first.execute("SELECT pg_backend_pid()").fetchone()[0]
    # The next client's query then waits for a new server and is linked to it as it logs
    # in, right behind its connect_query (no race with connect_query's reply).
    postgres.execute("SELECT pg_terminate_backend(%s)", params=(pid,))
    assert wait_for(lambda: not backend_pids(postgres), 5)
    time.sleep(0.3)  # the pooler has seen it go
    kwargs = {"application_name": app_name} if app_name else {}
    with connect(p.dsn(), **kwargs) as conn:
        assert conn.execute("SELECT 41 + 1").fetchone()[0] == 42
        assert conn.execute("SELECT current_setting('application_name')").fetchone()[0] == (
            app_name or ""
        )
    with connect(p.dsn()) as again:
        assert again.execute("SELECT 7").fetchone()[0] == 7
    log = p.log()
    assert "pooler-issued query failed: 22012 division by zero" in log, log


def test_connect_query_and_a_link_time_set(postgres, pooler, pg_activity) -> None:
    """A first client whose parameters need a SET on the fresh server: both the
    connect_query's setting and the client's own are in force for its query."""
    settle(postgres, pg_activity)
    p = pooler(
        databases=databases_via(
            postgres.host, postgres.port, connect_query="'SET statement_timeout = 4321'"
        ),
        ini_overrides={"default_pool_size": "1"},
    )
    with connect(p.dsn(), application_name="other_app") as conn:
        row = conn.execute(
            "SELECT current_setting('statement_timeout'), current_setting('application_name')"
        ).fetchone()
        assert row == ("4321ms", "other_app")
        assert conn.info.parameter_status("application_name") == "other_app"


def test_failing_connect_query_with_check_delay_zero(postgres, pooler, pg_activity) -> None:
    """A failing connect_query and server_check_delay = 0 (the check query is the default,
    `select 1`, which cannot fail): a client waiting for a new server is still served."""
    settle(postgres, pg_activity)
    p = pooler(
        databases=databases_via(postgres.host, postgres.port, connect_query="'select 1/0'"),
        ini_overrides={"default_pool_size": "1", "server_check_delay": "0"},
    )
    # The first client's query may already meet the race: it can reach the new server
    # before connect_query's reply has.
    answered, pid = answer_within(p, "SELECT pg_backend_pid()", 6)
    failures = p.log().count("server_check_query failed")
    assert answered, f"first query: no answer after 6 s; {failures} servers failed the check"
    assert isinstance(pid, int), pid
    # A client that asks while no server is left waits for the next login, and is linked
    # to the new server as it logs in, right behind its connect_query.
    postgres.execute("SELECT pg_terminate_backend(%s)", params=(pid,))
    assert wait_for(lambda: not backend_pids(postgres), 5)
    time.sleep(0.3)  # the pooler has seen it go
    answered, outcome = answer_within(p, "SELECT 42", 6)
    failures = p.log().count("server_check_query failed")
    assert answered, f"no answer after 6 s; {failures} servers failed the check"
    assert outcome == 42, outcome


# -- application_name_add_host ----------------------------------------------------------------


@pytest.mark.parametrize("app_name", ["myapp", None], ids=["named", "unnamed"])
def test_application_name_add_host(postgres, pooler, pg_activity, app_name) -> None:
    settle(postgres, pg_activity)
    p = pooler(ini_overrides={"application_name_add_host": "1", "default_pool_size": "1"})
    kwargs = {"application_name": app_name} if app_name else {}
    with connect(p.dsn(), **kwargs) as conn:
        expected = f"{app_name or 'app'} - 127.0.0.1:{local_port(conn)}"
        assert conn.execute("SHOW application_name").fetchone()[0] == expected
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        rows = postgres.execute(
            "SELECT application_name FROM pg_stat_activity WHERE pid = %s", params=(pid,)
        )
        assert rows == [(expected,)]
        assert conn.info.parameter_status("application_name") == expected


def test_application_name_without_add_host(postgres, pooler, pg_activity) -> None:
    """The counter-check: off (the default), the name is the client's, unchanged."""
    settle(postgres, pg_activity)
    p = pooler(ini_overrides={"default_pool_size": "1"})
    with connect(p.dsn(), application_name="myapp") as conn:
        assert conn.execute("SHOW application_name").fetchone()[0] == "myapp"


# -- shutdown_timeout -------------------------------------------------------------------------


def test_shutdown_timeout_ends_a_drain_held_up_by_an_idle_client(pooler) -> None:
    p = pooler(ini_overrides={"shutdown_timeout": "1"})
    with connect(p.dsn()) as idle:
        assert idle.execute("SELECT 1").fetchone()[0] == 1
        start = time.monotonic()
        p.proc.send_signal(signal.SIGTERM)
        try:
            p.proc.wait(5)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 5 s after SIGTERM\n{p.log()}")
        elapsed = time.monotonic() - start
        assert 0.8 <= elapsed <= 3.0, elapsed
        assert p.proc.returncode == 0, p.log()
        with pytest.raises(psycopg.OperationalError):
            idle.execute("SELECT 1")


def test_without_shutdown_timeout_sigterm_waits_for_the_client(pooler) -> None:
    """The counter-check: shutdown_timeout = 0 (the default) waits for clients forever."""
    p = pooler(ini_overrides={"shutdown_timeout": "0"})
    with connect(p.dsn()) as idle:
        assert idle.execute("SELECT 1").fetchone()[0] == 1
        p.proc.send_signal(signal.SIGTERM)
        time.sleep(2)
        assert p.proc.poll() is None, p.log()
        assert idle.execute("SELECT 2").fetchone()[0] == 2  # still served meanwhile
    # the last client gone, the drain is over
    try:
        p.proc.wait(5)
    except subprocess.TimeoutExpired:
        p.proc.send_signal(signal.SIGQUIT)
        p.proc.wait(5)
        pytest.fail(f"still running 5 s after its last client left\n{p.log()}")


def test_a_server_fresh_from_its_login_is_not_checked(postgres, pooler) -> None:
    """As PgBouncer: server_check_query runs on a server that has served before, never on
    one that has just logged in (server_check_delay = 0 checks every reuse)."""
    p = pooler(ini_overrides={
        "default_pool_size": "1", "server_check_delay": "0",
        "server_check_query": "SELECT pg_catalog.set_config('pypool.checked', 'yes', false)",
    })
    seen = "SELECT coalesce(current_setting('pypool.checked', true), '')"
    with connect(p.dsn()) as conn:
        assert conn.execute(seen).fetchone() == ("",)  # fresh: not checked
        assert conn.execute(seen).fetchone() == ("yes",)  # reused: checked
