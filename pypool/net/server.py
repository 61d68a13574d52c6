"""One connection from the pooler to PostgreSQL: an asyncio adapter around the sans-IO core.

States: CONNECTING, LOGIN, IDLE, ACTIVE, CLOSED, changed only through the (state, event)
table in core/states.py, which says what each means.

The login is net/server_login.py's, around core/server_login.py's exchange; after it, every
byte the server sends goes to the reply reader (core/replies.py), which frames it, keeps the
backend ledger of the pooler's own queries (core/backend.py) and says where to act. This
Protocol writes what the reader leaves for the linked client, tells the pooler of each
ReadyForQuery the client gets (pooler/transactions.py: the client's ledger decides a
release), hands the settled outcome of the pooler's own queries to net/hidden_queries.py,
and carries flow control. Writes to the server go out at once (`send`) or at the end of the
loop's round (net/deferred_writes.py). The server is never handed on while replies are owed.
Its fields are said in net/records.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ..core import replies
from ..core.states import ServerEvent, ServerState, server_transition
from ..protocol import messages as m
from ..protocol.errors import ServerProtocolError
from . import deferred_writes, hidden_queries, outbox
from .flow_control import LARGE_READ
from .records import ServerRecord
from .server_login import ServerLogin

if TYPE_CHECKING:
    from ..auth.server_credentials import ServerCredentials
    from ..pooling.pool import Pool
    from .records import PoolerPort, ServerTap

log = logging.getLogger("pypool.server")


class ServerConnection(ServerRecord, asyncio.Protocol):
    """A server connection. The pooler owns it; a client borrows it for a transaction."""

    def __init__(
        self, pooler: PoolerPort, pool: Pool, host: str, port: int, dbname: str,
        credentials: ServerCredentials, startup_params: dict[str, str],
    ) -> None:
        # Its fields, said once (net/records.py).
        ServerRecord.__init__(self, pooler, pool, host, port, dbname, credentials,
                              startup_params)
        self.transport: asyncio.Transport | None = None
        # The transaction log's reader of this server's replies; None with the log off.
        self.txlog: ServerTap | None = None if pooler.txlog is None else pooler.txlog.tap(self)
        self.login = ServerLogin(self)  # to its first ReadyForQuery (net/server_login.py)
        self._reading_paused = False
        self._yielding = False  # between a large read and the loop's next turn

    # --- state ----------------------------------------------------------------------------

    def on(self, event: int) -> None:
        """Move to the state the table (core/states.py) gives for `event` (its row for
        this state: SERVER_ROWS)."""
        target = self.state_row[event]
        if target is None:
            server_transition(self.state, event)  # raises IllegalTransition, named
            return
        self.state, self.state_row = target

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        self.on(ServerEvent.CONNECTED)
        self.login.connected(transport)  # tunes the socket, then the SSLRequest or startup

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state is not ServerState.CLOSED:
            self.login.lost()  # during the login: its waiters get the error
            self.pooler.server_closed(self, self.close_reason or "server closed the connection")

    def pause_writing(self) -> None:
        self.writing_paused = True
        if self.client is not None:
            self.client.pause_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.client is not None:
            self.client.resume_reading()

    def close(self, reason: str) -> None:
        """Close now. The pooler is told through connection_lost."""
        if self.state is ServerState.CLOSED or self.transport is None:
            return
        self.close_reason = reason
        # Deferred requests go first, as they would have had they been written at once (a
        # client's query followed by its Terminate still runs, as without pipelining).
        deferred_writes.flush(self)
        if self.state in (ServerState.IDLE, ServerState.ACTIVE):
            try:
                if self.trace is not None:
                    self.trace.server_write(self, m.terminate(), True)
                self.transport.write(m.terminate())
            except Exception:  # noqa: BLE001 - the socket may already be gone
                pass
        self.transport.close()

    def send(self, data: bytes, own: bool = False) -> None:
        """Write client requests to the server now, behind any still deferred (`own`: the
        pooler's own query, for the trace)."""
        if self.trace is not None:
            self.trace.server_write(self, data, own)
        if self.deferred is not None:
            self.deferred.append(data)
        else:
            assert self.transport is not None
            self.transport.write(data)

    # --- login ----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        trace = self.trace
        if trace is not None:
            trace.server_read(self, data)
        if self.state is ServerState.LOGIN:
            self.login.data(data)
        else:
            self.pool.stats.bytes_sent += len(data)  # what goes on to clients, give or take
            if self.txlog is not None:
                self.txlog.feed(data)
            try:
                self._relay(data)
            except ServerProtocolError as exc:
                # Bytes no PostgreSQL sends: nothing after them can be framed. The server
                # goes; a client it served gets "server conn crashed?", as in PgBouncer.
                log.warning("%r: %s", self, exc)
                self._gone(str(exc))
        if trace is not None:
            trace.server_done(self)
        if len(data) >= LARGE_READ:
            self.take_turns(self.pooler.loop)  # the other connections first (flow_control)

    # --- the hot path: server to client (framing and judging: core/replies.py) -------------

    def _relay(self, data: bytes) -> None:
        """Feed the server's bytes to the reply reader, write what it leaves for the client,
        and act where it stops: a client's ReadyForQuery, a settled pooler-issued query."""
        reader = self.reader
        event = reader.feed(data)
        while True:
            out = reader.take_out()
            if out:
                client = self.client
                if client is not None:
                    client.write(out)
                elif self._fatal(out):
                    return
            if event == replies.READY:
                client = self.client
                if client is not None:
                    # This may hand the server to the next client of its line (pipeline.py).
                    self.pooler.ready_for_query(client, reader.status)
                    if self.close_reason:
                        return
            elif event == replies.HIDDEN:
                hidden_queries.hidden_outcome(self, reader.outcome)
            else:
                break
            if not reader.more():
                break
            event = reader.feed(b"")
        if self.statements.requests.blocked:
            # The client whose messages wait is the last one queued on this server.
            sender = self.chain[-1] if self.chain else self.client
            if sender is not None:
                outbox.resume_rewriting(sender)

    def _fatal(self, out: bytes) -> bool:
        """Replies no client takes (an idle server's, or a server's whose client left) are
        dropped. A FATAL among them says the backend is going (pg_terminate_backend, an
        administrator's shutdown, idle_session_timeout): the server is closed now, so no
        client is handed it before its end of file comes. True if closed."""
        fields = m.fatal_error(out)
        if fields is None:
            return False
        self._gone(f"server sent FATAL when not linked: {fields.get('M', '')}")
        return True

    def _gone(self, reason: str) -> None:
        """Close now and tell the pooler at once, not at connection_lost: no client may be
        handed this server meanwhile."""
        self.close(reason)
        self.pooler.server_closed(self, reason)

    def at_message_boundary(self) -> bool:
        """Whether the next byte from the server starts a message (nothing half-relayed)."""
        return self.reader.at_message_boundary()
