"""The console's SHOW result sets, column for column as PgBouncer 1.24 sends them.

Each SHOW is a function from the pooler's read-only view (observe/view.py) to a `ResultSet`.
Exporters and dashboards read these by name and position, so the column names, their order
and their types are an interface: they follow PgBouncer 1.24's admin.c and stats.c,
including its type letters (s text, i int4, q int8, N numeric, T a timestamp sent as text).
Where pypool has nothing to report (cancel-request lists of pools, DNS) the value is 0,
empty or NULL, as PgBouncer shows it when that feature is unused. The admin console itself
appears as the database `pgbouncer` with the pool `pgbouncer/pgbouncer`, as in PgBouncer.

This module reads the view's snapshots and never sees the pooler itself.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import PGBOUNCER_VERSION, __version__
from ..observe.view import ADMIN_DB, ClientInfo, PoolerView, PoolInfo, ServerInfo
from ..pooling import stats as st
from ..protocol import messages as m
from ..settings import RESTART_ONLY_KEYS, PoolerSettings

# PgBouncer's own version first: tools that gate features on it parse the first x.y.z.
VERSION = f"PgBouncer {PGBOUNCER_VERSION} (pypool {__version__})"

_TYPE_OIDS = {"s": 25, "T": 25, "i": 23, "q": 20, "N": 1700}


@dataclass(frozen=True)
class ResultSet:
    """A result the console sends: RowDescription, DataRows (CommandComplete is the caller's)."""

    types: str  # one PgBouncer type letter per column
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]

    def encode(self) -> bytes:
        assert len(self.types) == len(self.columns)
        out = [m.row_description([(name, _TYPE_OIDS[t])
                                  for name, t in zip(self.columns, self.types, strict=True)])]
        for row in self.rows:
            out.append(m.data_row([_text(value, t)
                                   for value, t in zip(row, self.types, strict=True)]))
        return b"".join(out)


def _text(value: Any, kind: str) -> str | None:
    if value is None:
        return None
    if kind == "T":  # wall-clock seconds, shown as PgBouncer's format_time_s does
        return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(value))
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def result(types: str, columns: str, rows: Iterable[tuple[Any, ...]]) -> ResultSet:
    return ResultSet(types, tuple(columns.split()), list(rows))


# --- shared with metrics.py ------------------------------------------------------------


def config_rows(settings: PoolerSettings) -> list[tuple[str, str, str, str]]:
    """(key, value, default, changeable) per [pgbouncer] key, in name order."""
    defaults = PoolerSettings()
    rows = []
    for f in sorted(dataclasses.fields(PoolerSettings), key=lambda f: f.name):
        rows.append((f.name, config_text(getattr(settings, f.name)),
                     config_text(getattr(defaults, f.name)),
                     "no" if f.name in RESTART_ONLY_KEYS else "yes"))
    return rows


