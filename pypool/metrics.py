"""Prometheus metrics: a Collector that reads the pooler's counters when scraped, and a small
HTTP endpoint on the event loop serving them at /metrics (metrics_addr:metrics_port), and
/health for a load balancer's checks: 200 while this instance accepts clients, 503 once it
is shutting down (a drain, docs/operating.md).

Names follow prometheus-community/pgbouncer_exporter where it has one (pgbouncer_pools_*,
pgbouncer_stats_*, pgbouncer_databases_*, pgbouncer_up, ...), built from the very rows the
admin console shows, so the exporter's dashboards and alerts work against pypool's own
endpoint with no exporter in between. What PgBouncer cannot give is under pypool_*: per-pool
counters, clients split into idle and linked, errors by kind, the prepared-statement cache,
and histograms of queue wait and transaction time.

Nothing here touches the hot path: the pooler only increments integers, and `collect` takes
a snapshot through the read-only view (observe/view.py) when Prometheus asks; this module
never sees the pooler itself. The HTTP server is an asyncio server on the pooler's own
loop, so a scrape sees a consistent state and no thread ever reads a pool mid-update.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from typing import Any, Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from .admin import show
from .observe.view import PoolerView

log = logging.getLogger("pypool.metrics")

# SHOW POOLS column -> pgbouncer_exporter's metric (all gauges, labels database and user).
POOL_GAUGES = {
    "cl_active": ("client_active_connections",
                  "Client connections linked to a server or idle, ready to send queries"),
    "cl_waiting": ("client_waiting_connections", "Client connections waiting for a server"),
    "cl_active_cancel_req": ("client_active_cancel_connections",
                             "Client connections that forwarded a cancel request"),
    "cl_waiting_cancel_req": ("client_waiting_cancel_connections",
                              "Client connections whose cancel request waits to be forwarded"),
    "sv_active": ("server_active_connections", "Server connections linked to a client"),
    "sv_active_cancel": ("server_active_cancel_connections",
                         "Server connections forwarding a cancel request"),
    "sv_being_canceled": ("server_being_canceled_connections",
                          "Server connections waiting for cancel requests sent to them"),
    "sv_idle": ("server_idle_connections", "Server connections idle, ready for a client"),
    "sv_used": ("server_used_connections", "Server connections needing server_check_query"),
    "sv_tested": ("server_testing_connections",
                  "Server connections running server_reset_query or server_check_query"),
    "sv_login": ("server_login_connections", "Server connections logging in"),
}

# SHOW STATS column -> (pgbouncer_exporter's counter, scale to base units, help).
STATS_COUNTERS = {
    "total_query_count": ("queries_pooled", 1, "SQL queries pooled"),
    "total_query_time": ("queries_duration_seconds", 1e-6,
                         "Seconds spent connected to PostgreSQL running queries"),
    "total_received": ("received_bytes", 1, "Bytes received from clients"),
    "total_sent": ("sent_bytes", 1, "Bytes sent to clients"),
    "total_wait_time": ("client_wait_seconds", 1e-6, "Seconds clients waited for a server"),
    "total_xact_count": ("sql_transactions_pooled", 1, "SQL transactions pooled"),
    "total_client_login_count": ("client_logins", 1, "Clients logged in (PgBouncer 1.26)"),
    "total_xact_time": ("server_in_transaction_seconds", 1e-6,
                        "Seconds spent connected to PostgreSQL in a transaction"),
}

# SHOW DATABASES column -> pgbouncer_exporter's gauge.
DATABASE_GAUGES = {
    "pool_size": ("pool_size", "Maximum number of server connections"),
    "reserve_pool_size": ("reserve_pool", "Extra server connections allowed after "
                                          "reserve_pool_timeout"),
    "max_connections": ("max_connections", "Maximum server connections for this database"),
    "current_connections": ("current_connections", "Server connections for this database"),
    "paused": ("paused", "1 if this database is paused"),
    "disabled": ("disabled", "1 if this database is disabled"),
}
DATABASE_LABELS = ("name", "host", "port", "database", "force_user", "pool_mode")

# SHOW LISTS row -> pgbouncer_exporter's gauge.
LIST_GAUGES = {
    "databases": "databases", "users": "users", "pools": "pools",
    "free_clients": "free_clients", "used_clients": "used_clients",
    "login_clients": "login_clients", "free_servers": "free_servers",
    "used_servers": "used_servers", "dns_names": "cached_dns_names",
    "dns_zones": "cached_dns_zones", "dns_queries": "in_flight_dns_queries",
}

POOL_LABELS = ["database", "user"]


def _columns(rows: show.ResultSet) -> Iterator[dict[str, Any]]:
    for row in rows.rows:
        yield dict(zip(rows.columns, row, strict=True))


def _label(value: Any) -> str:
    return "" if value is None else str(value)


# The per-pool counters: the metric (pypool_<name>), the view's counter, its scale and
# the help text.
POOL_COUNTERS: Final = (
    ("server_assignments", "server_assignment_count", 1, "Servers handed to clients"),
    ("transactions", "xact_count", 1, "Transactions completed"),
    ("queries", "query_count", 1, "Queries completed"),
    ("query_seconds", "query_time_us", 1e-6, "Seconds spent running queries"),
    ("received_bytes", "bytes_received", 1, "Bytes received from clients"),
    ("sent_bytes", "bytes_sent", 1, "Bytes sent to clients"),
    ("prepared_statement_hits", "prepared_hits", 1,
     "Prepared statements found already parsed on the server"),
    ("prepared_statement_misses", "prepared_misses", 1,
     "Prepared statements parsed on a server before use"),
    ("prepared_statement_evictions", "prepared_evictions", 1,
     "Prepared statements closed to stay under max_prepared_statements"),
    ("pipelined_transactions", "pipelined_count", 1,
     "Transactions queued on a busy server behind another client's (pipeline_depth)"),
    ("session_pinned_clients", "session_pinned", 1,
     "Clients pinned to their server by session state (session_state = follow)"),
    ("session_refused_statements", "session_refused", 1,
     "Statements that change session state refused (session_state = reject)"),
    ("session_synced_links", "session_synced", 1,
     "Links that first made or undid settings following their clients"),
    ("notifications_delivered", "notifications_delivered", 1,
     "NotificationResponses written to clients from the pool's listening connection"),
)


class PoolerCollector(Collector):
    """Everything the pooler knows, read at scrape time."""

    def __init__(self, view: PoolerView) -> None:
        self.view = view

    def describe(self) -> list[Metric]:
        return []  # metrics depend on the pools of the moment; do not collect at register time

    def collect(self) -> Iterator[Metric]:
        yield from self._pgbouncer()
        yield from self._pools()

    # --- pgbouncer_exporter's names ---------------------------------------------------------

    def _pgbouncer(self) -> Iterator[Metric]:
        view = self.view
        yield GaugeMetricFamily("pgbouncer_up", "The pooler answered the scrape", value=1)
        version = GaugeMetricFamily("pgbouncer_version_info", "The version (SHOW VERSION)",
                                    labels=["version"])
        version.add_metric([show.VERSION], 1)
        yield version
        for name, items in show.lists(view):
            if name in LIST_GAUGES:
                yield GaugeMetricFamily(f"pgbouncer_{LIST_GAUGES[name]}",
                                        f"Count of {name.replace('_', ' ')} (SHOW LISTS)",
                                        value=items)
        cfg = view.settings.pooler
        yield GaugeMetricFamily("pgbouncer_config_max_client_connections",
                                "Config maximum number of client connections",
                                value=cfg.max_client_conn)
        yield GaugeMetricFamily("pgbouncer_config_max_user_connections",
                                "Config maximum number of server connections per user",
                                value=cfg.max_user_connections)

        pools = list(_columns(show.show_pools(view)))
        for column, (name, text) in POOL_GAUGES.items():
            family = GaugeMetricFamily(f"pgbouncer_pools_{name}", text, labels=POOL_LABELS)
            for row in pools:
                family.add_metric([row["database"], row["user"]], row[column])
            yield family
        maxwait = GaugeMetricFamily("pgbouncer_pools_client_maxwait_seconds",
                                    "Age of the oldest waiting client", labels=POOL_LABELS)
        for row in pools:
            maxwait.add_metric([row["database"], row["user"]],
                               row["maxwait"] + row["maxwait_us"] / 1e6)
        yield maxwait
        lines = view.transaction_log_lines()
        if lines is not None:
            txlog_lines = CounterMetricFamily(
                "pypool_transaction_log_lines", "Lines of the transaction_log: written, or "
                "dropped because the writer fell behind", labels=["result"])
            txlog_lines.add_metric(["written"], lines[0])
            txlog_lines.add_metric(["dropped"], lines[1])
            yield txlog_lines

        stats = list(_columns(show.show_stats(view)))
        for column, (name, scale, text) in STATS_COUNTERS.items():
            counter = CounterMetricFamily(f"pgbouncer_stats_{name}", text, labels=["database"])
            for row in stats:
                counter.add_metric([row["database"]], row[column] * scale)
            yield counter

        databases = list(_columns(show.show_databases(view)))
        for column, (name, text) in DATABASE_GAUGES.items():
            family = GaugeMetricFamily(f"pgbouncer_databases_{name}", text,
                                       labels=list(DATABASE_LABELS))
            for row in databases:
                family.add_metric([_label(row[k]) for k in DATABASE_LABELS], row[column])
            yield family

        servers: dict[tuple[str, ...], int] = {}
        for row in _columns(show.show_servers(view)):
            key: tuple[str, ...] = (
                row["user"], row["database"], row["state"], f"{row['addr']}_{row['port']}",
                "true" if row["close_needed"] else "false",
            )
            servers[key] = servers.get(key, 0) + 1
        family = GaugeMetricFamily("pgbouncer_server_connections",
                                   "Server connections by state",
                                   labels=["user", "database", "state", "addr", "close_needed"])
        for key, count in sorted(servers.items()):
            family.add_metric(list(key), count)
        yield family

    # --- pypool's own, per pool -------------------------------------------------------------

    def _pools(self) -> Iterator[Metric]:
        pools = self.view.pools()

        clients = GaugeMetricFamily(
            "pypool_pool_clients", "Clients by state: idle (no server), active (holding a "
            "server), waiting (queued for one)", labels=[*POOL_LABELS, "state"])
        servers = GaugeMetricFamily("pypool_pool_servers", "Server connections by state",
                                    labels=[*POOL_LABELS, "state"])
        size = GaugeMetricFamily("pypool_pool_size", "pool_size in force",
                                 labels=POOL_LABELS)
        for pool in pools:
            labels = [pool.database, pool.user]
            c = pool.counts
            clients.add_metric([*labels, "idle"], c.cl_active - c.cl_linked)
            clients.add_metric([*labels, "active"], c.cl_linked)
            clients.add_metric([*labels, "waiting"], c.cl_waiting)
            servers.add_metric([*labels, "active"], c.sv_active)
            servers.add_metric([*labels, "idle"], c.sv_idle)
            servers.add_metric([*labels, "login"], c.sv_login)
            servers.add_metric([*labels, "being_canceled"], c.sv_being_canceled)
            size.add_metric(labels, pool.pool_size)
        yield clients
        yield servers
        yield size

        for name, field, scale, text in POOL_COUNTERS:
            family = CounterMetricFamily(f"pypool_{name}", text, labels=POOL_LABELS)
            for pool in pools:
                family.add_metric([pool.database, pool.user], pool.counters[field] * scale)
            yield family

        errors = CounterMetricFamily("pypool_errors", "Errors by kind: server (ErrorResponse "
                                     "relayed) or the pooler's own", labels=[*POOL_LABELS, "kind"])
        for pool in pools:
            for kind, count in pool.errors:
                errors.add_metric([pool.database, pool.user, kind], count)
        yield errors

        wait = HistogramMetricFamily("pypool_queue_wait_seconds",
                                     "Time from needing a server to getting one",
                                     labels=POOL_LABELS)
        xact = HistogramMetricFamily("pypool_transaction_seconds",
                                     "Time a client held a server, per transaction",
                                     labels=POOL_LABELS)
        for pool in pools:
            labels = [pool.database, pool.user]
            # Only waits are observed on the hot path; the view counts the assignments
            # without one as waits of 0.
            wait.add_metric(labels, list(pool.wait_buckets), pool.counters["wait_time_us"] / 1e6)
            xact.add_metric(labels, list(pool.xact_buckets), pool.counters["xact_time_us"] / 1e6)
        yield wait
        yield xact

        yield from self._listeners()

        handshakes = CounterMetricFamily(
            "pypool_tls_handshakes", "TLS handshakes with clients and servers, by outcome",
            labels=["side", "outcome"])
        for (side, outcome), count in sorted(self.view.tls_handshakes().items()):
            handshakes.add_metric([side, outcome], count)
        yield handshakes


    def _listeners(self) -> Iterator[Metric]:
        """SHOW LISTENERS as metrics (listen_mode = shared; pooling/listening.py)."""
        channels = GaugeMetricFamily("pypool_listen_channels", "Channels the pool's listening "
                                     "connection LISTENs on", labels=POOL_LABELS)
        clients = GaugeMetricFamily("pypool_listen_clients", "Clients that listen on a channel",
                                    labels=POOL_LABELS)
        up = GaugeMetricFamily("pypool_listen_connected", "1 while the pool's listening "
                               "connection is up", labels=POOL_LABELS)
        received = CounterMetricFamily("pypool_notifications_received", "NotificationResponses "
                                       "the pool's listening connection received",
                                       labels=POOL_LABELS)
        losses = CounterMetricFamily("pypool_listen_connection_losses", "Times the pool's "
                                     "listening connection was lost while clients listened",
                                     labels=POOL_LABELS)
        for (database, user, state, _pid, listened, _wanted, listeners, heard, _delivered,
             lost) in self.view.listeners():
            labels = [database, user]
            channels.add_metric(labels, listened)
            clients.add_metric(labels, listeners)
            up.add_metric(labels, int(state == "listening"))
            received.add_metric(labels, heard)
            losses.add_metric(labels, lost)
        yield from (channels, clients, up, received, losses)


def registry_for(view: PoolerView) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PoolerCollector(view))
    ProcessCollector(registry=registry)  # process_cpu_seconds_total, resident memory, fds
    return registry


# The endpoint is for a scraper or two, not the world: at most this many connections at once
# (more are closed on arrival), a request head of at most this many bytes (more gets 431),
# read within this many seconds. What a flood of connections can hold is then bounded.
MAX_CONNECTIONS = 64
MAX_HEAD = 8192
HEAD_TIMEOUT = 5.0


async def serve_metrics(view: PoolerView, addrs: str, port: int
                        ) -> list[asyncio.AbstractServer]:
    """Listen on each of `addrs` (comma-separated, `*` for all) and answer GET /metrics
    and GET /health."""
    registry = registry_for(view)
    open_connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_connections
        if open_connections >= MAX_CONNECTIONS:
            writer.transport.abort()
            return
        open_connections += 1
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
            writer.write(_response(registry, view, head.split(b"\r\n", 1)[0]))
            await writer.drain()
        except (asyncio.LimitOverrunError, ValueError):
            writer.write(_TOO_LARGE)
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
            pass
        finally:
            open_connections -= 1
            writer.close()

    servers: list[asyncio.AbstractServer] = []
    for host in _hosts(addrs):
        try:
            servers.append(await asyncio.start_server(handle, host, port, limit=MAX_HEAD))
        except OSError as exc:
            # Metrics are not worth refusing to pool over (with workers > 1, the first
            # worker to bind the port serves its own numbers).
            log.error("metrics: cannot listen on %s:%d: %s", host or "*", port, exc.strerror)
    if servers:
        log.info("metrics on http://%s:%d/metrics", addrs, port)
    return servers


_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
              b"Connection: close\r\n\r\n")


def _hosts(addrs: str) -> Sequence[str | None]:
    return [None if h == "*" else h for h in (a.strip() for a in addrs.split(",")) if h]


def _response(registry: CollectorRegistry, view: PoolerView, request_line: bytes) -> bytes:
    parts = request_line.decode("latin-1").split()
    method = parts[0] if parts else ""
    path = parts[1].split("?", 1)[0] if len(parts) > 1 else ""
    content_type = "text/plain; charset=utf-8"
    if method not in ("GET", "HEAD"):
        status, body = "405 Method Not Allowed", b"GET /metrics\n"
    elif path == "/health":
        # For a balancer's health check (HAProxy's `option httpchk GET /health`): a
        # draining instance says so at once, before its last client has left.
        if view.shutting_down:
            status, body = "503 Service Unavailable", b"shutting down\n"
        else:
            status, body = "200 OK", b"accepting\n"
    elif path not in ("/metrics", "/"):
        status, body = "404 Not Found", b"GET /metrics\n"
    else:
        try:
            status, body = "200 OK", generate_latest(registry)
            content_type = CONTENT_TYPE_LATEST
        except Exception:  # noqa: BLE001 - a bug in a collector must not kill the endpoint
            log.exception("collecting metrics failed")
            status, body = "500 Internal Server Error", b"collecting metrics failed\n"
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + (body if method != "HEAD" else b"")


__all__ = ["PoolerCollector", "registry_for", "serve_metrics"]
