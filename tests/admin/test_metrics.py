"""The Prometheus endpoint (metrics_port) of a running pypool: pgbouncer_exporter's names and
labels, pypool's own per-pool counters and histograms, values that agree with the console."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pypool.embedded import free_port
from tests.admin.console_client import Background, app, console, row, wait_until
from tests.conftest import Pooler, rss_mib

pytestmark = pytest.mark.timeout(60)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(p: Pooler, port: int, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://{p.host}:{port}{path}", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        return response.read().decode()


def samples(text: str) -> Samples:
    """Every sample by (name, sorted labels)."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(s: Samples, metric: str, /, **labels: str) -> float:
    return s[(metric, tuple(sorted(labels.items())))]


def matching(s: Samples, metric: str, /, **labels: str
             ) -> dict[tuple[tuple[str, str], ...], float]:
    return {key[1]: v for key, v in s.items()
            if key[0] == metric and all((k, v2) in key[1] for k, v2 in labels.items())}


@pytest.fixture
def metrics_pooler(operated_pooler: Callable[..., Pooler]) -> tuple[Pooler, int]:
    port = free_port()
    return operated_pooler(metrics_port=port, default_pool_size=2, query_wait_timeout=1), port


def test_metrics_while_clients_run(metrics_pooler: tuple[Pooler, int]) -> None:
    p, port = metrics_pooler
    stopping = False

    def work() -> int:
        done = 0
        with app(p) as conn:
            while not stopping:
                with conn.transaction():
                    conn.execute("SELECT pg_sleep(0.002)")
                done += 1
        return done

    pool = {"database": "app", "user": "app"}

    def all_clients_in() -> Samples | None:
        s = samples(scrape(p, port))
        try:
            clients = (value(s, "pgbouncer_pools_client_active_connections", **pool)
                       + value(s, "pgbouncer_pools_client_waiting_connections", **pool))
        except KeyError:  # no pool yet
            return None
        return s if clients == 4 else None

    workers = [Background(work) for _ in range(4)]
    try:
        s = wait_until(all_clients_in)
        assert value(s, "pgbouncer_up") == 1
        (version,) = matching(s, "pgbouncer_version_info")
        assert dict(version)["version"].startswith("PgBouncer 1.24.1 (pypool ")
        servers = (value(s, "pgbouncer_pools_server_active_connections", **pool)
                   + value(s, "pgbouncer_pools_server_idle_connections", **pool)
                   + value(s, "pgbouncer_pools_server_login_connections", **pool))
        assert 1 <= servers <= 2
        for name in ("client_active_cancel_connections", "client_waiting_cancel_connections",
                     "server_active_cancel_connections", "server_being_canceled_connections",
                     "server_used_connections", "server_testing_connections",
                     "client_maxwait_seconds"):
            assert value(s, f"pgbouncer_pools_{name}", **pool) >= 0
        assert sum(matching(s, "pypool_pool_clients", **pool).values()) == 4
        assert value(s, "pgbouncer_databases_pool_size", name="app", host="127.0.0.1",
                     port=str(_pg_port(p)), database="app", force_user="",
                     pool_mode="") == 2
        assert value(s, "pgbouncer_config_max_client_connections") == 500
        assert value(s, "pgbouncer_used_clients") >= 4
        assert value(s, "process_resident_memory_bytes") > 0
        time.sleep(0.5)
        s = samples(scrape(p, port))
        xacts = value(s, "pgbouncer_stats_sql_transactions_pooled_total", database="app")
        assert xacts > 10
        assert value(s, "pgbouncer_stats_queries_pooled_total", database="app") >= xacts
        assert value(s, "pgbouncer_stats_server_in_transaction_seconds_total",
                     database="app") > xacts * 0.002 * 0.9
        for name in ("queries_duration_seconds_total", "client_wait_seconds_total",
                     "received_bytes_total", "sent_bytes_total"):
            assert value(s, f"pgbouncer_stats_{name}", database="app") >= 0
        assert value(s, "pypool_transactions_total", **pool) >= xacts
        for name in ("hits", "misses", "evictions"):
            assert value(s, f"pypool_prepared_statement_{name}_total", **pool) >= 0
        server_rows = matching(s, "pgbouncer_server_connections", user="app", database="app")
        assert 1 <= sum(server_rows.values()) <= 2
    finally:
        stopping = True
        for w in workers:
            w.result()

    # quiet now: the endpoint and the console agree exactly
    s = samples(scrape(p, port))
    with console(p) as admin:
        pools = row(admin, "POOLS", database="app")
        stats = row(admin, "STATS", database="app")
    assert value(s, "pgbouncer_pools_client_active_connections", **pool) == pools["cl_active"]
    assert value(s, "pgbouncer_pools_server_idle_connections", **pool) == pools["sv_idle"]
    assert value(s, "pgbouncer_stats_sql_transactions_pooled_total", database="app") == \
        stats["total_xact_count"]
    assert value(s, "pgbouncer_stats_client_wait_seconds_total", database="app") == \
        pytest.approx(float(stats["total_wait_time"]) / 1e6)

    # histograms: one queue-wait observation per assignment, one duration per transaction
    assignments = value(s, "pypool_server_assignments_total", **pool)
    assert value(s, "pypool_queue_wait_seconds_count", **pool) == assignments
    assert value(s, "pypool_queue_wait_seconds_bucket", le="+Inf", **pool) == assignments
    assert value(s, "pypool_queue_wait_seconds_sum", **pool) == pytest.approx(
        float(stats["total_wait_time"]) / 1e6, rel=0.01, abs=1e-3)
    transactions = value(s, "pypool_transactions_total", **pool)
    assert value(s, "pypool_transaction_seconds_count", **pool) == transactions
    buckets = sorted((float(dict(labels)["le"]), v) for labels, v in
                     matching(s, "pypool_transaction_seconds_bucket", **pool).items())
    counts = [v for _, v in buckets]
    assert counts == sorted(counts) and counts[-1] == transactions
    assert value(s, "pypool_transaction_seconds_bucket", le="0.001", **pool) < transactions / 2