def config_text(value: Any) -> str:
    """A setting as PgBouncer prints it: booleans as 0/1, times in seconds (%g), lists joined."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


# --- SHOW POOLS, STATS, STATS_TOTALS, STATS_AVERAGES, TOTALS -------------------------------


def show_pools(view: PoolerView) -> ResultSet:
    rows = []
    admin_row = (ADMIN_DB, ADMIN_DB, view.console_client_count(), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                 0, 0, "statement", None)
    for pool in view.pools():
        c = pool.counts
        wait_us = int(c.maxwait * 1e6)
        rows.append((pool.database, pool.user, c.cl_active, c.cl_waiting, 0, 0, c.sv_active, 0,
                     c.sv_being_canceled, c.sv_idle, 0, 0, c.sv_login, wait_us // 1_000_000,
                     wait_us % 1_000_000,
                     pool.pool_mode, None))
    rows.append(admin_row)
    rows.sort(key=lambda r: (r[0], r[1]))
    return result(
        "ssiiiiiiiiiiiiiss",
        "database user cl_active cl_waiting cl_active_cancel_req cl_waiting_cancel_req "
        "sv_active sv_active_cancel sv_being_canceled sv_idle sv_used sv_tested sv_login "
        "maxwait maxwait_us pool_mode load_balance_hosts",
        rows,
    )


def _by_database(view: PoolerView) -> list[tuple[str, list[PoolInfo]]]:
    groups: dict[str, list[PoolInfo]] = {ADMIN_DB: []}
    for pool in view.pools():
        groups.setdefault(pool.database, []).append(pool)
    return sorted(groups.items())


def _database_totals(pools: Sequence[PoolInfo], view: PoolerView | None = None,
                     database: str = "") -> st.Totals:
    """A database's counters; the console's own (`view` given) for the console database."""
    totals = st.add(pool.totals for pool in pools)
    if view is not None and database == ADMIN_DB:
        totals = st.add([totals, view.console_totals()])
    return totals


_STAT_COLUMNS = ("server_assignment_count xact_count query_count {received} {sent} xact_time "
                 "query_time wait_time {parse}client_parse_count {parse}server_parse_count "
                 "{parse}bind_count {parse}client_login_count")


def show_stats(view: PoolerView) -> ResultSet:
    rows = [(db, *_database_totals(pools, view, db), *view.averages(pools))
            for db, pools in _by_database(view)]
    totals = _STAT_COLUMNS.format(received="received", sent="sent", parse="")
    avgs = _STAT_COLUMNS.format(received="recv", sent="sent", parse="")
    columns = ("database " + " ".join("total_" + c for c in totals.split()) + " "
               + " ".join("avg_" + c for c in avgs.split()))
    return result("s" + "N" * 2 * len(st.COUNTERS), columns, rows)


def show_stats_totals(view: PoolerView) -> ResultSet:
    rows = [(db, *_database_totals(pools, view, db)) for db, pools in _by_database(view)]
    columns = _STAT_COLUMNS.format(received="bytes_received", sent="bytes_sent", parse="")
    return result("s" + "N" * len(st.COUNTERS), "database " + columns, rows)


def show_stats_averages(view: PoolerView) -> ResultSet:
    rows = [(db, *view.averages(pools)) for db, pools in _by_database(view)]
    columns = _STAT_COLUMNS.format(received="bytes_received", sent="bytes_sent", parse="avg_")
    return result("s" + "N" * len(st.COUNTERS), "database " + columns, rows)


# SHOW TOTALS names rows after PgBouncer's PgStats fields, not after the SHOW STATS columns.
_TOTALS_NAMES = ("server_assignment_count", "xact_count", "query_count", "client_bytes",
                 "server_bytes", "xact_time", "query_time", "wait_time",
                 "ps_client_parse_count", "ps_server_parse_count", "ps_bind_count",
                 "client_login_count")


def show_totals(view: PoolerView) -> ResultSet:
    pools = view.pools()
    total = st.add([_database_totals(pools), view.console_totals()])
    avg = view.averages(pools)
    rows = [("total_" + name, value) for name, value in zip(_TOTALS_NAMES, total, strict=True)]
    rows += [("avg_" + name, value) for name, value in zip(_TOTALS_NAMES, avg, strict=True)]
    return result("sN", "name value", rows)


# --- SHOW CLIENTS, SERVERS ----------------------------------------------------------------

_SOCKET_TYPES = "ssssssisiTTiiississii"
_SOCKET_COLUMNS = (
    "type user database replication state addr port local_addr local_port connect_time "
    "request_time wait wait_us close_needed ptr link remote_pid tls application_name "
    "prepared_statements id"
)
# SHOW CLIENTS adds, last, pypool's `pinned`: why a client keeps its server after its
# transactions (docs/session-state.md); "" for the others.
_CLIENT_TYPES = _SOCKET_TYPES + "s"
_CLIENT_COLUMNS = _SOCKET_COLUMNS + " pinned"


def _client_row(c: ClientInfo) -> tuple[Any, ...]:
    return ("C", c.user, c.database, c.replication, c.state, c.addr, c.port, c.local_addr,
            c.local_port, c.connect_time, c.request_time, c.wait_us // 1_000_000,
            c.wait_us % 1_000_000, 0, c.ptr, c.link, 0, c.tls, c.application_name,
            c.prepared_statements, c.id, c.pinned)


def _server_row(s: ServerInfo) -> tuple[Any, ...]:
    return ("S", s.user, s.database, s.replication, s.state, s.addr, s.port, s.local_addr,
            s.local_port, s.connect_time, s.request_time, 0, 0, int(s.close_needed), s.ptr,
            s.link, s.remote_pid, s.tls, s.application_name, s.prepared_statements, s.id)


def show_clients(view: PoolerView) -> ResultSet:
    rows: list[tuple[Any, ...]] = []
    groups: list[tuple[str, Sequence[ClientInfo]]] = [
        (pool.database, pool.clients) for pool in view.pools(connections=True)
    ]
    groups.append((ADMIN_DB, view.console_clients()))
    groups.sort(key=lambda item: item[0])
    # Per pool, as PgBouncer walks its lists: the active clients, then the waiting ones.
    for _database, clients in groups:
        rows.extend(_client_row(c) for c in clients if c.state != "waiting")
        rows.extend(_client_row(c) for c in clients if c.state == "waiting")
    return result(_CLIENT_TYPES, _CLIENT_COLUMNS, rows)


def show_servers(view: PoolerView) -> ResultSet:
    rows = [_server_row(server) for pool in view.pools(connections=True)
            for server in pool.servers]
    return result(_SOCKET_TYPES, _SOCKET_COLUMNS, rows)


# SHOW SOCKETS and ACTIVE_SOCKETS: the SHOW CLIENTS/SERVERS row plus PgBouncer's seven buffer
# positions (recv_pos pkt_pos pkt_remain send_pos send_remain pkt_avail send_avail). pypool's
# buffers are asyncio's, whose positions mean nothing here: they read 0.
_DEBUG_TYPES = _SOCKET_TYPES + "iiiiiii"
_DEBUG_COLUMNS = (_SOCKET_COLUMNS + " recv_pos pkt_pos pkt_remain send_pos send_remain "
                  "pkt_avail send_avail")
_NO_BUFFERS = (0, 0, 0, 0, 0, 0, 0)
_STD = len(_SOCKET_TYPES)  # a client row's PgBouncer columns, before pypool's `pinned`
_SERVER_STATES = {"active": "sv_active", "idle": "sv_idle", "new": "sv_login"}


def _socket_rows(view: PoolerView) -> list[tuple[Any, ...]]:
    """Every client and server, with its state as PgBouncer's list name (cl_active, sv_idle,
    ...), pool by pool, then the clients still logging in (cl_login)."""
    rows: list[tuple[Any, ...]] = []
    groups: list[tuple[str, Sequence[ClientInfo], Sequence[ServerInfo]]] = [
        (pool.database, pool.clients, pool.servers) for pool in view.pools(connections=True)]
    groups.append((ADMIN_DB, view.console_clients(), ()))
    for _database, clients, servers in sorted(groups, key=lambda item: item[0]):
        for listed in (False, True):  # the active list (active and idle), then waiting
            rows.extend((*_client_row(c)[:4], "cl_waiting" if listed else "cl_active",
                         *_client_row(c)[5:_STD], *_NO_BUFFERS)
                        for c in clients if (c.state == "waiting") == listed)
        for server in servers:
            row = _server_row(server)
            rows.append((*row[:4], _SERVER_STATES[server.state], *row[5:], *_NO_BUFFERS))
    for c in view.login_clients():
        row = _client_row(c)
        rows.append((*row[:4], "cl_login", *row[5:_STD], *_NO_BUFFERS))
    return rows


def show_sockets(view: PoolerView) -> ResultSet:
    return result(_DEBUG_TYPES, _DEBUG_COLUMNS, _socket_rows(view))


def show_active_sockets(view: PoolerView) -> ResultSet:
    """PgBouncer lists the sockets with bytes in their buffers. pypool forwards what it
    reads at once and keeps no partial packet of its own, so none are listed."""
    return result(_DEBUG_TYPES, _DEBUG_COLUMNS, [])


def show_mem(view: PoolerView) -> ResultSet:
    """PgBouncer's slab caches, by its names; pypool has no slabs, so it counts the objects
    each cache would hold (size 0: Python objects have no fixed size)."""
    counts = dict(lists(view))
    rows = [(name, 0, counts.get(key, 0), 0, 0) for name, key in (
        ("user_cache", "users"), ("db_cache", "databases"), ("peer_cache", "peers"),
        ("pool_cache", "pools"), ("peer_pool_cache", "peer_pools"),
        ("server_cache", "used_servers"), ("client_cache", "used_clients"),
        ("iobuf_cache", ""), ("outstanding_request_cache", ""), ("var_list_cache", ""),
        ("server_prepared_statement_cache", ""))]
    return result("siiii", "name size used free memtotal", rows)


def show_fds(view: PoolerView) -> ResultSet:
    """PgBouncer's SHOW FDS feeds its online restart (-R), which pypool does not do: the
    columns, one row per client and server socket with what can be told of it."""
    rows: list[tuple[Any, ...]] = []
    for pool in view.pools(connections=True):
        for c in pool.clients:
            rows.append((c.fd, "client", c.user, c.database, c.addr, c.port, 0, 0,
                         None, None, None, None, None, None, None))
        for server in pool.servers:
            rows.append((server.fd, "server", server.user, server.database, server.addr,
                         server.port, 0, 0, None, None, None, None, None, None, None))
    return result("issssiqisssssss", "fd task user database addr port cancel link "
                  "client_encoding std_strings datestyle timezone password scram_client_key "
                  "scram_server_key", rows)


# --- SHOW DATABASES, USERS, CONFIG, LISTS, STATE, VERSION ---------------------------------


def show_databases(view: PoolerView) -> ResultSet:
    settings = view.settings
    cfg = settings.pooler
    rows: list[tuple[Any, ...]] = []
    for name in view.database_names():
        entry = view.database_entry(name)
        if entry is None:
            continue
        rows.append((
            name, entry.host, entry.port, entry.server_dbname, entry.user or None,
            _pick(entry.pool_size, cfg.default_pool_size),
            _pick(entry.min_pool_size, cfg.min_pool_size),
            _pick(entry.reserve_pool_size, cfg.reserve_pool_size),
            int(cfg.server_lifetime if entry.server_lifetime is None
                else entry.server_lifetime),
            entry.pool_mode, entry.load_balance_hosts if "," in entry.host else None,
            _pick(entry.max_db_connections, cfg.max_db_connections),
            view.servers_of_database(name), settings.database_client_cap(name),
            view.clients_of_database(name),
            int(view.paused(name)), int(view.disabled(name)),
        ))
    rows.append((ADMIN_DB, None, cfg.listen_port, ADMIN_DB, ADMIN_DB, 2, 0, 0,
                 int(cfg.server_lifetime), "statement", None, 0, 0,
                 settings.database_client_cap(ADMIN_DB),
                 view.clients_of_database(ADMIN_DB), 0, 0))
    rows.sort(key=lambda r: r[0])
    return result(
        "ssissiiiissiiiiii",
        "name host port database force_user pool_size min_pool_size reserve_pool_size "
        "server_lifetime pool_mode load_balance_hosts max_connections current_connections "
        "max_client_connections current_client_connections paused disabled",
        rows,
    )


def _pick(value: int | None, default: int) -> int:
    return default if value is None else value


def show_users(view: PoolerView) -> ResultSet:
    settings = view.settings
    cfg = settings.pooler
    rows = []
    for name in view.user_names():
        entry = settings.users.get(name)
        pool_size = "" if entry is None or entry.pool_size is None else str(entry.pool_size)
        reserve = ("" if entry is None or entry.reserve_pool_size is None
                   else str(entry.reserve_pool_size))
        max_conn = (entry and entry.max_user_connections) or cfg.max_user_connections
        rows.append((name, pool_size, reserve, entry.pool_mode if entry else None, max_conn,
                     view.servers_of_user(name), settings.user_client_cap(name),
                     view.clients_of_user(name)))
    return result(
        "ssssiiii",
        "name pool_size reserve_pool_size pool_mode max_user_connections current_connections "
        "max_user_client_connections current_client_connections",
        rows,
    )


def show_config(view: PoolerView) -> ResultSet:
    return result("ssss", "key value default changeable", config_rows(view.settings.pooler))


def lists(view: PoolerView) -> list[tuple[str, int]]:
    """SHOW LISTS' rows; the slab-allocator lists (free_*) are always 0 in pypool."""
    return [
        ("databases", len(view.database_names()) + 1),
        ("users", len(view.user_names())),
        ("peers", len(view.settings.peers)),
        ("pools", view.pool_count() + 1),
        ("peer_pools", len(view.peer_pools())),
        ("free_clients", 0),
        ("used_clients", view.client_count()),
        ("login_clients", view.login_client_count()),
        ("free_servers", 0),
        ("used_servers", view.server_count()),
        ("dns_names", 0),
        ("dns_zones", 0),
        ("dns_queries", 0),
        ("dns_pending", 0),
    ]


