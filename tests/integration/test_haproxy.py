"""pypool behind a real HAProxy: three instances as [peers] of each other behind one address,
the PROXY protocol (v2) from HAProxy, HAProxy's health checks against GET /health, and a
rolling restart under load (docs/operating.md, "Behind HAProxy: health checks and rolling
restarts").

HAProxy connects to the instances from 127.0.0.3 (`source`), the only address in their
`proxy_protocol_sources`; the tests connect from 127.0.0.1, to HAProxy or straight to an
instance (its console, or a cancel sent to the wrong one). The instances name each other in
[peers] by their unix socket directories, which stay open while an instance drains.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pypool.embedded import EmbeddedPostgres, free_port
from pypool.protocol import cancel_key
from tests.conftest import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    APP_PASSWORD,
    APP_USER,
    REPO_ROOT,
    Pooler,
    PoolerFactory,
    _wait_until_listening,
    rows_in,
)

from .app_client import connect
from .polling import wait_for
from .rawclient import RawClient
from .test_peers import SlowQuery, running, send_cancel

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(shutil.which("haproxy") is None,
                       reason="haproxy is not installed (.ci/install installs it)"),
]

BALANCER_SOURCE = "127.0.0.3"  # the address HAProxy connects to the instances from
INSTANCES = 3


@dataclass
class Address:
    """Where a client connects: HAProxy's frontend."""

    host: str
    port: int

    def dsn(self, dbname: str = "app", user: str = APP_USER) -> str:
        return f"host={self.host} port={self.port} dbname={dbname} user={user}"


