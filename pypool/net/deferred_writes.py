"""Deferred writes to a server: requests held until the end of a round of the event loop.

When waiting clients are pipelined onto a busy server (net/pipeline.py), each of their
requests is found while the loop reads one connection after another. Written at once, each
would be its own write and wake the backend once per client. `send_soon` instead keeps them
in the server's `deferred` list and lists the server in the pooler's `to_flush`; one
callback, run once this round of the loop has read everything that was ready, flushes every
server listed (`flush_servers`): each one's requests go out in one write, and its backend
wakes once.

Order is what matters: while anything is deferred, `ServerConnection.send` appends behind
it instead of writing, so nothing a client sends later overtakes what was deferred. A server
that closes writes what is deferred first (its clients' requests then run as they would have
without pipelining); a server already closed drops it (those clients got the close's error).

The lists live on the server's record (net/records.py) and the Pooler; this module owns
when they are written.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..core.states import ServerState

if TYPE_CHECKING:
    from .records import PoolerPort, ServerRecord

log = logging.getLogger("pypool")


def send_soon(server: ServerRecord, data: bytes) -> None:
    """Write client requests to `server` once this round of the event loop has read
    everything that was ready."""
    if server.trace is not None:
        server.trace.server_write(server, data)
    deferred = server.deferred
    if deferred is None:
        deferred = server.deferred = []
        pooler = server.pooler
        if not pooler.to_flush:
            # Callbacks run once every connection with something ready has been read.
            pooler.loop.call_soon(flush_servers, pooler)
        pooler.to_flush.append(server)
    deferred.append(data)


def flush_servers(pooler: PoolerPort) -> None:
    """The end of the round: flush every server that deferred writes during it."""
    servers, pooler.to_flush = pooler.to_flush, []
    for server in servers:
        try:
            flush(server)
        except Exception:  # noqa: BLE001 - one broken socket must not strand the others
            log.exception("%r: writing deferred requests failed", server)
            server.close("write failed")


def flush(server: ServerRecord) -> None:
    """Write what `send_soon` deferred, in one write (dropped if the server is already
    closed)."""
    deferred = server.deferred
    if deferred is not None:
        data = b"".join(deferred)
        server.deferred = None
        transport = server.transport
        if transport is not None and server.state is not ServerState.CLOSED:
            transport.write(data)