def show_lists(view: PoolerView) -> ResultSet:
    return result("si", "list items", lists(view))


def show_state(view: PoolerView) -> ResultSet:
    paused = view.paused_all
    suspended = view.suspended
    rows = [("active", "no" if paused else "yes"),
            ("paused", "yes" if paused and not suspended else "no"),
            ("suspended", "yes" if suspended else "no")]
    lines = view.transaction_log_lines()
    if lines is not None:  # pypool's own: transaction_log set (docs/research.md)
        rows += [("transaction_log_written", str(lines[0])),
                 ("transaction_log_dropped", str(lines[1]))]
    traced = view.traced_clients()
    if traced is not None:  # pypool's own: the protocol trace was switched on
        rows.append(("trace_clients", traced or "none"))
    return result("ss", "key value", rows)


def show_version(view: PoolerView) -> ResultSet:
    return result("s", "version", [(VERSION,)])


def show_peers(view: PoolerView) -> ResultSet:
    """The [peers] entries; pool_size -1 (unset) shows default_pool_size, as PgBouncer."""
    settings = view.settings
    return result("isii", "peer_id host port pool_size", [
        (peer.peer_id, peer.host, peer.port,
         peer.pool_size if peer.pool_size >= 0 else settings.pooler.default_pool_size)
        for _, peer in sorted(settings.peers.items())])


