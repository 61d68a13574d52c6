"""The console's SHOW result sets, column for column as PgBouncer 1.24 sends them.

Each SHOW is a function from the pooler's state to a `ResultSet`. Exporters and dashboards
read these by name and position, so the column names, their order and their types are an
interface: they follow PgBouncer 1.24's admin.c and stats.c, including its type letters
(s text, i int4, q int8, N numeric, T a timestamp sent as text). Where pypool has nothing to
report (cancel-request lists, TLS, peers, DNS) the value is 0, empty or NULL, as PgBouncer
shows it when that feature is unused. The admin console itself appears as the database
`pgbouncer` with the pool `pgbouncer/pgbouncer`, as in PgBouncer.

This module reads the pooler's state and never changes it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..net.client import ClientState
from ..pooling import stats as st
from ..protocol import messages as m
from ..settings import RESTART_ONLY_KEYS, DatabaseEntry, PoolerSettings

if TYPE_CHECKING:
    from ..net.client import ClientConnection
    from ..net.pooler import Pooler
    from ..net.server import ServerConnection
    from ..pooling.pool import Pool

PGBOUNCER_VERSION = "1.24.1"
# PgBouncer's own version first: tools that gate features on it parse the first x.y.z.
VERSION = f"PgBouncer {PGBOUNCER_VERSION} (pypool {__version__})"
ADMIN_DB = "pgbouncer"

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


# --- shared views of the state (also read by metrics.py) ---------------------------------


def sorted_pools(pooler: Pooler) -> list[Pool]:
    """PgBouncer keeps its pool list sorted by database, then user."""
    return sorted(pooler.pools.values(), key=lambda p: (p.database, p.user))


def admin_clients(pooler: Pooler) -> list[ClientConnection]:
    return [c for c in pooler.clients if c.admin is not None]


@dataclass
class PoolCounts:
    """A pool's clients and servers by PgBouncer's states (cl_*, sv_*), plus pypool's finer
    split of cl_active into clients holding a server and idle ones."""

    cl_active: int = 0
    cl_waiting: int = 0
    cl_linked: int = 0  # part of cl_active: holding a server right now
    sv_active: int = 0
    sv_idle: int = 0
    sv_login: int = 0
    sv_being_canceled: int = 0
    maxwait: float = 0.0  # seconds the oldest waiting client has waited


def pool_counts(pool: Pool, now: float) -> PoolCounts:
    counts = PoolCounts(sv_active=len(pool.active), sv_idle=len(pool.idle),
                        sv_login=len(pool.login),
                        sv_being_canceled=len(pool.being_canceled))
    for client in pool.clients:
        state = client.state
        if state is ClientState.WAITING or state is ClientState.WELCOME:
            counts.cl_waiting += 1
        else:
            counts.cl_active += 1
            if state is ClientState.ACTIVE:
                counts.cl_linked += 1
    for client in pool.waiting:
        if client.state is ClientState.WAITING:
            counts.maxwait = max(0.0, now - client.wait_start)
            break
    return counts


def database_names(pooler: Pooler) -> list[str]:
    """Configured databases (not the `*` fallback), those created through it, and removed ones
    that still have clients."""
    names = {name for name in pooler.settings.databases if name != "*"}
    names.update(pool.database for pool in pooler.pools.values())
    return sorted(names)


def database_entry(pooler: Pooler, name: str) -> DatabaseEntry | None:
    return pooler.settings.database(name) or pooler.retired.get(name)


def user_names(pooler: Pooler) -> list[str]:
    names = set(pooler.auth_secrets) | set(pooler.auth_query_secrets)
    names.update(pooler.settings.users)
    names.update(pool.user for pool in pooler.pools.values())
    names.add(ADMIN_DB)
    return sorted(names)


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


def show_pools(pooler: Pooler) -> ResultSet:
    now = pooler.now()
    rows = []
    admin_row = (ADMIN_DB, ADMIN_DB, len(admin_clients(pooler)), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                 0, 0, "statement", None)
    for pool in sorted_pools(pooler):
        c = pool_counts(pool, now)
        wait_us = int(c.maxwait * 1e6)
        rows.append((pool.database, pool.user, c.cl_active, c.cl_waiting, 0, 0, c.sv_active, 0,
                     c.sv_being_canceled, c.sv_idle, 0, 0, c.sv_login, wait_us // 1_000_000,
                     wait_us % 1_000_000,
                     pool.limits.pool_mode, None))
    rows.append(admin_row)
    rows.sort(key=lambda r: (r[0], r[1]))
    return result(
        "ssiiiiiiiiiiiiiss",
        "database user cl_active cl_waiting cl_active_cancel_req cl_waiting_cancel_req "
        "sv_active sv_active_cancel sv_being_canceled sv_idle sv_used sv_tested sv_login "
        "maxwait maxwait_us pool_mode load_balance_hosts",
        rows,
    )


def _by_database(pooler: Pooler) -> list[tuple[str, list[Pool]]]:
    groups: dict[str, list[Pool]] = {ADMIN_DB: []}
    for pool in sorted_pools(pooler):
        groups.setdefault(pool.database, []).append(pool)
    return sorted(groups.items())


def _database_totals(pools: Sequence[Pool]) -> st.Totals:
    return st.add(st.totals(pool.stats) for pool in pools)


_STAT_COLUMNS = ("server_assignment_count xact_count query_count {received} {sent} xact_time "
                 "query_time wait_time {parse}client_parse_count {parse}server_parse_count "
                 "{parse}bind_count")


def show_stats(pooler: Pooler) -> ResultSet:
    now = pooler.now()
    periods = pooler.stats_periods
    rows = [(db, *_database_totals(pools), *periods.averages_of(pools, now))
            for db, pools in _by_database(pooler)]
    totals = _STAT_COLUMNS.format(received="received", sent="sent", parse="")
    avgs = _STAT_COLUMNS.format(received="recv", sent="sent", parse="")
    columns = ("database " + " ".join("total_" + c for c in totals.split()) + " "
               + " ".join("avg_" + c for c in avgs.split()))
    return result("s" + "N" * 22, columns, rows)


def show_stats_totals(pooler: Pooler) -> ResultSet:
    rows = [(db, *_database_totals(pools)) for db, pools in _by_database(pooler)]
    columns = _STAT_COLUMNS.format(received="bytes_received", sent="bytes_sent", parse="")
    return result("s" + "N" * 11, "database " + columns, rows)


def show_stats_averages(pooler: Pooler) -> ResultSet:
    now = pooler.now()
    rows = [(db, *pooler.stats_periods.averages_of(pools, now))
            for db, pools in _by_database(pooler)]
    columns = _STAT_COLUMNS.format(received="bytes_received", sent="bytes_sent", parse="avg_")
    return result("s" + "N" * 11, "database " + columns, rows)


# SHOW TOTALS names rows after PgBouncer's PgStats fields, not after the SHOW STATS columns.
_TOTALS_NAMES = ("server_assignment_count", "xact_count", "query_count", "client_bytes",
                 "server_bytes", "xact_time", "query_time", "wait_time",
                 "ps_client_parse_count", "ps_server_parse_count", "ps_bind_count")


def show_totals(pooler: Pooler) -> ResultSet:
    pools = list(pooler.pools.values())
    total = _database_totals(pools)
    avg = pooler.stats_periods.averages_of(pools, pooler.now())
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


def _ptr(obj: object | None) -> str:
    return f"0x{id(obj):x}" if obj is not None else ""


def _sockname(transport: Any) -> tuple[str, int]:
    name = transport.get_extra_info("sockname") if transport is not None else None
    if isinstance(name, tuple) and len(name) >= 2:
        return str(name[0]), int(name[1])
    return "", 0


def _prepared_count(connection: Any) -> int:
    """Protocol-level prepared statements a client has named, or a server holds (as
    PgBouncer counts them); 0 where prepared statements are off."""
    statements = getattr(connection, "statements", None)
    if statements is None:
        return 0
    return len(getattr(statements, "names", None) or getattr(statements, "lru", None) or ())


def _client_row(client: ClientConnection, state: str, database: str, wall: float,
                now: float) -> tuple[Any, ...]:
    wait_us = 0
    if client.state is ClientState.WAITING:
        wait_us = int(max(0.0, now - client.wait_start) * 1e6)
    local_addr, local_port = _sockname(client.transport)
    return ("C", client.user, database, "none", state, client.peer[0], client.peer[1],
            local_addr, local_port, client.connect_time + wall, client.state_since + wall,
            wait_us // 1_000_000, wait_us % 1_000_000, 0, _ptr(client), _ptr(client.server), 0,
            "", client.params.get("application_name", ""), _prepared_count(client), client.id)


def _server_row(server: ServerConnection, state: str, close_needed: bool,
                wall: float) -> tuple[Any, ...]:
    pool = server.pool
    local_addr, local_port = _sockname(server.transport)
    return ("S", pool.user, pool.database, "none", state, server.host, server.port, local_addr,
            local_port or server.local_port, server.connect_time + wall,
            server.request_time + wall, 0, 0, int(close_needed), _ptr(server),
            _ptr(server.client), server.backend_pid, "",
            server.params.get("application_name", ""), _prepared_count(server), server.id)


def show_clients(pooler: Pooler) -> ResultSet:
    now = pooler.now()
    wall = time.time() - now  # loop time to wall-clock time
    rows: list[tuple[Any, ...]] = []
    admins = sorted(admin_clients(pooler), key=lambda c: c.id)
    pools: list[tuple[str, list[ClientConnection]]] = [
        (pool.database, sorted(pool.clients, key=lambda c: c.id)) for pool in sorted_pools(pooler)
    ]
    pools.append((ADMIN_DB, admins))
    pools.sort(key=lambda item: item[0])
    for database, clients in pools:
        waiting = (ClientState.WAITING, ClientState.WELCOME)
        for client in clients:
            if client.state not in waiting:
                rows.append(_client_row(client, "active", database, wall, now))
        for client in clients:
            if client.state in waiting:
                rows.append(_client_row(client, "waiting", database, wall, now))
    return result(_SOCKET_TYPES, _SOCKET_COLUMNS, rows)


def show_servers(pooler: Pooler) -> ResultSet:
    wall = time.time() - pooler.now()
    rows = []
    for pool in sorted_pools(pooler):
        # Idle servers most recently used first: the order they will be handed out in.
        for state, servers in (("active", sorted(pool.active, key=lambda s: s.id)),
                               ("idle", pool.idle[::-1]),
                               ("new", sorted(pool.login, key=lambda s: s.id))):
            for server in servers:
                rows.append(_server_row(server, state, server in pool.close_needed, wall))
    return result(_SOCKET_TYPES, _SOCKET_COLUMNS, rows)


# --- SHOW DATABASES, USERS, CONFIG, LISTS, STATE, VERSION ---------------------------------


def show_databases(pooler: Pooler) -> ResultSet:
    cfg = pooler.settings.pooler
    rows: list[tuple[Any, ...]] = []
    clients_per_db: dict[str, int] = {}
    for pool in pooler.pools.values():
        clients_per_db[pool.database] = clients_per_db.get(pool.database, 0) + len(pool.clients)
    for name in database_names(pooler):
        entry = database_entry(pooler, name)
        if entry is None:
            continue
        rows.append((
            name, entry.host, entry.port, entry.server_dbname, entry.user or None,
            _pick(entry.pool_size, cfg.default_pool_size),
            _pick(entry.min_pool_size, cfg.min_pool_size),
            _pick(entry.reserve_pool_size, cfg.reserve_pool_size),
            int(cfg.server_lifetime), entry.pool_mode, None,
            _pick(entry.max_db_connections, cfg.max_db_connections),
            pooler.servers_per_db.get(name, 0), 0, clients_per_db.get(name, 0),
            int(pooler.paused_all or name in pooler.paused_dbs), int(name in pooler.disabled_dbs),
        ))
    rows.append((ADMIN_DB, None, cfg.listen_port, ADMIN_DB, ADMIN_DB, 2, 0, 0,
                 int(cfg.server_lifetime), "statement", None, 0, 0, 0,
                 len(admin_clients(pooler)), 0, 0))
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


def show_users(pooler: Pooler) -> ResultSet:
    cfg = pooler.settings.pooler
    clients_per_user: dict[str, int] = {}
    for client in pooler.clients:
        if client not in pooler.login_clients:
            clients_per_user[client.user] = clients_per_user.get(client.user, 0) + 1
    rows = []
    for name in user_names(pooler):
        entry = pooler.settings.users.get(name)
        pool_size = "" if entry is None or entry.pool_size is None else str(entry.pool_size)
        max_conn = (entry and entry.max_user_connections) or cfg.max_user_connections
        rows.append((name, pool_size, "", entry.pool_mode if entry else None, max_conn,
                     pooler.servers_per_user.get(name, 0), 0, clients_per_user.get(name, 0)))
    return result(
        "ssssiiii",
        "name pool_size reserve_pool_size pool_mode max_user_connections current_connections "
        "max_user_client_connections current_client_connections",
        rows,
    )


def show_config(pooler: Pooler) -> ResultSet:
    return result("ssss", "key value default changeable", config_rows(pooler.settings.pooler))


def lists(pooler: Pooler) -> list[tuple[str, int]]:
    """SHOW LISTS' rows; the slab-allocator lists (free_*) are always 0 in pypool."""
    servers = sum(pool.server_count for pool in pooler.pools.values())
    return [
        ("databases", len(database_names(pooler)) + 1),
        ("users", len(user_names(pooler))),
        ("peers", 0),
        ("pools", len(pooler.pools) + 1),
        ("peer_pools", 0),
        ("free_clients", 0),
        ("used_clients", len(pooler.clients)),
        ("login_clients", len(pooler.login_clients)),
        ("free_servers", 0),
        ("used_servers", servers),
        ("dns_names", 0),
        ("dns_zones", 0),
        ("dns_queries", 0),
        ("dns_pending", 0),
    ]


