"""Replication clients: a server of their own for their whole session, whatever pool_mode.

A client whose StartupMessage sets `replication` (protocol/replication.py) wants a
walsender. A walsender cannot be shared: its session is the replication stream, and a
physical one even refuses SET and every SQL statement. So, as PgBouncer 1.23+ does, such a
client is never handed a pooled server. Once authenticated it waits in its pool's
replication queue (`Pool.replication_waiting`, first come first served) for room under
pool_size and max_db_connections / max_user_connections, the limits every server of the
pool counts against; a full pool makes room by evicting its longest-idle ordinary server
("evicted"), or the next one freed when the replication client came before the pool's
ordinary waiters (`claim_freed`). Then a dedicated server is opened with the client's
`replication` value, its session settings and its `options` in the StartupMessage
(`Replication.pending` pairs the two during the login). Once that server has logged in,
the client gets its welcome with the server's own ParameterStatus and a pooler-issued
cancel key, the two are linked (SHOW CLIENTS/SERVERS, cancel; the ends set by
net/link_ends.py, as for any link, and cut by it when the pair ends) and their transports are
joined byte for byte (net/replication_pipe.py): no reset query, no prepared-statement
rewriting, no session-state tracking, no server_check_query, no connect_query.

The pair ends together: the client leaving closes its server ("replication client
disconnected"), which is never reused, and the server going closes its client. A failed
login ("login failed", the server's error in the log) fails that client alone: replication
needs permissions ordinary logins do not (the REPLICATION attribute, a `replication` line in
pg_hba.conf), so it says nothing about the pool's other logins. RECONNECT and a changed
[databases] entry close dedicated servers at once: they are not released at any point where
they could be replaced.

It owns the queues (each in its pool) and the pairs; the counts (servers_per_db,
servers_per_user, the pool's lists) stay the Pooler's, kept by its usual paths.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from ..core.link import LinkEvent
from ..core.states import ClientEvent, ClientState, ServerEvent, ServerState
from ..net import link_ends
from ..net.replication_pipe import CLIENT, ReplicationPipe
from ..net.socket_options import widen_for_streaming
from ..protocol import errors
from ..protocol import messages as m
from ..protocol import replication as rep
from ..protocol.errors import PoolerError
from .replication_state import Replication

if TYPE_CHECKING:
    from ..net.records import ClientRecord, ServerRecord
    from ..pooling.pool import Pool
    from ..settings import DatabaseEntry
    from .record import PoolerRecord as Pooler

log = logging.getLogger("pypool")

# PgBouncer's reasons, in its words.
CLIENT_GONE = "replication client disconnected"
EVICTED = "evicted"
LOGIN_FAILED = "login failed"


def kind_of(client: ClientRecord) -> str:
    return rep.kind_or_none(client.startup_params)


def is_dedicated(server: ServerRecord) -> bool:
    """Whether `server` was opened for one replication client (never pooled)."""
    return "replication" in server.startup_params


def wants_own_server(client: ClientRecord) -> bool:
    return client.admin is None and kind_of(client) != rep.NONE


# --- a replication client arrives and waits for room ----------------------------------------


def client_authenticated(pooler: Pooler, client: ClientRecord, pool: Pool) -> None:
    """Queue the client for a dedicated server (its welcome waits for that server)."""
    if pool.replication_waiting is None:
        pool.replication_waiting = deque()
    pool.replication_waiting.append(client)
    launch(pooler, pool)


def involved(pooler: Pooler, pool: Pool | None) -> bool:
    """Whether a replication client waits in `pool` or has a server (or one logging in):
    only then is there anything for this module's hooks to do."""
    return pooler.replication.in_use() or (
        pool is not None and pool.replication_waiting is not None)