def _pg_port(p: Pooler) -> int:
    return int(p.databases["app"].split("port=")[1].split()[0])


def test_errors_by_kind(metrics_pooler: tuple[Pooler, int]) -> None:
    p, port = metrics_pooler
    with app(p) as a, app(p) as b, app(p) as c:
        with pytest.raises(psycopg.errors.DivisionByZero):
            a.execute("SELECT 1/0")
        a.execute("BEGIN")
        b.execute("BEGIN")
        a.execute("SELECT 1")
        b.execute("SELECT 1")
        with pytest.raises(psycopg.OperationalError, match="query_wait_timeout"):
            c.execute("SELECT 1")  # both servers held: waits past query_wait_timeout (1 s)
    s = samples(scrape(p, port))
    pool = {"database": "app", "user": "app"}
    assert value(s, "pypool_errors_total", kind="server", **pool) == 1
    assert value(s, "pypool_errors_total", kind="query_wait_timeout", **pool) == 1
    assert value(s, "pypool_queue_wait_seconds_bucket", le="0.5", **pool) < \
        value(s, "pypool_queue_wait_seconds_count", **pool) + 1
    with pytest.raises(urllib.error.HTTPError, match="404"):
        scrape(p, port, "/nothing")



def test_a_flood_of_connections_with_huge_heads_is_bounded(
        metrics_pooler: tuple[Pooler, int]) -> None:
    """1,000 connections sending 60 KB request heads: at most 64 are served at once, a head
    past 8 KiB gets 431, the memory comes back, and a scrape after them is answered."""
    import socket

    p, port = metrics_pooler
    scrape(p, port)
    before = rss_mib(p.proc.pid)
    junk = b"GET /metrics HTTP/1.1\r\nX-Junk: " + b"a" * 60_000
    socks = []
    for _ in range(1000):
        sock = socket.create_connection((p.host, port), timeout=5)
        try:
            sock.sendall(junk)
        except OSError:
            pass  # closed on arrival: over the cap
        socks.append(sock)
    during = rss_mib(p.proc.pid)
    for sock in socks:
        sock.close()
    assert during - before < 32, f"RSS grew {during - before:.0f} MiB"
    with socket.create_connection((p.host, port), timeout=5) as sock:
        sock.sendall(junk + b"\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 431")
    wait_until(lambda: "pgbouncer_up" in scrape(p, port), timeout=10)
    assert rss_mib(p.proc.pid) - before < 32


def test_health_says_whether_this_instance_accepts(metrics_pooler: tuple[Pooler, int]) -> None:
    """GET /health: 200 `accepting`, then 503 `shutting down` from the moment a drain begins
    (SHUTDOWN WAIT_FOR_CLIENTS here, kept waiting by a connected client), while /metrics
    still answers; HEAD gets the status alone."""
    p, port = metrics_pooler
    assert scrape(p, port, "/health") == "accepting\n"
    request = urllib.request.Request(f"http://{p.host}:{port}/health", method="HEAD")
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200 and response.read() == b""
    with app(p) as client:
        client.execute("SELECT 1")
        with console(p) as admin:
            admin.execute("SHUTDOWN WAIT_FOR_CLIENTS")
        with pytest.raises(urllib.error.HTTPError) as refused:
            scrape(p, port, "/health")
        assert refused.value.code == 503 and refused.value.read() == b"shutting down\n"
        assert "pgbouncer_up" in scrape(p, port)
        assert p.proc.poll() is None  # still serving its client
    p.proc.wait(10)
