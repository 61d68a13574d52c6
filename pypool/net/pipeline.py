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
end (net/deferred_writes.py `send_soon`), so its backend reads them, and wakes, once.

"Sure to be over at its Sync" is decided by the prepared-statement layer
(`ServerStatements.last_neutral`): the client was idle (its last ReadyForQuery said `I`)
and its transaction is one extended-protocol segment of Binds of statements (named, or the
unnamed one) whose text starts with SELECT, INSERT, UPDATE, DELETE, WITH, VALUES or TABLE
(none can open or end a transaction block), with Describe and Execute of portals, or one
simple Query holding one such statement. That is the steady state of every driver with
prepared statements. An error in it makes the server skip to the Sync, which ends the
implicit transaction all the same.

The server's `client` is the head of the line; `chain` holds the clients queued behind it
(the ends move with net/link_ends.py: `line_up` when a client joins, `take_turn` at its
turn).
Every client in the line but the last may not send more to this server (its later requests
would land behind the others'): what it sends waits, uncounted, as during a rewriting WAIT,
and goes to a server of its own after its ReadyForQuery. A client that disconnects while in
the line stays in it until its replies have gone by (they are dropped), so the line moves on;
if its last ReadyForQuery says it was inside a transaction after all, or it left with a
segment unsynced, the server is closed, which rolls back, and everyone in the line gets an
error. A CancelRequest from a client still queued behind another is dropped: sent at once, it
would cancel the query ahead; sent when the client's turn comes, it could already hit the one
behind (the whole line is on the server's socket). Its query runs to its end.

query_wait_timeout still applies to a client in a line, as long as its transaction has not
started on the server. While it is set, a client is queued only if its transaction is one
extended-protocol segment ending at its Sync (a simple Query or FunctionCall, or several
transactions at once, stays waiting in the pool), and only before its deadline. In front of
its messages goes a guard (pooling/pipeline_guard.py): a Bind and Execute of the pooler's own
statement that fails once the deadline, `wait_start + query_wait_timeout` as wall-clock time,
has passed on the server's clock. Then PostgreSQL skips the rest of the segment to the
client's Sync, the transaction never starts, the guard's replies are swallowed, and the
client gets PgBouncer's `query_wait_timeout` (FATAL) while the ReadyForQuery 'I' of its Sync
goes by, dropped, and the line moves on (`guard_verdict`, `skipped_in_line`). Until its
guard has passed (or, with others queued behind it, until its ReadyForQuery), what the
client sends next waits, uncounted, as for the others in the line: once refused, nothing of
it may run, and it is dropped.

A client whose turn has not come (still in `chain`) is refused sooner, by the janitor
(`refuse_overdue`), at its deadline plus GUARD_MARGIN, and only when nothing the server sent
is left unread in its socket: if the guard had passed, the server would have sent the
ReadyForQuery of the client ahead before the deadline, and the pooler would have read it.
Its replies, when they come (the guard fails), are dropped like those of a client that left.
On one host this cannot go wrong as long as the clock is not stepped back; with PostgreSQL
on another, its clock must agree with the pooler's to within GUARD_MARGIN less the time a
reply takes to arrive. A follower refused whose guard passes anyway is logged as an error.

What is given up: a client queued behind a slow query waits for it even if another server
frees up first (and, with query_wait_timeout set, is refused at its deadline rather than
served elsewhere); simple Queries are not pipelined while query_wait_timeout is set (no
guard can share their implicit transaction: a Query after a failed extended message is
skipped with no ReadyForQuery of its own, and one after a passed guard commits it); and a
queued client's next request waits for its first to start. The line is short
(`pipeline_depth`; 0, the default, turns pipelining off) and is only formed while clients are
already waiting for a server.
"""

from __future__ import annotations

import fcntl
import struct
import termios
import time
from typing import TYPE_CHECKING, Final

from ..core.link import SEND, LinkEvent
from ..core.states import ClientState
from ..pooling.pipeline_guard import FAILED, PENDING, SKIPPED, Guard
from ..pooling.session_state import sync_statements
from ..pooling.stats import WAIT_BUCKETS, observe
from ..protocol import messages as m
from ..protocol.errors import PoolerError
from . import deferred_writes, link_ends, outbox

if TYPE_CHECKING:
    from ..pooling.prepared import ServerStatements
    from .records import ClientRecord, PoolerPort, ServerRecord

# How long after its deadline a client whose turn has not come is refused (see the module
# docstring): room for the clocks of two hosts to differ and for a reply still on its way.
GUARD_MARGIN: Final = 0.25
# The first message of a transaction that can carry a guard: an extended-protocol one.
_EXTENDED: Final = tuple(
    kind in (m.PARSE, m.BIND, m.DESCRIBE, m.EXECUTE, m.CLOSE, m.FLUSH) for kind in range(256)
)


def worth_extending(server: ServerRecord) -> bool:
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


def extend(pooler: PoolerPort, server: ServerRecord, data: bytes = b"") -> None:
    """Queue waiting clients behind the last one on `server` while the line allows; their
    requests go out in one write, after `data` (what the caller was about to send)."""
    pool = server.pool
    depth = pooler.pipeline_depth if may_serve_on(pooler, server) else 0
    out = [data]
    wait_timeout = pool.limits.query_wait_timeout
    now = pooler.now() if wait_timeout else 0.0
    # Only while the pool may not open another server: until then, a new one serves sooner.
    while (len(server.chain) < depth and not pool.paused
           and pool.server_count >= pool.limits.pool_size):
        if not pool.waiting:
            # Room left: a client that needs a server later may join this line.
            if not server.open_line:
                server.open_line = True
                pool.open_lines.append(server)
            break
        # The head of the queue, whatever the queue policy: a line is filled in arrival order.
        client = pool.waiting[0]
        if client.state is not ClientState.WAITING:
            pool.waiting.popleft()
            continue
        if not can_follow(server, client) or (
                wait_timeout and now >= client.wait_start + wait_timeout):
            break  # past its deadline: the janitor refuses it, or a free server takes it
        pool.waiting.popleft()
        out.append(follow(server, client))
    data = b"".join(out)
    if data:
        deferred_writes.send_soon(server, data)


def may_serve_on(pooler: PoolerPort, server: ServerRecord) -> bool:
    """Whether `server` may take on more clients: not when it is due to close once free
    (RECONNECT or a changed [databases] entry, server_lifetime over, database removed), or
    a line kept topped up under load would keep it from ever being free."""
    pool = server.pool
    lifetime = pool.limits.server_lifetime
    return not (pool.removed or server.close_needed
                or pooler.now() - server.connect_time > lifetime)


def join_open_line(pooler: PoolerPort, client: ClientRecord) -> bool:
    """A client needs a server and none is idle: queue it on a busy one whose line has room,
    if any (`Pool.open_lines`). False if it must wait."""
    pool = client.pool
    assert pool is not None
    lines = pool.open_lines
    if pool.limits.query_wait_timeout and not guardable(client):
        return False  # no line takes it: leave them listed for those that fit
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
                deferred_writes.send_soon(server, data)
            if len(server.chain) < depth and can_follow_any(server):
                server.open_line = True
                lines.append(server)
            return True
    return False


def can_follow_any(server: ServerRecord) -> bool:
    """Whether the last client on `server` leaves room for another behind it."""
    last = server.chain[-1] if server.chain else server.client
    st = server.statements
    return not (last is None or last.ledger.pending != 1 or last.ledger.unsynced
                or last.ledger.copy
                # A statement that changes session state is never neutral: the client may
                # keep the server, and the next one must find its settings made first.
                or (last.session is not None and last.session.busy())
                or last.tx_status != m.TX_IDLE or not _reader_free(last)
                or server.hidden_syncs or server.close_reason or not st.neutral_tail()
                or st.requests.undoable or st.requests.blocked or st.requests.discarding)


def _reader_free(client: ClientRecord) -> bool:
    """Nothing of `client`'s half-read or waiting, but what a guard holds back (it waits for
    its own server, as what the others in a line send does)."""
    reader = client.reader
    return reader.idle() or (reader.blocked and not reader.partial and not reader.skip
                             and guarded(client))


def can_follow(server: ServerRecord, client: ClientRecord) -> bool:
    """Whether `client`'s request may be written to `server` now, behind the last client in
    its line."""
    if (client.statements is None or client.statements.sql
            or not can_follow_any(server)):
        return False
    if server.pool.limits.query_wait_timeout and not guardable(client):
        return False
    # No SET may be needed for it: a hidden query's replies would be mistaken for the others'.
    session = client.session
    held = server.session_sets
    if session is None and held:
        session = client.session_record()  # another client's settings to undo for it
    if session is not None and (session.busy() or (session.sets or held)
                                and sync_statements(held or {}, session.sets)):
        return False
    return server.reader.covers(client.params)


def guardable(client: ClientRecord) -> bool:
    """Whether what `client` waits to send is one extended-protocol segment ending at its
    Sync, which a guard can open (see the module docstring)."""
    ledger = client.ledger
    kept = client.outbox  # its first piece
    return (ledger.pending == 1 and not ledger.unsynced and not ledger.copy
            and bool(kept) and _EXTENDED[kept[0]])


def sent(client: ClientRecord, server: ServerRecord,
         st: ServerStatements) -> None:
    """The client's messages went to its server: if they are one whole transaction that
    ends at its Sync, waiting clients may queue behind it (the pooler decides)."""
    ledger = client.ledger
    session = client.session
    if (ledger.pending == 1 and not ledger.unsynced and st.last_neutral is not False
            and (session is None or not (session.pins or session.pending))):
        client.pooler.pipeline(server)


def guarded(client: ClientRecord) -> bool:
    """Whether `client` is in a line with a guard: it holds what it sends next itself."""
    return client.guard is not None


def follow(server: ServerRecord, client: ClientRecord) -> bytes:
    """Queue `client` on `server` behind the last one in the line: its request, rewritten
    for that server, is returned to be sent."""
    last = server.chain[-1] if server.chain else server.client
    assert last is not None
    server.chain = (*server.chain, client)
    # What `last` sends from now on waits for a server of its own.
    link_ends.line_up(last, client, server)
    actions = client.on_link(LinkEvent.LINED_UP)
    server.pool.stats.pipelined_count += 1
    pooler = server.pooler
    wait_timeout = server.pool.limits.query_wait_timeout
    if not actions & SEND:
        return b""
    if not wait_timeout:
        return outbox.take_outbox(client, server)
    due = client.wait_start + wait_timeout
    guard = Guard(client, due, time.time() + (due - pooler.now()), guard_verdict)
    client.guard = guard
    # Until its transaction has started, what it sends waits: were it refused, nothing more
    # of it may run.
    link_ends.hold(client)
    return server.statements.queue_guard(guard) + outbox.take_outbox(client, server)


def guard_verdict(guard: Guard) -> None:
    """Called by the request queue (pooling/prepared/), from inside the reading of the server's
    replies. FAILED: the server skipped the transaction, its deadline had passed; the client
    is refused (unless the janitor did so already), and stays in the line until the
    ReadyForQuery of its Sync has gone by (`skipped_in_line`). PASSED: its transaction has
    started; if nobody is queued behind it, what it sent meanwhile may go (its transaction
    may be a BEGIN: it must not wait for a release that only its next requests bring)."""
    client: ClientRecord = guard.owner
    if guard.state == FAILED:
        if client.state is not ClientState.CLOSED:
            refuse(client)
    elif client.state is not ClientState.CLOSED:
        # Not from in here: the server's relay is halfway through its bytes.
        client.pooler.loop.call_soon(_send_on, client, guard)


def _send_on(client: ClientRecord, guard: Guard) -> None:
    """After a PASSED guard: the client, still the last in its line, sends on."""
    server = client.server
    if (server is None or client.guard is not guard
            or client.state is ClientState.CLOSED or not client.reader.blocked):
        return  # released already (and sending on), or gone
    last = server.chain[-1] if server.chain else server.client
    if last is client:
        outbox.resume_rewriting(client)


def skipped_in_line(client: ClientRecord) -> bool:
    """Whether the guard of linked `client` failed (or an error came before it): all the
    server still owes it is the ReadyForQuery of the segment it skips, so a client that
    leaves now (refused) keeps its place until then, and the server serves on."""
    guard = client.guard
    return guard is not None and (guard.state == FAILED or guard.state == SKIPPED)


def refuse(client: ClientRecord) -> None:
    """Tell a client in a line `query_wait_timeout`, as the janitor tells a waiting one."""
    pool = client.pool
    assert pool is not None
    pool.stats.count_error("query_wait_timeout")
    client.reader.take_partial()  # sent after its guarded transaction: must never run
    client.fail(PoolerError("query_wait_timeout"))


def refuse_overdue(pooler: PoolerPort, server: ServerRecord, now: float) -> None:
    """The janitor's part: refuse the clients queued behind the head of `server`'s line
    (their turn has not come) whose deadline passed GUARD_MARGIN ago, if nothing the server
    sent is left unread (see the module docstring)."""
    unread: bool | None = None
    for client in list(server.chain):
        guard = client.guard
        if (guard is None or guard.state != PENDING or guard.refused
                or client.state is ClientState.CLOSED or now < guard.due + GUARD_MARGIN):
            continue
        if unread is None:
            unread = replies_unread(server)
        if unread:
            return  # the ReadyForQuery ahead may be among them: the guard decides
        guard.refused = True
        refuse(client)


def replies_unread(server: ServerRecord) -> bool:
    """Whether bytes from the server wait unread in its socket's receive queue (FIONREAD);
    True when that cannot be told."""
    transport = server.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return True
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, ValueError):
        return True
    return bool(struct.unpack("i", raw)[0])


def hand_on(pooler: PoolerPort, server: ServerRecord, now: float) -> None:
    """The head of the line is done: the next client in it is linked from now on."""
    client = server.chain[0]
    server.chain = server.chain[1:]
    link_ends.take_turn(server, client)
    client.on_link(LinkEvent.TURN)
    pool = server.pool
    if client.state is not ClientState.CLOSED:
        stats = pool.stats
        waited = now - client.wait_start
        stats.wait_time_us += int(waited * 1e6)
        if pooler.histograms:
            observe(WAIT_BUCKETS, stats.wait_counts, waited)
        stats.server_assignment_count += 1
    client.link_time = now
    client.query_start = now
    server.request_time = now
    if client.writing_paused:
        server.pause_reading()
    # Top the line up again, so the server never runs dry while clients wait.
    if worth_extending(server):
        extend(pooler, server)