def launch(pooler: Pooler, pool: Pool) -> None:
    """Open dedicated servers for the pool's queued replication clients while there is room
    (making it by eviction), and close dedicated servers that RECONNECT or a changed entry
    marked. Called wherever the pool's servers may be launched (Pooler.launch_servers)."""
    state = pooler.replication
    if state.pipes:
        # Each pipe is listed under both of its ends, and a close takes it out of `pipes`.
        tagged = [pipe.server for end, pipe in state.pipes.items() if end is pipe.server
                  and pipe.server.pool is pool and pipe.server.close_needed]
        for server in tagged:
            server.close("database configuration changed")
    queue = pool.replication_waiting
    if queue is None:
        return
    now = pooler.now()
    wait_limit = pool.limits.query_wait_timeout
    while queue and (queue[0].state is not ClientState.WELCOME
                     or (wait_limit and now - queue[0].state_since > wait_limit)):
        client = queue.popleft()
        if client.state is ClientState.WELCOME:
            pool.stats.count_error("query_wait_timeout")
            client.fail(PoolerError("query_wait_timeout"))
    if pooler.shutting_down == "SIGINT":  # as the pool's other queued clients
        while queue:
            client = queue.popleft()
            if client.state is ClientState.WELCOME:
                client.fail(errors.shutting_down())
    if not queue:
        pool.replication_waiting = None
        return
    if pool.paused or pooler.shutting_down == "now":
        return
    entry = pooler.settings.database(pool.database) or pooler.retired.get(pool.database)
    if entry is None:
        return
    while queue:
        if not _room(pooler, pool, entry) and not _evict(pooler, pool, entry):
            return
        if not queue:  # the eviction's close launched for them already
            break
        client = queue.popleft()
        if client.state is ClientState.WELCOME:
            _open_for(pooler, pool, entry, client)
    pool.replication_waiting = None


def claim_freed(pooler: Pooler, pool: Pool, server: ServerRecord) -> bool:
    """A server of the pool is free while replication clients wait for room: when the oldest
    of them came before the oldest ordinary waiter, the server is closed to make that room
    (as PgBouncer hands no server past a replication client at the head of its queue), and
    True. Called by linking.server_available before it hands the server on."""
    queue = pool.replication_waiting
    if not queue:
        return False
    first = queue[0]
    if first.state is not ClientState.WELCOME:
        return False  # gone: the next launch drops it
    if pool.waiting and pool.waiting[0].wait_start < first.state_since:
        return False
    pooler.close_server(server, EVICTED)
    pooler.server_closed(server, EVICTED)  # its room is taken at once (launch_servers)
    return True


def _room(pooler: Pooler, pool: Pool, entry: DatabaseEntry) -> bool:
    """Whether one more server fits the pool and the database's and user's caps."""
    if pool.server_count >= pool.limits.pool_size:
        return False
    room_db, room_user = pooler.cap_room(pool, entry)
    return (room_db is None or room_db > 0) and (room_user is None or room_user > 0)


def _evict(pooler: Pooler, pool: Pool, entry: DatabaseEntry) -> bool:
    """Close an idle ordinary server to make room, as PgBouncer's evict_pool_connection
    (this pool's longest-idle one, which frees a place under every cap) and
    evict_connection (another pool's, under the same exhausted database or user cap).
    False when there is none to close."""
    if pool.idle:
        victim = pool.idle[0]  # the idle stack's bottom: idle the longest
        pooler.close_server(victim, EVICTED)
        pooler.server_closed(victim, EVICTED)  # its room counts now, not at connection_lost
        return True
    if pool.server_count >= pool.limits.pool_size:
        return False
    room_db, room_user = pooler.cap_room(pool, entry)
    return pooler.evict_idle(pool, same_db=room_db is not None and room_db <= 0,
                             same_user=room_user is not None and room_user <= 0)


def _open_for(pooler: Pooler, pool: Pool, entry: DatabaseEntry,
              client: ClientRecord) -> None:
    kind = kind_of(client)
    log.debug("%r: opening a %s replication connection", client, kind)
    startup = rep.server_startup(kind, client.startup_params, client.params,
                                 pooler.entry_startup(entry))
    server = pooler.open_server(pool, entry, startup)
    state = pooler.replication
    state.pending[server] = client
    state.pending_for[client] = server


# --- the dedicated server's login ---------------------------------------------------------


def server_logged_in(pooler: Pooler, server: ServerRecord) -> None:
    """The dedicated server is up: welcome its client and join the two."""
    state = pooler.replication
    client = state.pending.pop(server, None)
    if client is not None:
        state.pending_for.pop(client, None)
    if client is None or client.state is not ClientState.WELCOME:
        server.close("replication client was closed")
        return
    pool = server.pool
    if pooler.settings.pooler.log_connections:
        log.info("%r: new server connection (%s replication)", server, kind_of(client))
    now = pooler.now()
    pool.logged_in(server)
    server.on(ServerEvent.FREED)
    server.on(ServerEvent.LINKED)
    server.request_time = now
    link_ends.link(client, server)
    statuses = b"".join(m.parameter_status(name, value)
                        for name, value in server.params.items())
    client.write(b"".join((m.authentication(m.AUTH_OK), statuses,
                           m.backend_key_data(*client.cancel_key), m.ready_for_query())))
    client.on(ClientEvent.WELCOMED, now)
    client.on_link(LinkEvent.LINKED, now)
    client.link_time = now
    pool.stats.server_assignment_count += 1
    held = client.reader.take_partial()
    pipe = ReplicationPipe(client, server, pool.stats,
                           lambda joined, side, exc: _pipe_lost(pooler, joined, side))
    state.pipes[client] = state.pipes[server] = pipe
    for transport in (client.transport, server.transport):
        if transport is not None:
            widen_for_streaming(transport.get_extra_info("socket"), pooler.settings.pooler)
    pipe.start(held)
    # The login list no longer holds it: ordinary clients queued meanwhile may need a
    # server of their own now (Pool.servers_wanted counts logins as coming their way).
    pooler.launch_servers(pool)