@dataclass
class Cluster:
    """The instances, their metrics ports, and HAProxy in front of them."""

    instances: list[Pooler]
    metrics_ports: list[int]
    front: Address
    haproxy: subprocess.Popen[bytes]
    stats_socket: Path
    env: dict[str, str] = field(repr=False)

    def status(self) -> dict[str, str]:
        """HAProxy's view of each server: UP, DOWN, ... (`show stat` on its socket)."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(2)
            sock.connect(str(self.stats_socket))
            sock.sendall(b"show stat\n")
            text = b""
            while chunk := sock.recv(65536):
                text += chunk
        lines = text.decode().splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]
        return {row["svname"]: row["status"] for row in rows if row.get("pxname") == "pypool"}

    def all_up(self) -> bool:
        return all(self.status().get(f"p{i + 1}") == "UP" for i in range(len(self.instances)))

    def restart(self, p: Pooler) -> None:
        """Start the instance again, from its ini, once its process has exited: the same
        port, unix socket and log (appended)."""
        assert p.proc.poll() is not None
        with open(p.log_path, "ab") as log:
            p.proc = subprocess.Popen(
                [sys.executable, "-m", "pypool", str(p.ini_path)], stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, cwd=p.ini_path.parent, env=self.env)
        _wait_until_listening(p)

    def reboot(self, p: Pooler) -> subprocess.Popen[bytes]:
        """Start a new process for the instance with -R (online restart): it takes over the
        running one's sockets and idle clients; returns the old process. The new one logs
        to a file of its own (the old one writes on at its own offset in the other)."""
        old = p.proc
        p.log_path = p.log_path.with_name(f"rebooted-{time.monotonic_ns()}.log")
        with open(p.log_path, "wb") as log:
            p.proc = subprocess.Popen(
                [sys.executable, "-m", "pypool", "-R", str(p.ini_path)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=p.ini_path.parent, env=self.env)
        return old


def show(p: Pooler, what: str) -> list[dict[str, Any]]:
    """A SHOW on the instance's console, straight to it (not through HAProxy)."""
    with connect(p.dsn("pgbouncer", ADMIN_USER, ADMIN_PASSWORD)) as admin:
        cur = admin.execute(f"SHOW {what}")
        names = [c.name for c in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def haproxy_config(front: int, instances: list[tuple[int, int]], stats: Path) -> str:
    """The configuration docs/operating.md shows, with test-sized check intervals."""
    servers = "\n".join(
        f"    server p{i + 1} 127.0.0.1:{port} check port {metrics}"
        for i, (port, metrics) in enumerate(instances))
    return f"""\
global
    maxconn 512
    stats socket {stats} mode 600 level admin

defaults
    mode tcp
    timeout connect 1s
    timeout client 60s
    timeout server 60s
    timeout check 1s
    retries 3
    option redispatch 1

frontend postgres
    bind 127.0.0.1:{front}
    default_backend pypool

backend pypool
    balance roundrobin
    source {BALANCER_SOURCE}
    option httpchk GET /health
    http-check expect status 200
    default-server send-proxy-v2 inter 200ms fall 1 rise 2
{servers}
"""


@pytest.fixture
def cluster(postgres: EmbeddedPostgres, pooler: PoolerFactory,
            tmp_path: Path) -> Iterator[Cluster]:
    taken = {postgres.port}

    def port() -> int:
        number = free_port()
        while number in taken:
            number = free_port()
        taken.add(number)
        return number

    ports = [port() for _ in range(INSTANCES)]
    metrics = [port() for _ in range(INSTANCES)]
    # The pooler fixture gives instance n the folder tmp_path/pooler-n, its unix socket's.
    peers = "[peers]\n" + "".join(
        f"{i + 1} = host={tmp_path / f'pooler-{i + 1}'} port={ports[i]}\n"
        for i in range(INSTANCES))
    instances = [
        pooler({"auth_type": "trust", "shutdown_drain": "1",
                "listen_port": str(ports[i]), "peer_id": str(i + 1),
                "metrics_port": str(metrics[i]), "metrics_addr": "127.0.0.1",
                "proxy_protocol_sources": BALANCER_SOURCE, "shutdown_timeout": "20"},
               extra_sections=peers)
        for i in range(INSTANCES)
    ]
    stats = tmp_path / "haproxy.sock"
    front = port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(haproxy_config(front, list(zip(ports, metrics, strict=True)), stats))
    log = open(tmp_path / "haproxy.log", "wb")  # noqa: SIM115 - closed at teardown
    haproxy = subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdin=subprocess.DEVNULL,
                               stdout=log, stderr=subprocess.STDOUT)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    c = Cluster(instances, metrics, Address("127.0.0.1", front), haproxy, stats, env)
    try:
        assert wait_for(lambda: stats.exists() and c.all_up(), 10), (
            (tmp_path / "haproxy.log").read_text())
        yield c
    finally:
        haproxy.terminate()
        try:
            haproxy.wait(5)
        except subprocess.TimeoutExpired:
            haproxy.kill()
            haproxy.wait()
        log.close()


def test_show_clients_shows_the_real_client_address(cluster: Cluster) -> None:
    """Through HAProxy, each instance shows the client's own address and port (from the
    PROXY v2 header), never HAProxy's."""
    clients = [RawClient(cluster.front.host, cluster.front.port) for _ in range(INSTANCES)]
    try:
        for raw in clients:
            assert raw.login(APP_USER, "app").error is None
        mine = {raw.sock.getsockname() for raw in clients}
        seen = set()
        for p in cluster.instances:
            rows = [row for row in show(p, "CLIENTS") if row["database"] == "app"]
            assert len(rows) == 1  # round robin: one client on each instance
            assert rows[0]["addr"] != BALANCER_SOURCE, rows
            seen.add((rows[0]["addr"], rows[0]["port"]))
        assert seen == mine  # each client's own address and port
    finally:
        for raw in clients:
            raw.close()


