"""The end of a client's transaction: what each ReadyForQuery means for its server.

Every ReadyForQuery a server forwards to its linked client comes here
(`ready_for_query`, called by the server's Protocol through the Pooler). While the client's
FrontendLedger (core/ledger.py) says replies are still owed, nothing changes; nor while the
client is in the middle of sending a message whose start is on the server (its backend
reads the rest before anything another client sends): that waits for `message_sent`. Once
it is owed nothing, the ReadyForQuery is one event of the client's link (core/link.py
`ready_event`: released, kept in a transaction block or in session mode, pinned by its
session state, or a server to close), and this module carries out the actions the link's
table gives for it.

Session state (pooling/session_state.py) is judged here first: a client that left
something on its server that cannot follow it (an advisory lock, a temp table, a LISTEN
with listen_mode = pin) is pinned to that server, as in session mode, until that state is
gone; it is told once with a NOTICE. The statements that change session state are seen on
the way in (`session_changed`, from the client's relay). A LISTEN with listen_mode = shared
pins nothing: pooler/notifications.py hears its channels for it.

It owns no state: the ledger, the link, the session record and the pool's counters hold
it. Never release a server with replies owed, never hand on one whose ledger is in doubt.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..core import link
from ..core.link import LinkEvent
from ..pooling import session_state as ss
from ..protocol import messages as m
from ..protocol.errors import PoolerError
from . import linking, notifications

if TYPE_CHECKING:
    from ..net.records import ClientRecord, ServerRecord
    from .record import PoolerRecord as Pooler

log = logging.getLogger("pypool.client")


def ready_for_query(pooler: Pooler, client: ClientRecord, status: int) -> None:
    """A ReadyForQuery with transaction `status` was forwarded to `client`: release its
    server, keep it, or close it, as its link's table says (core/link.py)."""
    client.tx_status = status
    pool = client.pool
    assert pool is not None
    stats = pool.stats
    stats.query_count += 1
    ledger = client.ledger
    if not ledger.ready():
        return  # more replies are owed: the server stays, the link is unchanged
    if client.reader.skip:
        # The client is sending a message whose start is on the server already (a COPY
        # that failed while its CopyData streamed): its backend reads the rest before
        # anything else, so the server stays until that rest has gone (`message_sent`).
        return
    _judge(pooler, client, status)


def message_sent(pooler: Pooler, client: ClientRecord) -> None:
    """The rest of a message whose start was on the client's server has gone to it: if
    the client is owed nothing, the ReadyForQuery that came before that end is judged."""
    if (client.server is not None and client.link.state is link.LinkState.ACTIVE
            and client.reader.done_with_server()):
        _judge(pooler, client, client.tx_status)


def _judge(pooler: Pooler, client: ClientRecord, status: int) -> None:
    """Release, keep or close the server of a client owed nothing, as its link's table
    says for its last ReadyForQuery's `status`."""
    pool = client.pool
    assert pool is not None
    stats = pool.stats
    ledger = client.ledger
    server = client.server
    session = client.session
    if session is None and ledger.errors and client.follows is not None:
        # Its first error: a record made now starts where one made at login would be.
        session = client.session_record()
    pinned = False
    if session is not None and server is not None and (
            session.pending or session.pins or ledger.errors != session.errors_seen):
        session.ready(status, ledger.errors, _session_sets(server))
        pinned = bool(session.pins)
    if session is not None and session.shared_listen:
        # LISTEN shared: committed? held notifications? its server kept as a bridge?
        notifications.ready(pooler, client, session)
        pinned = bool(session.pins)
    queued = len(server.statements.requests.queue) if server is not None else 0
    event = link.ready_event(ledger, status, pool.limits.pool_mode, client.link,
                             server is not None and bool(server.chain), queued, pinned)
    now = pooler.now()
    actions = client.on_link(event, now)
    if event != LinkEvent.READY_DOUBT:
        stats.query_time_us += int((now - client.query_start) * 1e6)
        client.state_since = now
    if actions & link.RELEASE:
        linking.release(pooler, client, now, bool(actions & link.CLOSE_CLIENT))
    if actions & link.COUNT_XACT:
        stats.xact_count += 1
    if actions & link.NOTICE_PINNED and session is not None:
        _pinned(client, session)
    if actions & link.CLOSE_SERVER and server is not None:
        server.close(_close_reason(client, event, queued))
    if actions & link.REFUSE:
        client.fail(PoolerError("transaction blocks not allowed in statement pooling mode"))


def _close_reason(client: ClientRecord, event: int, queued: int) -> str:
    """Why a ReadyForQuery closes the client's server (READY_DOUBT, READY_OPEN)."""
    if event == LinkEvent.READY_OPEN:
        return "transaction still open where the pipeline expected none"
    if client.ledger.doubtful:
        # The count of replies owed may be wrong (core/ledger.py): never hand it on.
        return "reply bookkeeping in doubt after a failed COPY"
    log.error("%r: the client's ledger and its server's statement queue disagree "
              "(%d requests queued): closing the server", client, queued)
    return "reply bookkeeping in doubt: ledger and queue disagree"


def session_changed(pooler: Pooler, client: ClientRecord) -> None:
    """The client's request reader saw statements that change session state: refused
    ones are counted and logged; the others are told to the client's record."""
    reader = client.reader
    reader.noticed = False  # both lists are taken below
    assert client.pool is not None
    stats = client.pool.stats
    for command in reader.refused:
        stats.session_refused += 1
        log.info("%r: refused %s (session_state = reject)", client, ss.label(command))
    reader.refused.clear()
    if reader.changes:
        session = client.session_record()
        if session is not None:
            server = client.server
            if not session.shared_listen and notifications.shared(pooler) and any(
                    command.kind == ss.LISTEN for command in reader.changes):
                session.shared_listen = True  # from now on, its LISTENs pin nothing
            session.sent(reader.changes, _session_sets(server) if server else None)
            if session.shared_listen:
                notifications.changed(pooler, client, session)
        reader.changes.clear()


def _session_sets(server: ServerRecord) -> dict[bytes, bytes | None]:
    """The settings `server` holds, for a client's record to write into: made when first
    needed (ServerRecord.session_sets is None while it holds none)."""
    held = server.session_sets
    if held is None:
        held = server.session_sets = {}
    return held


def _pinned(client: ClientRecord, session: ss.ClientSession) -> None:
    """The client keeps its server after its transaction: say so the first time (not for
    a shared LISTEN's bridge alone: pooler/notifications.py)."""
    if session.noticed or (session.shared_listen
                           and all(kind == ss.LISTEN for kind in session.pins)):
        return
    session.noticed = True
    why = session.pinned()
    assert client.pool is not None
    client.pool.stats.session_pinned += 1
    log.info("%r: pinned to its server (%s) until that state is gone", client, why)
    # Right after the ReadyForQuery: a message boundary, and libpq takes the notice then.
    client.write(m.notice_response(
        f"pypool: this connection keeps its server until the session state is gone "
        f"({why})"))