def login_failed(pooler: Pooler, server: ServerRecord, text: str,
                 fields: dict[str, str]) -> None:
    """The dedicated server's connect or login failed (server_logins.login_failed has
    logged and counted it; `fields` are its error's): its client alone is told, "login
    failed". No login error is cached for the pool."""
    state = pooler.replication
    client = state.pending.pop(server, None)
    if client is not None:
        state.pending_for.pop(client, None)
    server.close(f"{LOGIN_FAILED}: {text}")
    pooler.server_closed(server, f"{LOGIN_FAILED}: {text}")
    if client is None:
        return  # its client left first, and closed it
    cfg = pooler.settings.pooler
    if cfg.log_disconnections:
        log.info("%r: closing because: %s (age=%ds)", server, LOGIN_FAILED,
                 pooler.now() - server.connect_time)
    if client.state is ClientState.CLOSED:
        return
    transport = client.transport
    reason = f"{LOGIN_FAILED} (age={int(pooler.now() - client.connect_time)}s)"
    pooler.client_closed(client, reason)  # logged before the client reads the error
    if transport is not None:
        transport.write(m.error_response(LOGIN_FAILED,
                                         fields.get("C") or errors.PROTOCOL_VIOLATION,
                                         "FATAL"))
        transport.close()


# --- the end of a pair ----------------------------------------------------------------------


def _unjoin(state: Replication, pipe: ReplicationPipe) -> None:
    """Forget a joined pair, from either end: neither is linked to the other any more."""
    state.pipes.pop(pipe.client, None)
    state.pipes.pop(pipe.server, None)
    link_ends.unlink(pipe.client, pipe.server)


def client_closed(pooler: Pooler, client: ClientRecord) -> None:
    """The client is going (Pooler.client_closed, before it looks at the client's server):
    its dedicated server goes too, and is never handed on."""
    state = pooler.replication
    pool = client.pool
    if pool is not None:
        queue = pool.replication_waiting
        if queue is not None and client in queue:
            queue.remove(client)
            if not queue:
                pool.replication_waiting = None  # so that involved() is false again
    server = state.pending_for.pop(client, None)
    if server is not None:
        state.pending.pop(server, None)
        server.close(CLIENT_GONE)
        return
    pipe = state.pipes.get(client)
    if pipe is None:
        return
    server = pipe.server
    _unjoin(state, pipe)
    server.close_reason = server.close_reason or CLIENT_GONE
    pipe.close_server()  # the client's transport is closed by whoever closes the client


def server_closed(pooler: Pooler, server: ServerRecord, reason: str) -> None:
    """The server is gone (Pooler.server_closed, before it fails the server's client): a
    joined client is closed after what the server sent; a client whose server could not
    even be connected to (a host list's next host is tried) waits for the next one."""
    state = pooler.replication
    client = state.pending.get(server)
    if client is not None:
        if server.transport is None and client.state is ClientState.WELCOME:
            del state.pending[server]
            state.pending_for.pop(client, None)
            pool = client.pool
            assert pool is not None
            if pool.replication_waiting is None:
                pool.replication_waiting = deque()
            pool.replication_waiting.appendleft(client)
        return  # else its login failed: login_failed tells the client
    pipe = state.pipes.get(server)
    if pipe is None:
        return
    client = pipe.client
    _unjoin(state, pipe)
    pipe.close()
    if client.state is not ClientState.CLOSED:
        pooler.client_closed(client, f"server closed the connection ({reason})"
                             if reason else "server closed the connection")


def _pipe_lost(pooler: Pooler, pipe: ReplicationPipe, side: str) -> None:
    """One side of a joined pair closed (the pipe closes the other): the pooler's
    bookkeeping for that side; the hooks above take care of its partner."""
    if side == CLIENT:
        if pipe.client.state is not ClientState.CLOSED:
            pooler.client_closed(pipe.client, "client sent Terminate" if pipe.terminated
                                 else "client closed the connection")
    elif pipe.server.state is not ServerState.CLOSED:
        pooler.server_closed(pipe.server, pipe.server.close_reason
                             or "server closed the connection")