def show_peer_pools(view: PoolerView) -> ResultSet:
    return result("iiiii", "peer_id cl_active_cancel_req cl_waiting_cancel_req "
                           "sv_active_cancel sv_login", view.peer_pools())


def show_listeners(view: PoolerView) -> ResultSet:
    """pypool's own: each pool's listening connection (listen_mode = shared)."""
    return result("sssiiiiiii", "database user state pid channels channels_wanted listeners "
                                "notifications_received notifications_delivered lost",
                  view.listeners())


def show_empty(types: str, columns: str) -> Callable[[PoolerView], ResultSet]:
    """A SHOW for a PgBouncer feature pypool does not have: the right columns, no rows."""
    return lambda view: result(types, columns, [])


SHOWS: dict[str, Callable[[PoolerView], ResultSet]] = {
    "clients": show_clients,
    "config": show_config,
    "databases": show_databases,
    "lists": show_lists,
    "pools": show_pools,
    "servers": show_servers,
    "state": show_state,
    "stats": show_stats,
    "stats_averages": show_stats_averages,
    "stats_totals": show_stats_totals,
    "totals": show_totals,
    "users": show_users,
    "version": show_version,
    "sockets": show_sockets,
    "active_sockets": show_active_sockets,
    "mem": show_mem,
    "fds": show_fds,
    "peers": show_peers,
    "peer_pools": show_peer_pools,
    "listeners": show_listeners,
    "dns_hosts": show_empty("sqs", "hostname ttl addrs"),
    "dns_zones": show_empty("sqi", "zonename serial count"),
}

# Session settings clients like to SHOW or SET on connect; answered with fixed values.
FAKE_PARAMS = {
    "client_encoding": "UTF-8",
    "default_transaction_isolation": "read committed",
    "standard_conforming_strings": "on",
    "datestyle": "ISO",
    "timezone": "GMT",
}

HELP = """
\tSHOW HELP|CONFIG|DATABASES|POOLS|CLIENTS|SERVERS|USERS|VERSION
\tSHOW PEERS|PEER_POOLS
\tSHOW FDS|SOCKETS|ACTIVE_SOCKETS|LISTS|MEM|STATE
\tSHOW DNS_HOSTS|DNS_ZONES
\tSHOW STATS|STATS_TOTALS|STATS_AVERAGES|TOTALS
\tSET key = arg
\tRELOAD
\tPAUSE [<db>]
\tRESUME [<db>]
\tDISABLE <db>
\tENABLE <db>
\tRECONNECT [<db>]
\tKILL [<db>]
\tKILL_CLIENT <client_id>
\tSUSPEND
\tSHUTDOWN
\tSHUTDOWN WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS|DRAIN
\tWAIT_CLOSE [<db>]"""
