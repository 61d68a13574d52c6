"""Opening servers: when a pool needs more, how one is opened and logged in, and what a
failed login means for the pool's clients.

`launch_servers` decides how many servers a pool opens now: for its waiting clients, its
min_pool_size and the reserve pool (the sans-IO Pool's `servers_wanted`), within
max_db_connections and max_user_connections, evicting another pool's idle server when only
those caps stand in the way (PgBouncer's launch_new_connection and evict_connection), and not
before server_login_retry after a failed login. `open_server` makes the ServerRecord and
`_connect` connects it and waits for its login (net/server_login.py, core/server_login.py).
A login that fails (`login_failed`) is cached on the pool for server_login_retry; when the
server refused it, the clients that waited for it get the server's own error, and so do those
queued with no server left to serve them; when there was no server to talk to (connect
refused or timed out, closed during the login), they keep waiting for the next try, as
PgBouncer's. New clients get PgBouncer 1.25's cached error at once (`login_failing`). A login
that succeeds (`server_logged_in`) gives the pool its server parameters and the server to the
first waiting client (pooler/linking.py). Replication servers, dedicated to one client, go to
pooler/replication.py instead.

The Pooler's methods of the same names hand over to these functions.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import TYPE_CHECKING, Final

from ..core.server_login import ServerLoginError
from ..core.states import ClientState, ServerState
from ..net import hidden_queries
from ..net.server import ServerConnection
from ..protocol import errors
from ..protocol import messages as m
from ..protocol.errors import PoolerError
from . import linking, replication

if TYPE_CHECKING:
    from ..net.records import ServerRecord
    from ..pooling.pool import Pool
    from ..settings import DatabaseEntry
    from .record import PoolerRecord as Pooler

log = logging.getLogger("pypool")

# Room under a cap that is not set.
NO_CAP: Final = 1 << 30


def launch_servers(pooler: Pooler, pool: Pool) -> None:
    """Open the servers `pool` needs now, as the module docstring says."""
    if replication.involved(pooler, pool):
        replication.launch(pooler, pool)  # dedicated servers first: their clients came first
    if pool.paused or pooler.shutting_down == "now":
        return
    if pooler.handing_over and not pool.waiting and not pool.awaiting_params:
        return  # -R: the new process opens the servers from now on; only waiters get one
    now = pooler.now()
    if pool.login_error is not None:
        if now - pool.login_error[1] < pooler.settings.pooler.server_login_retry:
            return
    cfg = pooler.settings.pooler
    entry = pooler.settings.database(pool.database) or pooler.retired.get(pool.database)
    if entry is None:
        return
    capped_db, capped_user = cap_room(pooler, pool, entry)
    max_db, max_user = capped_db is not None, capped_user is not None
    room_db = NO_CAP if capped_db is None else capped_db
    room_user = NO_CAP if capped_user is None else capped_user
    oldest = pool.waiting[0].wait_start if pool.waiting else None
    lined = 0
    if cfg.pipeline_depth:
        # Clients queued on busy servers' lines wait as much as those in the queue.
        for busy in pool.active:
            for client in busy.chain:
                lined += 1
                if oldest is None or client.wait_start < oldest:
                    oldest = client.wait_start
    if (max_db or max_user) and oldest is None and not pool.awaiting_params and (
            _starving(pooler, pool, max_db, max_user)):
        # Only min_pool_size wants servers here, and a pool sharing the cap has clients
        # waiting: the room is theirs (refilling here would take it back from them each
        # time an idle server is evicted for them, and they would wait forever).
        return
    wanted = pool.servers_wanted(now, oldest, room_db, room_user, lined)
    if not wanted and min(room_db, room_user) <= 0 and pool.servers_wanted(
        now, oldest, NO_CAP, NO_CAP, lined
    ):
        # Only max_db_connections / max_user_connections stand in the way: as PgBouncer
        # (evict_connection), close another pool's idle server to make room, or an idle
        # pool would starve a busy one forever.
        if evict_idle(pooler, pool, same_db=room_db <= 0, same_user=room_user <= 0):
            launch_servers(pooler, pool)
        return
    for _ in range(wanted):
        _open_server(pooler, pool, entry)


def cap_room(pooler: Pooler, pool: Pool, entry: DatabaseEntry) -> tuple[int | None, int | None]:
    """How many more servers the database's and the user's caps allow (max_db_connections
    and max_user_connections, the entry's or the global one; 0 or less: full), None where
    there is no cap. Every server of the pools they cover counts, dedicated ones too."""
    cfg = pooler.settings.pooler
    room_db = room_user = None
    max_db = entry.max_db_connections or cfg.max_db_connections
    if max_db:
        room_db = max_db - pooler.servers_per_db.get(pool.database, 0)
    user_entry = pooler.settings.users.get(pool.user)
    max_user = (user_entry and user_entry.max_user_connections) or cfg.max_user_connections
    if max_user:
        room_user = max_user - pooler.servers_per_user.get(pool.user, 0)
    return room_db, room_user


def _starving(pooler: Pooler, pool: Pool, same_db: bool, same_user: bool) -> bool:
    """Whether another pool under the same max_db_connections (or max_user_connections)
    has clients waiting for a server."""
    for other in pooler.pools.values():
        if other is pool or not (other.waiting or other.awaiting_params):
            continue
        if (same_db and other.database == pool.database) or (
                same_user and other.user == pool.user):
            return True
    return False


def evict_idle(pooler: Pooler, pool: Pool, same_db: bool, same_user: bool) -> bool:
    """Close the longest-idle server of another pool under the same exhausted cap."""
    candidates = [
        server
        for other in pooler.pools.values()
        if other is not pool
        and (not same_db or other.database == pool.database)
        and (not same_user or other.user == pool.user)
        for server in other.idle
    ]
    if not candidates:
        return False
    victim = min(candidates, key=lambda server: server.request_time)
    victim.close("evicted to make room for another pool")
    pooler.server_closed(victim, "evicted to make room for another pool")
    return True


def _open_server(pooler: Pooler, pool: Pool, entry: DatabaseEntry) -> None:
    if pool.server_count >= pool.limits.pool_size and pool.waiting:
        log.info("%s/%s: taking connection from reserve_pool", pool.database, pool.user)
    open_server(pooler, pool, entry, entry_startup(pooler, entry))


def entry_startup(pooler: Pooler, entry: DatabaseEntry) -> dict[str, str]:
    """The StartupMessage parameters a [databases] entry gives its servers."""
    startup: dict[str, str] = {}
    if entry.application_name:
        startup["application_name"] = entry.application_name
    for key, name in (("client_encoding", "client_encoding"), ("datestyle", "DateStyle"),
                      ("timezone", "TimeZone")):
        value = getattr(entry, key)
        if value:
            startup[name] = value
    return startup


def open_server(pooler: Pooler, pool: Pool, entry: DatabaseEntry,
                startup: dict[str, str]) -> ServerRecord:
    """Open a server of `pool` that logs in with `startup`, counted from now on."""
    server = ServerConnection(
        pooler, pool, pooler.hosts.pick(entry), entry.port, entry.server_dbname,
        pooler.credentials_for(entry, pool.user), startup,
    )
    pool.login.add(server)
    pooler.servers_per_db[pool.database] = pooler.servers_per_db.get(pool.database, 0) + 1
    pooler.servers_per_user[pool.user] = pooler.servers_per_user.get(pool.user, 0) + 1
    pooler.spawn(_connect(pooler, server, entry))
    return server


async def _connect(pooler: Pooler, server: ServerRecord, entry: DatabaseEntry) -> None:
    timeout = pooler.settings.pooler.server_connect_timeout or None
    try:
        async with asyncio.timeout(timeout):
            transport, _ = await pooler.loop.create_connection(lambda: server, server.host,
                                                               server.port)
            if pooler.settings.pooler.log_connections:
                local = transport.get_extra_info("sockname") or ("", 0)
                log.info("%r new connection to server (from %s:%s)", server, local[0],
                         local[1])
            pooler.hosts.connected(entry)
            await server.ready
    except ServerLoginError as exc:
        login_failed(pooler, server, exc.args[0], exc.error, unreachable=exc.unreachable)
    except (OSError, TimeoutError) as failure:  # own name: mypyc types `exc` above
        if server.state is ServerState.CONNECTING and pooler.hosts.failed(entry):
            # Another host of the list is next: close this one and open the next now.
            pooler.server_closed(server, _connect_failure(failure))
            return
        reason = "server connect timeout" if isinstance(failure, TimeoutError) else str(failure)
        text = f"server connection failed: {reason}"
        login_failed(pooler, server, text, m.error_response(text, "08006", "FATAL"),
                     f"{_connect_failure(failure)} ({reason})", unreachable=True)


def login_failed(pooler: Pooler, server: ServerRecord, text: str, error: bytes,
                 closing: str = "", unreachable: bool = False) -> None:
    """A server's connect or login failed: the pool's clients are told (see below).
    `closing`: the server's "closing because" reason, when not `text` (a connect that
    failed, in PgBouncer's words: "connect failed", "connect timeout"); `unreachable`: no
    server to talk to (connect refused or timed out, closed during the login)."""
    fields = m.parse_error_fields(error[5:])
    if replication.is_dedicated(server):
        # Its own client alone is told; unless that client left during the login and closed
        # the server itself: then nothing failed.
        if server in pooler.replication.pending:
            _log_failure(server, text, fields)
        replication.login_failed(pooler, server, text, fields)
        return
    _log_failure(server, text, fields)
    pool = server.pool
    pool.login_error = (error, pooler.now())
    server.close(f"login failed: {text}")
    pooler.server_closed(server, f"login failed: {text}")
    if pooler.settings.pooler.log_disconnections:
        log.info("%r: closing because: %s", server, closing or text)  # PgBouncer's 2nd line
    if unreachable or fields.get("C") == errors.CANNOT_CONNECT_NOW:
        # No server to talk to (connect refused or timed out, closed during the login), or
        # "the database system is starting up" (or shutting down, in recovery): no verdict
        # on the login itself. As PgBouncer, the clients already queued keep waiting, for
        # the next try after server_login_retry (the janitor's) or for query_wait_timeout /
        # query_timeout; a server back within that serves them. New clients, after a
        # connect failure, get the cached error at once (`login_failing`).
        return
    # The server refused the login (its ErrorResponse; the pooler's own: no usable
    # password, a bad login message, TLS refused or a certificate that does not verify):
    # the clients waiting for this login get that error at once, rather than a timeout
    # that names nothing; so do those queued when no server is left to serve them (they
    # would wait query_wait_timeout for a login that fails the same way).
    stranded = list(pool.awaiting_params)
    pool.awaiting_params.clear()
    if not _has_usable_server(pool):
        stranded += [client for client in pool.waiting if client.state is ClientState.WAITING]
        pool.waiting.clear()
    for client in stranded:
        # "closing because: <the server's message>", logged before the client reads it.
        transport = client.transport
        if client.state is ClientState.CLOSED:
            continue
        pooler.client_closed(client, text)
        if transport is not None:
            transport.write(error)
            transport.close()


def _log_failure(server: ServerRecord, text: str, fields: dict[str, str]) -> None:
    """As PgBouncer logs a failed login: an error the server sent with its severity (FATAL
    database "x" does not exist); the pooler's own (08P01, 08006: connect, TLS, protocol)
    as they are. Counted in the pool's errors."""
    severity = fields.get("S", "") if fields.get("C") not in ("08P01", "08006") else ""
    log.warning("%r: server login failed: %s%s", server, f"{severity} " if severity else "",
                text)
    server.pool.stats.count_error("server_login_failed")


def server_logged_in(pooler: Pooler, server: ServerRecord) -> None:
    if replication.is_dedicated(server):
        replication.server_logged_in(pooler, server)  # joined to its client, never pooled
        return
    pool = server.pool
    pool.login_error = None
    if pool.server_params is None:
        pool.server_params = dict(server.params)
    if pooler.settings.pooler.log_connections:
        log.info("%r: new server connection", server)
    waiting_for_params, pool.awaiting_params = pool.awaiting_params, []
    for client in waiting_for_params:
        if client.state is ClientState.WELCOME:
            client.welcome(pool.server_params)
    entry = pooler.settings.database(pool.database) or pooler.retired.get(pool.database)
    if entry is not None and entry.connect_query:
        # Before any client: its replies are hidden, the first client's requests follow.
        hidden_queries.send_hidden_query(server, entry.connect_query)
    pool.logged_in(server)
    linking.server_available(pooler, server)


def login_failing(pooler: Pooler, pool: Pool) -> PoolerError | None:
    """The error for a client that needs a server while the pool's logins are failing
    and it has none to serve with (PgBouncer 1.25): at once, rather than after
    query_wait_timeout; None when the pool may serve."""
    failed = pool.login_error
    if failed is None or _has_usable_server(pool):
        return None
    if pooler.now() - failed[1] >= pooler.settings.pooler.server_login_retry:
        return None
    fields = m.parse_error_fields(failed[0][5:])
    if fields.get("C") == errors.CANNOT_CONNECT_NOW:
        return None  # passing (see login_failed): wait for the next try instead
    return PoolerError(
        f"server login has been failing, cached error: {fields.get('M', '')} "
        "(server_login_retry)"
    )


def _has_usable_server(pool: Pool) -> bool:
    """Whether a server of the pool may still serve its queue: one that is not being
    replaced (RECONNECT, a changed [databases] entry: `close_needed`), as PgBouncer counts
    a dirty pool's servers as gone when a login fails (kill_pool_logins)."""
    return any(not server.close_needed and not replication.is_dedicated(server)
               for server in pool.servers())


def _connect_failure(failure: Exception) -> str:
    """PgBouncer's words for a connect that failed before any byte was exchanged."""
    if isinstance(failure, TimeoutError):
        return "connect timeout"
    if isinstance(failure, socket.gaierror):
        return "server DNS lookup failed"
    return "connect failed"
