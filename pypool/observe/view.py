"""The pooler as the console and the metrics see it: read-only, plain data, taken on demand.

`PoolerView` wraps the running pooler (anything shaped like `PoolerState`, the Protocol
below) and answers with fresh snapshots: frozen dataclasses of numbers and strings, never a
connection object. SHOW rows (admin/show.py) and Prometheus metrics (metrics.py) are built
from these and from nothing else, so neither can change the pooler and the two cannot drift
apart. A snapshot is taken when a SHOW or a scrape asks for one; nothing here runs on the hot
path, which only increments the integers read here.

The view speaks PgBouncer's words for connection states, whatever the network layer calls
them: a client is counted in cl_active (holding a server, or idle) or cl_waiting (queued for
a server, or for its pool's first login), and SHOW CLIENTS says `active`, `idle` or `waiting`
(PgBouncer 1.25's states); a server is `active`, `idle` or `new`
(logging in), as SHOW SERVERS says.

It must never import net/ (the pooler is read through the Protocols here), the console, or
asyncio.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Protocol

from ..pooling import stats as st
from ..pooling.client_limits import ClientCounts
from ..pooling.pool import Pool
from ..pooling.session_state import ClientSession
from ..protocol.replication import kind_or_none
from ..settings import DatabaseEntry, Settings

ADMIN_DB = "pgbouncer"  # the console's database, and its pool pgbouncer/pgbouncer

# The network layer's client state names the view maps to PgBouncer's words.
_WAITING_STATES = frozenset({"WAITING", "WELCOME"})  # cl_waiting; every other one is cl_active
_QUEUED = "WAITING"  # in its pool's queue, waiting for a server (maxwait, wait_us)
_LINKED = "ACTIVE"  # holding a server right now
_CLOSED = "CLOSED"

# PoolStats counters beyond PgBouncer's eleven (stats.COUNTERS), for pypool's own metrics.
EXTRA_COUNTERS = ("pipelined_count", "prepared_hits", "prepared_misses", "prepared_evictions",
                  "session_pinned", "session_refused", "session_synced",
                  "notifications_delivered")


# --- what the view reads: the pooler's shape, not its class -------------------------------


class StateName(Protocol):
    """A connection state: only its name is read."""

    @property
    def name(self) -> str: ...


class ClientSide(Protocol):
    """A client connection as the view reads it."""

    @property
    def id(self) -> int: ...
    @property
    def user(self) -> str: ...
    @property
    def state(self) -> StateName: ...
    @property
    def transport(self) -> Any: ...
    @property
    def peer(self) -> tuple[str, int]: ...
    @property
    def server(self) -> object | None: ...
    @property
    def admin(self) -> object | None: ...
    @property
    def params(self) -> Mapping[str, str]: ...
    @property
    def startup_params(self) -> Mapping[str, str]: ...
    @property
    def connect_time(self) -> float: ...
    @property
    def state_since(self) -> float: ...
    @property
    def wait_start(self) -> float: ...
    @property
    def statements(self) -> object | None: ...
    @property
    def tls_info(self) -> str: ...
    @property
    def session(self) -> ClientSession | None: ...


class PoolerState(Protocol):
    """The running pooler, as far as the view reads it (pooler/objects.py's Pooler is one)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def now(self) -> Callable[[], float]: ...
    @property
    def pools(self) -> Mapping[tuple[str, str], Pool]: ...
    @property
    def clients(self) -> Collection[ClientSide]: ...
    @property
    def login_clients(self) -> Collection[ClientSide]: ...
    @property
    def paused_all(self) -> bool: ...
    @property
    def suspended(self) -> bool: ...
    @property
    def shutting_down(self) -> str: ...
    @property
    def paused_dbs(self) -> AbstractSet[str]: ...
    @property
    def disabled_dbs(self) -> AbstractSet[str]: ...
    @property
    def retired(self) -> Mapping[str, DatabaseEntry]: ...
    @property
    def servers_per_db(self) -> Mapping[str, int]: ...
    @property
    def servers_per_user(self) -> Mapping[str, int]: ...
    @property
    def auth_secrets(self) -> Mapping[str, str]: ...
    @property
    def auth_query_secrets(self) -> Mapping[str, str]: ...
    @property
    def stats_periods(self) -> st.StatsPeriods: ...
    @property
    def client_counts(self) -> ClientCounts: ...
    @property
    def console_queries(self) -> int: ...
    @property
    def console_logins(self) -> int: ...
    @property
    def tls(self) -> Any: ...  # net/tls.Tls: its `handshakes` counts
    # Also read, when present: `txlog`, observe/txlog.py's TxLog or None (off).


def is_closed(connection: Any) -> bool:
    """Whether a connection is gone (the console stops answering a closed client)."""
    return bool(connection.state.name == _CLOSED)


def database_entry(pooler: PoolerState, name: str) -> DatabaseEntry | None:
    """A database's [databases] entry, or the last one of a removed database still in use."""
    return pooler.settings.database(name) or pooler.retired.get(name)


# --- the snapshots ------------------------------------------------------------------------


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class ClientInfo:
    """One client, as a SHOW CLIENTS row reads it. Times are wall-clock seconds."""

    id: int
    user: str
    database: str  # its pool's database; `pgbouncer` on the console
    state: str  # "active" (a server linked), "idle" (none) or "waiting"
    addr: str
    port: int
    local_addr: str
    local_port: int
    connect_time: float
    request_time: float  # when its current state began
    wait_us: int  # how long it has been queued for a server, 0 when it is not
    ptr: str
    link: str  # ptr of the server it holds, "" when none
    application_name: str
    prepared_statements: int
    fd: int = -1  # its socket's file descriptor (SHOW FDS), -1 once closed
    tls: str = ""  # PgBouncer's `tls` column: TLSv1.3/TLS_AES_256_GCM_SHA384, "" plaintext
    pinned: str = ""  # why it keeps its server after its transactions (pooling/session_state/)
    replication: str = "none"  # "physical", "logical" for a replication client


@dataclass(frozen=True)
class ServerInfo:
    """One server connection, as a SHOW SERVERS row reads it. Times are wall-clock seconds."""

    id: int
    user: str
    database: str
    state: str  # "active", "idle" or "new"
    addr: str
    port: int
    local_addr: str
    local_port: int
    connect_time: float
    request_time: float  # when last linked or released
    close_needed: bool
    ptr: str
    link: str  # ptr of the client it serves, "" when none
    remote_pid: int
    application_name: str
    prepared_statements: int
    fd: int = -1
    tls: str = ""
    replication: str = "none"  # "physical", "logical": dedicated to a replication client


@dataclass(frozen=True)
class PoolInfo:
    """One (database, user) pool: its sizes, counts and counters at the moment of asking."""

    database: str
    user: str
    pool_mode: str
    pool_size: int
    counts: PoolCounts
    counters: Mapping[str, int]  # stats.COUNTERS and EXTRA_COUNTERS, by PoolStats name
    older: st.Totals  # stats.COUNTERS at the older stats_period tick (the avg_* base)
    errors: tuple[tuple[str, int], ...]  # by kind, sorted
    # Prometheus' cumulative buckets; waits include the assignments that did not wait.
    wait_buckets: tuple[tuple[str, int], ...]
    xact_buckets: tuple[tuple[str, int], ...]
    # Filled only when asked for (PoolerView.pools(connections=True)).
    clients: tuple[ClientInfo, ...] = ()  # by id
    servers: tuple[ServerInfo, ...] = ()  # active by id, idle most recently used first, new

    @property
    def totals(self) -> st.Totals:
        """PgBouncer's eleven counters, in stats.COUNTERS order."""
        return tuple(self.counters[name] for name in st.COUNTERS)


# --- the view -----------------------------------------------------------------------------


def _ptr(obj: object | None) -> str:
    return f"0x{id(obj):x}" if obj is not None else ""


def _sockname(transport: Any) -> tuple[str, int]:
    name = transport.get_extra_info("sockname") if transport is not None else None
    if isinstance(name, tuple) and len(name) >= 2:
        return str(name[0]), int(name[1])
    return "", 0


def _fd(transport: Any) -> int:
    sock = transport.get_extra_info("socket") if transport is not None else None
    try:
        return int(sock.fileno()) if sock is not None else -1
    except (OSError, ValueError):
        return -1


def _prepared_count(connection: Any) -> int:
    """Protocol-level prepared statements a client has named, or a server holds (as
    PgBouncer counts them); 0 where prepared statements are off."""
    statements = getattr(connection, "statements", None)
    if statements is None:
        return 0
    # A client's ClientStatements names them; a server's ServerStatements keeps them in
    # its cache (pooling/prepared/cache.py).
    cache = getattr(statements, "cache", None)
    return len(getattr(statements, "names", None) or getattr(cache, "lru", None) or ())


class PoolerView:
    """Read-only questions about one pooler, each answered with a fresh snapshot."""

    def __init__(self, pooler: PoolerState) -> None:
        self._pooler = pooler

    # --- settings and switches ------------------------------------------------------------

    def transaction_log_lines(self) -> tuple[int, int] | None:
        """Lines the transaction log has written and dropped; None when it is off."""
        txlog = getattr(self._pooler, "txlog", None)  # a test's stand-in may have none
        return None if txlog is None else (int(txlog.written), int(txlog.dropped))

    def traced_clients(self) -> str | None:
        """Who the protocol trace follows: "all" (`trace = on`), the ids of the clients
        traced now (comma-separated, maybe none), or None when it was never switched on."""
        pooler = self._pooler
        if getattr(pooler, "wire_trace", None) is None:  # a test's stand-in may have none
            return None
        if getattr(pooler, "trace_all", None) is not None:
            return "all"
        return ",".join(sorted(str(client.id) for client in pooler.clients
                               if getattr(client, "trace", None) is not None))

    @property
    def settings(self) -> Settings:
        return self._pooler.settings

    def tls_handshakes(self) -> dict[tuple[str, str], int]:
        """TLS handshakes since start by (side, outcome): ("client" or "server", "ok" or
        "failed")."""
        return dict(self._pooler.tls.handshakes)

    @property
    def paused_all(self) -> bool:
        return self._pooler.paused_all

    @property
    def suspended(self) -> bool:
        return self._pooler.suspended

    @property
    def shutting_down(self) -> bool:
        """SIGINT, SIGTERM or a SHUTDOWN began: the listeners are closed (GET /health)."""
        return bool(self._pooler.shutting_down)

    def paused(self, database: str) -> bool:
        """PAUSE of everything, or of this database (or KILL of it)."""
        return self._pooler.paused_all or database in self._pooler.paused_dbs

    def disabled(self, database: str) -> bool:
        return database in self._pooler.disabled_dbs

    # --- names --------------------------------------------------------------------------

    def database_names(self) -> list[str]:
        """Configured databases (not the `*` fallback), those created through it, and removed
        ones that still have clients."""
        pooler = self._pooler
        names = {name for name in pooler.settings.databases if name != "*"}
        names.update(pool.database for pool in pooler.pools.values())
        return sorted(names)

    def database_entry(self, name: str) -> DatabaseEntry | None:
        return database_entry(self._pooler, name)

    def user_names(self) -> list[str]:
        pooler = self._pooler
        names = set(pooler.auth_secrets) | set(pooler.auth_query_secrets)
        names.update(pooler.settings.users)
        names.update(pool.user for pool in pooler.pools.values())
        names.add(ADMIN_DB)
        return sorted(names)

    # --- counts -------------------------------------------------------------------------

    def servers_of_database(self, name: str) -> int:
        return self._pooler.servers_per_db.get(name, 0)

    def servers_of_user(self, name: str) -> int:
        return self._pooler.servers_per_user.get(name, 0)

    def clients_per_user(self) -> dict[str, int]:
        """Logged-in clients (console ones too) by user name."""
        counts: dict[str, int] = {}
        logging_in = self._pooler.login_clients
        for client in self._pooler.clients:
            if client not in logging_in:
                counts[client.user] = counts.get(client.user, 0) + 1
        return counts

    def clients_of_database(self, name: str) -> int:
        """Clients counted against `name`'s max_db_client_connections (logging in too)."""
        return self._pooler.client_counts.per_database.get(name, 0)

    def clients_of_user(self, name: str) -> int:
        """Clients counted against `name`'s max_user_client_connections."""
        return self._pooler.client_counts.per_user.get(name, 0)

    def client_count(self) -> int:
        """Every client connection, logging in or not (SHOW LISTS used_clients)."""
        return len(self._pooler.clients)

    def login_client_count(self) -> int:
        return len(self._pooler.login_clients)

    def server_count(self) -> int:
        return sum(pool.server_count for pool in self._pooler.pools.values())

    def pool_count(self) -> int:
        return len(self._pooler.pools)

    def peer_pools(self) -> list[tuple[int, int, int, int, int]]:
        """SHOW PEER_POOLS' rows: for each peer a cancel has been forwarded to, peer_id,
        cancels sent (cl_active_cancel_req), queued (cl_waiting_cancel_req), their
        connections (sv_active_cancel) and those still connecting (sv_login)."""
        pools = getattr(self._pooler, "peer_pools", {})  # a test's stand-in may have none
        return [(peer_id, pool.active, len(pool.waiting), pool.active, pool.login)
                for peer_id, pool in sorted(pools.items())]

    def listeners(self) -> list[tuple[str, str, str, int, int, int, int, int, int, int]]:
        """SHOW LISTENERS' rows (listen_mode = shared; pooling/listening.py): for each pool
        whose clients ever LISTENed, its listening connection's state and backend pid, the
        channels it listens on, the channels wanted, the clients that want one, the
        notifications it received and wrote to clients, and the times it was lost."""
        rows = []
        for pool in sorted(self._pooler.pools.values(), key=lambda p: (p.database, p.user)):
            hub = getattr(pool, "listening", None)  # a test's stand-in may have none
            if hub is None:
                continue
            rows.append((pool.database, pool.user, hub.state,
                         hub.backend_pid if hub.connected else 0, len(hub.listened),
                         len(hub.wanted), len(hub.wants), hub.received,
                         pool.stats.notifications_delivered, hub.losses))
        return rows

    # --- pools, clients, servers --------------------------------------------------------

    def pools(self, connections: bool = False) -> list[PoolInfo]:
        """Every pool, sorted by database then user as PgBouncer keeps them; with
        `connections`, each pool's clients and servers too (SHOW CLIENTS, SERVERS)."""
        pooler = self._pooler
        now = pooler.now()
        wall = _wall_offset(now)
        periods = pooler.stats_periods
        found = []
        for pool in sorted(pooler.pools.values(), key=lambda p: (p.database, p.user)):
            stats = pool.stats
            counters = {name: getattr(stats, name) for name in (*st.COUNTERS, *EXTRA_COUNTERS)}
            zero_waits = max(0, stats.server_assignment_count - sum(stats.wait_counts))
            clients: tuple[ClientInfo, ...] = ()
            servers: tuple[ServerInfo, ...] = ()
            if connections:
                clients = tuple(_client(c, pool.database, now, wall)
                                for c in sorted(pool.clients, key=lambda c: c.id))
                servers = tuple(_servers(pool, wall))
            found.append(PoolInfo(
                database=pool.database, user=pool.user, pool_mode=pool.limits.pool_mode,
                pool_size=pool.limits.pool_size, counts=_counts(pool, now), counters=counters,
                older=periods.older(pool), errors=tuple(sorted(stats.errors.items())),
                wait_buckets=tuple(st.cumulative(st.WAIT_BUCKETS, stats.wait_counts,
                                                 zero_waits)),
                xact_buckets=tuple(st.cumulative(st.XACT_BUCKETS, stats.xact_counts)),
                clients=clients, servers=servers,
            ))
        return found

    def console_clients(self) -> list[ClientInfo]:
        """Clients of the admin console, by id; their database shows as `pgbouncer`."""
        pooler = self._pooler
        now = pooler.now()
        wall = _wall_offset(now)
        admins = sorted((c for c in pooler.clients if c.admin is not None), key=lambda c: c.id)
        return [_client(c, ADMIN_DB, now, wall) for c in admins]

    def login_clients(self) -> list[ClientInfo]:
        """Clients still logging in (not yet in a pool nor on the console), by id."""
        pooler = self._pooler
        now = pooler.now()
        wall = _wall_offset(now)
        return [_client(c, "(nodb)", now, wall)
                for c in sorted(pooler.login_clients, key=lambda c: c.id)]

    def console_totals(self) -> st.Totals:
        """The console database's counters: each console query is a transaction and a
        query, as PgBouncer counts its admin pool; nothing else is counted there."""
        queries = self._pooler.console_queries
        logins = self._pooler.console_logins
        return tuple(queries if name in ("xact_count", "query_count")
                     else logins if name == "client_login_count" else 0
                     for name in st.COUNTERS)

    def console_client_count(self) -> int:
        return sum(1 for c in self._pooler.clients if c.admin is not None)

    def averages(self, pools: Sequence[PoolInfo]) -> st.Totals:
        """The avg_* values of a group of pools (one database, or all), as PgBouncer's
        stats.c computes them: from the older stats_period tick to now."""
        periods = self._pooler.stats_periods
        return st.averages(st.add(p.totals for p in pools), st.add(p.older for p in pools),
                           self._pooler.now() - periods.old_stamp)


def _wall_offset(now: float) -> float:
    """What to add to the pooler's monotonic clock to get wall-clock seconds."""
    return time.time() - now


def _counts(pool: Pool, now: float) -> PoolCounts:
    cl_active = cl_waiting = cl_linked = 0
    for client in pool.clients:
        name = client.state.name
        if name in _WAITING_STATES:
            cl_waiting += 1
        else:
            cl_active += 1
            if name == _LINKED:
                cl_linked += 1
    maxwait = 0.0
    for client in pool.waiting:
        if client.state.name == _QUEUED:
            maxwait = max(0.0, now - client.wait_start)
            break
    return PoolCounts(cl_active=cl_active, cl_waiting=cl_waiting, cl_linked=cl_linked,
                      sv_active=len(pool.active), sv_idle=len(pool.idle),
                      sv_login=len(pool.login), sv_being_canceled=len(pool.being_canceled),
                      maxwait=maxwait)


def _client(client: ClientSide, database: str, now: float, wall: float) -> ClientInfo:
    name = client.state.name
    wait_us = int(max(0.0, now - client.wait_start) * 1e6) if name == _QUEUED else 0
    local_addr, local_port = _sockname(client.transport)
    if client.peer[0] == "unix":  # as PgBouncer: both ends are "unix" and the listen port
        local_addr, local_port = client.peer
    return ClientInfo(
        id=client.id, user=client.user, database=database,
        # PgBouncer 1.25's: on the active list, "active" with a server linked, else "idle".
        state=("waiting" if name in _WAITING_STATES
               else "active" if client.server is not None else "idle"),
        addr=client.peer[0], port=client.peer[1], local_addr=local_addr, local_port=local_port,
        connect_time=client.connect_time + wall, request_time=client.state_since + wall,
        wait_us=wait_us, ptr=_ptr(client), link=_ptr(client.server),
        application_name=client.params.get("application_name", ""),
        prepared_statements=_prepared_count(client), fd=_fd(client.transport),
        tls=client.tls_info,
        pinned=client.session.pinned() if client.session is not None else "",
        replication=kind_or_none(client.startup_params),
    )


def _servers(pool: Pool, wall: float) -> list[ServerInfo]:
    # Idle servers most recently used first: the order they will be handed out in.
    found = []
    for state, servers in (("active", sorted(pool.active, key=lambda s: s.id)),
                           ("idle", pool.idle[::-1]),
                           ("new", sorted(pool.login, key=lambda s: s.id))):
        for server in servers:
            local_addr, local_port = _sockname(server.transport)
            found.append(ServerInfo(
                id=server.id, user=pool.user, database=pool.database, state=state,
                addr=server.host, port=server.port, local_addr=local_addr,
                local_port=local_port or server.local_port,
                connect_time=server.connect_time + wall, request_time=server.request_time + wall,
                close_needed=server.close_needed, ptr=_ptr(server),
                link=_ptr(server.client), remote_pid=server.backend_pid,
                application_name=server.params.get("application_name", ""),
                prepared_statements=_prepared_count(server), fd=_fd(server.transport),
                tls=server.tls_info, replication=kind_or_none(server.startup_params),
            ))
    return found


__all__ = [
    "ADMIN_DB",
    "ClientInfo",
    "PoolCounts",
    "PoolInfo",
    "PoolerState",
    "PoolerView",
    "ServerInfo",
    "database_entry",
    "is_closed",
]
