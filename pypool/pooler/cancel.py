"""Cancel: a client's CancelRequest, forwarded to the server it holds.

Clients are given pooler-issued cancel keys at login (objects.py); a CancelRequest carrying
one is sent on a connection of its own to PostgreSQL with the server's real key. It owns the
server's `cancels_in_flight` count: while a cancel is on its way the server is handed to no
one else, since a cancel landing late would hit the next client's query. A key another
peer or worker issued is passed on to it first (peers.py).

Never forward a cancel that could land on another client's query: one from a client queued
behind another in a pipeline, or from the head of a line with others queued behind it, is
dropped; a server whose cancel did not complete is closed, never handed on.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ..core.states import ServerState
from ..protocol import messages as m
from . import linking, peers, takeover

if TYPE_CHECKING:
    from ..net.records import ServerRecord
    from .record import PoolerRecord as Pooler

log = logging.getLogger("pypool")


def forward_cancel(pooler: Pooler, pid: int, secret: int) -> None:
    """A CancelRequest: to the peer or worker that issued its key (peers.py), else here."""
    key = peers.route(pooler, pid, secret)
    if key is not None:
        cancel_here(pooler, *key)


def cancel_here(pooler: Pooler, pid: int, secret: int) -> None:
    """A CancelRequest with a key this process issued goes to the server that client holds.

    Until PostgreSQL has taken the cancel (it closes the cancel connection once it has
    signalled the backend), the server is handed to no one else, or the cancel could hit
    the next client's query (server_available parks it in Pool.being_canceled)."""
    client = pooler.cancel_keys.get((pid, secret))
    if client is None and pooler.taken is not None:
        # -R under way: the key may be a client the old process has not passed yet.
        takeover.pass_back_cancel(pooler, pid, secret)
        return
    if client is None or client.server is None:
        return
    server = client.server
    if server.client is not client:
        # Queued in a pipeline: any query it might hit is another client's (pipeline.py).
        log.info("%r: cancel request dropped: its query is queued behind another's", client)
        return
    if server.chain:
        # Others' queries are already on the wire behind this one: landing a moment after
        # it ends, the cancel would hit theirs. Dropped (pipelining is opt-in, and says so).
        log.info("%r: cancel request dropped: other clients' queries are queued behind it",
                 client)
        return
    server.cancels_in_flight += 1
    pooler.spawn(_send_cancel(pooler, server))


async def _send_cancel(pooler: Pooler, server: ServerRecord) -> None:
    timeout = pooler.settings.pooler.cancel_wait_timeout or None
    landed = False
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(server.host, server.port)
            try:
                writer.write(m.cancel_request(server.backend_pid, server.backend_secret))
                await writer.drain()
                await reader.read()  # PostgreSQL closes it once the backend is signalled
                landed = True
            finally:
                writer.close()
    except (OSError, TimeoutError) as failure:
        log.warning("%r: cancel request failed: %s", server,
                    "cancel_wait_timeout" if isinstance(failure, TimeoutError) else failure)
    server.cancels_in_flight -= 1
    if server.cancels_in_flight or server.state is ServerState.CLOSED:
        return
    if not landed:
        # It may still land, on whoever has the server by then: never hand it on.
        pooler.close_server(server, "cancel request did not complete")
    elif server in server.pool.being_canceled:
        server.pool.unpark(server)
        linking.server_available(pooler, server)
