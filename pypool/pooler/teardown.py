"""Teardown: a connection that goes, and everything that counted it.

A server that closes (`server_closed`, from its Protocol's connection_lost or a failed
login) leaves its pool's lists and the per-database and per-user counts; its linked client
and the clients queued on its pipeline line get "server conn crashed?", and its pool opens
what it now lacks. A client that closes (`client_closed`) leaves the pooler's sets, its
pool's queue and the cancel keys; the server it held goes back to the pool only when
nothing is owed on it (its transaction ended, no check or SET of the pooler's answering,
no prepared-statement replies to come), after a DISCARD ALL when its session state pinned
it and the server_reset_query when one applies; otherwise the server closes with it.
`close_server` closes a server on purpose (the janitor, the console, a reload), taking an
idle one out of the idle stack first.

The Pooler's methods of the same names hand over to these functions. The links' ends are
cut through net/link_ends.py (a client of a dead server's line loses it just before it is
told); a client's closing is one event, GONE, that ends its link and its own state.

Never forget a connection without its counts (servers_per_db, servers_per_user, the pool's
lists), and never leave a client whose server has closed without an error.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..core.link import LinkEvent, LinkState
from ..core.states import ClientState, ServerEvent, ServerState
from ..net import hidden_queries, link_ends, pipeline
from ..pooling import session_state as ss
from ..protocol import errors
from ..protocol import messages as m
from ..protocol.errors import PoolerError
from . import lifecycle, linking, notifications, replication

if TYPE_CHECKING:
    from ..net.records import ClientRecord, ServerRecord
    from .record import PoolerRecord as Pooler

log = logging.getLogger("pypool")


def server_closed(pooler: Pooler, server: ServerRecord, reason: str) -> None:
    """Forget a server that is gone; its client, if it had one, gets an error."""
    if server.state is ServerState.CLOSED:
        return
    server.on(ServerEvent.CLOSED)
    if server.trace is not None:
        server.trace.server_gone(server)
    pool = server.pool
    pool.forget(server)
    server.statements.close()
    pooler.servers_per_db[pool.database] = pooler.servers_per_db.get(pool.database, 1) - 1
    pooler.servers_per_user[pool.user] = pooler.servers_per_user.get(pool.user, 1) - 1
    if replication.is_dedicated(server):
        replication.server_closed(pooler, server, reason)  # its client goes, unfailed
    if server.checking and server.client is not None:
        # It died under server_check_query, before any of its client's requests.
        server.backend.checking = False
        linking.check_failed(pooler, server, server.client, reason)
    line = link_ends.unlink_line(server)
    server.chain = ()
    for client in line:
        link_ends.lose_server(client)
        pool.stats.count_error("server_conn_crashed")
        client.fail(PoolerError("server conn crashed?", errors.PROTOCOL_VIOLATION))
    if pooler.settings.pooler.log_disconnections and not reason.startswith("login failed"):
        log.info("%r: closing because: %s", server, reason)
    pooler.launch_servers(pool)


def close_server(pooler: Pooler, server: ServerRecord, reason: str) -> None:
    """Close a server; an idle one is taken out of the idle stack first, so no client is
    handed a closing server before its connection_lost arrives."""
    if server.state is ServerState.IDLE:
        server.pool.forget(server)
    server.close(reason)


def client_closed(pooler: Pooler, client: ClientRecord, reason: str) -> None:
    if client.state is ClientState.CLOSED:
        return
    if pooler.txlog is not None:
        pooler.txlog.client_closed(client, reason)  # mid-transaction, or while waiting
    if client.trace is not None:
        client.trace.client_gone(client)
    # Whether its requests were waiting for a check or SET on its server (whose replies
    # would be taken for the next client's), before its link ends.
    setting = client.link.state is LinkState.SETTING
    client.on_link(LinkEvent.GONE)  # and its own state CLOSED with it (net/client.py)
    pooler.clients.discard(client)
    pooler.login_clients.discard(client)
    pooler.client_counts.forget(client)
    pooler.cancel_keys.pop(client.cancel_key, None)
    pool = client.pool
    if pool is not None:
        pool.clients.discard(client)
        pool.unqueue(client)
        if pool.listening is not None:
            notifications.gone(pooler, client)  # its channels, if no one else's, go
        if client in pool.awaiting_params:
            pool.awaiting_params.remove(client)
    if replication.involved(pooler, client.pool):
        replication.client_closed(pooler, client)  # its own server goes with it
    server = client.server
    if server is not None and (server.chain or server.client is not client
                               or pipeline.skipped_in_line(client)):
        # In a pipeline: its requests are on the server, between others'. It keeps its
        # place until its replies have gone by (net/pipeline.py), unless a segment of it
        # will never end. So does one refused by its guard: only a ReadyForQuery is left.
        if client.ledger.unsynced:
            server.close("client disconnected with a query in progress")
    elif server is not None:
        link_ends.unlink(client, server)
        server.resume_reading()
        # A check or SET the pooler sent for this client may still be answering: its
        # replies and ParameterStatus would be taken for the next client's.
        clean = (client.reader.done_with_server() and client.tx_status == m.TX_IDLE
                 and not setting and not server.checking)
        if clean and not server.statements.detach():
            clean = False  # prepared-statement replies still owed: see release()
        why = "client disconnected with a transaction or query in progress"
        session = client.session
        if clean and session is not None and session.pins:
            # Pinned (pooling/session_state.py): what pinned it goes before anyone else
            # has the server; a LOADed library cannot be unloaded.
            if ss.LOAD in session.pins:
                clean, why = False, "its client LOADed a library, which stays loaded"
            else:
                hidden_queries.send_hidden_query(server, "DISCARD ALL")
                server.session_sets = None
        if clean:
            cfg = pooler.settings.pooler
            assert pool is not None
            if cfg.server_reset_query and (
                pool.limits.pool_mode == "session" or cfg.server_reset_query_always
            ):
                hidden_queries.send_hidden_query(server, cfg.server_reset_query)
            linking.server_available(pooler, server)
        else:
            server.close(why)
    if client.statements is not None:
        client.statements.close()
    if pooler.settings.pooler.log_disconnections and client.user:
        log.info("%r: closing because: %s", client, reason)
    lifecycle.maybe_exit(pooler)