def test_a_cancel_reaching_the_wrong_instance_cancels_the_right_query(
        postgres: EmbeddedPostgres, cluster: Cluster) -> None:
    """A query runs on the instance HAProxy picked; its CancelRequest is sent straight to
    another instance, which forwards it to the owner by [peers]. A driver's own cancel,
    through HAProxy (to whichever instance comes next), lands too."""
    query = SlowQuery(cluster.front, 20)  # type: ignore[arg-type]  # host and port suffice
    owner = cancel_key.peer_of(query.key[0])
    assert owner in range(1, INSTANCES + 1)
    query.start()
    assert wait_for(lambda: running(postgres) == 1, 5)
    wrong = cluster.instances[owner % INSTANCES]  # the next one: never the owner
    start = time.monotonic()
    send_cancel(wrong.host, wrong.port, query.key)
    query.join(5)
    assert query.sqlstate == "57014"  # query_canceled
    assert time.monotonic() - start < 3
    for _ in range(INSTANCES):
        with connect(cluster.front.dsn()) as conn:
            result: list[BaseException] = []

            def sleep(conn: psycopg.Connection[Any] = conn, result: list[Any] = result) -> None:
                try:
                    conn.execute("SELECT pg_sleep(20) /* peer-cancel */")
                except psycopg.Error as exc:
                    result.append(exc)

            sleeper = threading.Thread(target=sleep, daemon=True)
            sleeper.start()
            assert wait_for(lambda: running(postgres) == 1, 5)
            conn.cancel_safe(timeout=5)
            sleeper.join(5)
            assert result and isinstance(result[0], psycopg.errors.QueryCanceled), result


