"""Pipelining: queueing waiting clients' transactions on a busy server.

When every server of a pool is busy and clients wait, a server normally sits idle for a
round trip after each transaction: its ReadyForQuery travels to the pooler, the pooler
hands the server to the next client and sends that client's request, and only then does
PostgreSQL wake up again. Here, once the linked client has sent a whole transaction that is
sure to be over at its Sync, the next waiting clients' requests are written to the same
server straight away, up to `pipeline_depth` deep. The server runs them back to back; each
client gets its own replies, and owns the server from its predecessor's ReadyForQuery to
its own, exactly as if it had been linked then. PgBouncer always waits for the round trip.
The requests queued on a server in one round of the event loop leave in one write at its
end (`ServerConnection.send_soon`), so its backend reads them, and wakes, once.

"Sure to be over at its Sync" is decided by the prepared-statement layer
(`ServerStatements.last_neutral`): the client was idle (its last ReadyForQuery said `I`)
and its transaction is one extended-protocol segment of Binds of statements (named, or the
unnamed one) whose text starts with SELECT, INSERT, UPDATE, DELETE, WITH, VALUES or TABLE
(none can open or end a transaction block), with Describe and Execute of portals, or one
simple Query holding one such statement. That is the steady state of every driver with
prepared statements. An error in it makes the server skip to the Sync, which ends the
implicit transaction all the same.

The server's `client` is the head of the line; `chain` holds the clients queued behind it.
Every client in the line but the last may not send more to this server (its later requests
would land behind the others'): what it sends waits, uncounted, as during a rewriting WAIT,
and goes to a server of its own after its ReadyForQuery. A client that disconnects while in
the line stays in it until its replies have gone by (they are dropped), so the line moves on;
if its last ReadyForQuery says it was inside a transaction after all, or it left with a
segment unsynced, the server is closed, which rolls back, and everyone in the line gets an
error. A CancelRequest from a client still queued behind another is dropped: sent at once, it
would cancel the query ahead; sent when the client's turn comes, it could already hit the one
behind (the whole line is on the server's socket). Its query runs to its end.

What is given up: a client queued behind a slow query waits for it even if another server
frees up first, and query_wait_timeout no longer applies to it once its request is sent.
The line is short (`pipeline_depth`, default 4; 0 turns pipelining off) and is only formed
while clients are already waiting for a server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.states import ClientEvent, ClientState
from ..pooling.params import covers
from ..pooling.session_state import sync_statements
from ..protocol import messages as m

if TYPE_CHECKING:
    from ..pooler import Pooler
    from .client import ClientConnection
    from .server import ServerConnection


def worth_extending(server: ServerConnection) -> bool:
    """Whether the line on `server` may take more now: the pool may not open another server,
    someone waits or the server is not yet listed as having room, and its last transaction
    ends at its Sync (looked at last: for a simple Query it is a regex). Never with
    pipelining off: then not even the regex runs, and requests are written at once."""
    if not server.pooler.pipeline_depth:
        return False
    pool = server.pool
    return (pool.server_count >= pool.limits.pool_size
            and (pool.waiting or not server.open_line)
            and server.statements.neutral_tail())


def extend(pooler: Pooler, server: ServerConnection, data: bytes = b"") -> None:
    """Queue waiting clients behind the last one on `server` while the line allows; their
    requests go out in one write, after `data` (what the caller was about to send)."""
    pool = server.pool
    depth = pooler.pipeline_depth if may_serve_on(pooler, server) else 0
    chain = server.chain
    out = [data]
    # Only while the pool may not open another server: until then, a new one serves sooner.
    while len(chain) < depth and not pool.paused and pool.server_count >= pool.limits.pool_size:
        if not pool.waiting:
            # Room left: a client that needs a server later may join this line.
            if not server.open_line:
                server.open_line = True
                pool.open_lines.append(server)
            break
        client = pool.waiting[0]
        if client.state is not ClientState.WAITING:
            pool.dequeue()
            continue
        if not can_follow(server, client):
            break
        pool.dequeue()
        out.append(follow(server, client))
    data = b"".join(out)
    if data:
        server.send_soon(data)


def may_serve_on(pooler: Pooler, server: ServerConnection) -> bool:
    """Whether `server` may take on more clients: not when it is due to close once free
    (RECONNECT or a changed [databases] entry, server_lifetime over, database removed), or
    a line kept topped up under load would keep it from ever being free."""
    pool = server.pool
    lifetime = pooler.server_lifetime
    return not (pool.removed or (pool.close_needed and server in pool.close_needed)
                or (lifetime and pooler.now() - server.connect_time > lifetime))


def join_open_line(pooler: Pooler, client: ClientConnection) -> bool:
    """A client needs a server and none is idle: queue it on a busy one whose line has room,
    if any (`Pool.open_lines`). False if it must wait."""
    pool = client.pool
    assert pool is not None
    lines = pool.open_lines
    depth = pooler.pipeline_depth
    while lines:
        server = lines.pop()
        server.open_line = False
        if (len(server.chain) < depth and server.client is not None
                and server.pool is pool and may_serve_on(pooler, server)
                and can_follow(server, client)):
            client.wait_start = pooler.now()
            data = follow(server, client)
            if data:
                server.send_soon(data)
            if len(server.chain) < depth and can_follow_any(server):
                server.open_line = True
                lines.append(server)
            return True
    return False


def can_follow_any(server: ServerConnection) -> bool:
    """Whether the last client on `server` leaves room for another behind it."""
    last = server.chain[-1] if server.chain else server.client
    st = server.statements
    return not (last is None or last.ledger.pending != 1 or last.ledger.unsynced
                or last.ledger.copy
                # A statement that changes session state is never neutral: the client may
                # keep the server, and the next one must find its settings made first.
                or (last.session is not None and last.session.busy())
                or last.tx_status != m.TX_IDLE or not last.reader.idle()
                or server.hidden_syncs or server.close_reason or not st.neutral_tail()
                or st.undoable or st.blocked or st.discarding)


def can_follow(server: ServerConnection, client: ClientConnection) -> bool:
    """Whether `client`'s request may be written to `server` now, behind the last client in
    its line."""
    if (client.statements is None or client.statements.sql
            or not can_follow_any(server)):
        return False
    # No SET may be needed for it: a hidden query's replies would be mistaken for the others'.
    session = client.session
    if session is not None and (session.busy() or (session.sets or server.session_sets)
                                and sync_statements(server.session_sets, session.sets)):
        return False
    return covers(server.params, client.params)


def follow(server: ServerConnection, client: ClientConnection) -> bytes:
    """Queue `client` on `server` behind the last one in the line: its request, rewritten
    for that server, is returned to be sent."""
    last = server.chain[-1] if server.chain else server.client
    assert last is not None
    last.reader.blocked = True  # what it sends from now on waits for a server of its own
    server.chain.append(client)
    client.server = server
    client.on(ClientEvent.LINKED)
    server.pool.stats.pipelined_count += 1
    return client.take_outbox(server)


def hand_on(pooler: Pooler, server: ServerConnection, now: float) -> None:
    """The head of the line is done: the next client in it is linked from now on."""
    client = server.chain.popleft()
    server.link(client)
    pool = server.pool
    if client.state is not ClientState.CLOSED:
        stats = pool.stats
        waited = now - client.wait_start
        stats.wait_time_us += int(waited * 1e6)
        stats.wait_histogram.observe(waited)
        stats.server_assignment_count += 1
    client.link_time = now
    client.query_start = now
    server.request_time = now
    if client.writing_paused:
        server.pause_reading()
    # Top the line up again, so the server never runs dry while clients wait.
    if worth_extending(server):
        extend(pooler, server)