def show_lists(pooler: Pooler) -> ResultSet:
    return result("si", "list items", lists(pooler))


def show_state(pooler: Pooler) -> ResultSet:
    paused = pooler.paused_all
    return result("ss", "key value", [("active", "no" if paused else "yes"),
                                      ("paused", "yes" if paused else "no"),
                                      ("suspended", "no")])


def show_version(pooler: Pooler) -> ResultSet:
    return result("s", "version", [(VERSION,)])


def show_empty(types: str, columns: str) -> Callable[[Pooler], ResultSet]:
    """A SHOW for a PgBouncer feature pypool does not have: the right columns, no rows."""
    return lambda pooler: result(types, columns, [])


SHOWS: dict[str, Callable[[Pooler], ResultSet]] = {
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
    "peers": show_empty("isii", "peer_id host port pool_size"),
    "peer_pools": show_empty("iiiii", "peer_id cl_active_cancel_req cl_waiting_cancel_req "
                                      "sv_active_cancel sv_login"),
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
\tSHOW LISTS|STATE
\tSHOW DNS_HOSTS|DNS_ZONES
\tSHOW STATS|STATS_TOTALS|STATS_AVERAGES|TOTALS
\tSET key = arg
\tRELOAD
\tPAUSE [<db>]
\tRESUME [<db>]
\tDISABLE <db>
\tENABLE <db>
\tRECONNECT [<db>]
\tKILL <db>
\tKILL_CLIENT <client_id>
\tSHUTDOWN
\tSHUTDOWN WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS
\tWAIT_CLOSE [<db>]"""
