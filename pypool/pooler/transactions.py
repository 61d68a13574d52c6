"""The end of a client's transaction: what each ReadyForQuery means for its server.

Every ReadyForQuery a server forwards to its linked client comes here
(`ready_for_query`, called by the server's Protocol through the Pooler). The client's
FrontendLedger (core/ledger.py) says, through `core.backend.after_ready`, what it means:
replies still owed (keep the server), the transaction over with nothing owed (RELEASE:
linking.release gives the server back), a transaction in session or statement mode, or a
ledger in doubt (close the server rather than hand it on).

Session state (pooling/session_state.py) can overrule a RELEASE: a client that left
something on its server that cannot follow it (a LISTEN, an advisory lock, a temp table)
is pinned to that server, as in session mode, until that state is gone; it is told once
with a NOTICE. The statements that change session state are seen on the way in
(`session_changed`, from the client's relay) and judged here at the ReadyForQuery.

It owns no state: the ledger, the session record and the pool's counters hold it. Never
release a server with replies owed, never hand on one whose ledger is in doubt.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..core import backend
from ..core.states import ClientState
from ..pooling import session_state as ss
from ..protocol import messages as m
from ..protocol.errors import PoolerError
from . import linking

if TYPE_CHECKING:
    from ..net.client import ClientConnection
    from .objects import Pooler

log = logging.getLogger("pypool.client")


def ready_for_query(pooler: Pooler, client: ClientConnection, status: int) -> None:
    """A ReadyForQuery with transaction `status` was forwarded to `client`: release its
    server, keep it, or close it, as the ledger and the session state say."""
    client.tx_status = status
    pool = client.pool
    assert pool is not None
    stats = pool.stats
    stats.query_count += 1
    server = client.server
    ledger = client.ledger
    verdict = backend.after_ready(ledger, status, pool.limits.pool_mode,
                                  client.state is ClientState.CLOSED,
                                  server is not None and bool(server.chain),
                                  0 if server is None else len(server.statements.requests.queue))
    if verdict == backend.OWED:
        return
    if verdict == backend.CLOSE_DOUBT or verdict == backend.CLOSE_DISAGREE:
        if server is not None:
            # The count of replies owed may be wrong (core/ledger.py): never hand it on.
            if verdict == backend.CLOSE_DOUBT:
                server.close("reply bookkeeping in doubt after a failed COPY")
            else:
                log.error("%r: the client's ledger and %r's statement queue disagree "
                          "(%d requests queued): closing the server", client, server,
                          len(server.statements.requests.queue))
                server.close("reply bookkeeping in doubt: ledger and queue disagree")
        return
    session = client.session
    if session is None and ledger.errors and client.follows is not None:
        # Its first error: a record made now starts where one made at login would be.
        session = client.session_record()
    if session is not None and server is not None and (
            session.pending or session.pins or ledger.errors != session.errors_seen):
        session.ready(status, ledger.errors, server.session_sets)
        if verdict == backend.RELEASE and session.pins:
            verdict = backend.SESSION_XACT  # pinned: keeps its server, as in session mode
            _pinned(client, session)
    now = pooler.now()
    stats.query_time_us += int((now - client.query_start) * 1e6)
    client.state_since = now
    if verdict == backend.RELEASE:
        linking.release(pooler, client, now)
    elif verdict == backend.SESSION_XACT:
        stats.xact_count += 1
    elif verdict == backend.CLOSE_OPEN:
        assert server is not None
        server.close("transaction still open where the pipeline expected none")
    elif verdict == backend.STATEMENT_REFUSED:
        client.fail(PoolerError("transaction blocks not allowed in statement pooling mode"))


def session_changed(client: ClientConnection) -> None:
    """The client's request reader saw statements that change session state: refused
    ones are counted and logged; the others are told to the client's record."""
    reader = client.reader
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
            session.sent(reader.changes, server.session_sets if server else None)
        reader.changes.clear()


def _pinned(client: ClientConnection, session: ss.ClientSession) -> None:
    """The client keeps its server after its transaction: say so the first time."""
    if session.noticed:
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