class Writer(threading.Thread):
    """An application thread: INSERT transactions through HAProxy, reconnecting on error
    and every 20 transactions.

    Each transaction is BEGIN, INSERT of a number of its own, COMMIT, and remembers what
    happened: `committed` (COMMIT answered), `lost` (an error after BEGIN succeeded: its
    outcome unknown to the application), `retried` (an error at BEGIN, or connecting:
    nothing was sent for that number)."""

    def __init__(self, front: Address, table: str, index: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.front, self.table, self.stop = front, table, stop
        self.next = index * 1_000_000
        self.committed: list[int] = []
        self.lost: list[tuple[int, str]] = []
        self.retried: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                conn = connect(self.front.dsn())
            except psycopg.OperationalError as exc:
                self.retried.append(f"connect: {exc}")
                time.sleep(0.05)
                continue
            with conn:
                self._transactions(conn)

    def _transactions(self, conn: psycopg.Connection[Any]) -> None:
        # A new connection every 20 transactions, as an application's pool recycles them
        # (max_lifetime): so the load spreads over the instances, restarted ones too.
        for _ in range(20):
            if self.stop.is_set():
                return
            number = self.next
            self.next += 1
            try:
                conn.execute("BEGIN")
            except psycopg.OperationalError as exc:
                # Drained between transactions (57P01), or the connection already gone.
                self.retried.append(f"BEGIN: {exc.sqlstate} {exc}")
                return
            try:
                conn.execute(f"INSERT INTO {self.table} VALUES (%s)", (number,))
                conn.execute("COMMIT")
            except psycopg.Error as exc:
                self.lost.append((number, f"{exc.sqlstate} {exc}"))
                return
            self.committed.append(number)


def logged_in_since(p: Pooler, offset: int) -> bool:
    return "login attempt: db=app" in p.log()[offset:]


def committed_past(writers: list[Writer], count: int) -> bool:
    return sum(len(w.committed) for w in writers) > count


@contextmanager
def writing(cluster: Cluster, table: str) -> Iterator[list[Writer]]:
    """Four writers through HAProxy, each past 20 commits when this yields; stopped and
    joined at the end."""
    stop = threading.Event()
    writers = [Writer(cluster.front, table, i, stop) for i in range(4)]
    for writer in writers:
        writer.start()
    try:
        assert wait_for(lambda: all(len(w.committed) > 20 for w in writers), 10)
        yield writers
    finally:
        stop.set()
        for writer in writers:
            writer.join(10)
    assert not any(w.is_alive() for w in writers)


def assert_stored(postgres: EmbeddedPostgres, table: str, writers: list[Writer]) -> None:
    """Every committed row is in PostgreSQL, and nothing else is."""
    committed = {number for w in writers for number in w.committed}
    with psycopg.connect(postgres.dsn("app", APP_USER, APP_PASSWORD), autocommit=True) as conn:
        stored = {row[0] for row in conn.execute(f"SELECT x FROM {table}")}
    assert stored == committed
    assert rows_in(postgres, table) == len(committed)


def test_rolling_restart_under_load_loses_nothing(
        postgres: EmbeddedPostgres, cluster: Cluster, app_table: str) -> None:
    """Four reconnecting writers through HAProxy while each instance in turn is drained
    (SHUTDOWN DRAIN on the console for the first, SIGINT with shutdown_drain for the others),
    waited for, restarted, seen UP again by HAProxy and sent clients. No transaction fails
    once begun, and every committed row is in PostgreSQL and nothing else is."""
    with writing(cluster, app_table) as writers:
        for n, p in enumerate(cluster.instances):
            before = sum(len(w.committed) for w in writers)
            if n == 0:
                with connect(p.dsn("pgbouncer", ADMIN_USER, ADMIN_PASSWORD)) as admin:
                    admin.execute("SHUTDOWN DRAIN")
            else:
                p.proc.send_signal(signal.SIGINT)
            p.proc.wait(10)
            assert p.proc.returncode == 0
            cluster.restart(p)
            assert wait_for(cluster.all_up, 10), cluster.status()
            # HAProxy sends it clients again (the writers reconnect after each drain).
            assert wait_for(partial(logged_in_since, p, len(p.log())), 10), p.log()
            # The others carried the load meanwhile, and it goes on.
            assert wait_for(partial(committed_past, writers, before + 50), 10)
    lost = [entry for w in writers for entry in w.lost]
    assert lost == [], lost
    assert_stored(postgres, app_table, writers)
    retried = [entry for w in writers for entry in w.retried]
    assert retried, "no instance drained a client: the test did not test the drain"


def local_address(conn: psycopg.Connection[Any]) -> tuple[str, int]:
    """The client's own end of its connection (what SHOW CLIENTS should show)."""
    with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
        host, port = sock.getsockname()[:2]
    return str(host), int(port)


def test_rolling_online_restart_under_load_shows_no_error(
        postgres: EmbeddedPostgres, cluster: Cluster, app_table: str) -> None:
    """The same load while each instance in turn is restarted with -R (a new process takes
    over its sockets and its clients between their transactions): no writer sees any error,
    not even at BEGIN or connecting, and every committed row is in PostgreSQL. Idle clients,
    one on each instance, are carried over every restart with their own addresses."""
    with ExitStack() as stack:
        idle = [stack.enter_context(connect(cluster.front.dsn())) for _ in range(INSTANCES)]
        mine = {local_address(conn) for conn in idle}
        with writing(cluster, app_table) as writers:
            for p in cluster.instances:
                before = sum(len(w.committed) for w in writers)
                old = cluster.reboot(p)
                assert old.wait(15) == 0, p.log()
                assert p.proc.poll() is None, p.log()
                assert wait_for(lambda p=p: "clients adopted" in p.log(), 5), p.log()
                assert wait_for(cluster.all_up, 10), cluster.status()
                # The new process serves new connections too, and the load goes on.
                assert wait_for(partial(logged_in_since, p, len(p.log())), 10), p.log()
                assert wait_for(partial(committed_past, writers, before + 50), 10)
        errors = [entry for w in writers for entry in (*w.lost, *w.retried)]
        assert errors == [], errors
        # The idle clients were carried over too, each with its own address (from the PROXY
        # header, not HAProxy's), and go on.
        seen = {(row["addr"], row["port"]) for p in cluster.instances
                for row in show(p, "CLIENTS") if row["database"] == "app"}
        assert mine <= seen, (mine, seen)
        for conn in idle:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    assert_stored(postgres, app_table, writers)
