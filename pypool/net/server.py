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
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING

from ..core import replies
from ..core.server_login import ServerLoginError
from ..core.states import ServerEvent, ServerState, server_transition
from ..pooling import prepared
from ..protocol import messages as m
from . import deferred_writes, hidden_queries, outbox
from .flow_control import ReadingSwitch
from .server_login import ServerLogin
from .socket_ids import socket_ids as _ids  # shared with the other side
from .socket_options import tune_tcp

if TYPE_CHECKING:
    from ..pooler import Pooler, ServerCredentials
    from ..pooling.pool import Pool
    from .client import ClientConnection
    from .hooks import ServerTap, WireTrace

log = logging.getLogger("pypool.server")


class ServerConnection(ReadingSwitch, asyncio.Protocol):
    """A server connection. The pooler owns it; a client borrows it for a transaction."""

    def __init__(
        self, pooler: Pooler, pool: Pool, host: str, port: int, dbname: str,
        credentials: ServerCredentials, startup_params: dict[str, str],
    ) -> None:
        self.id = next(_ids)
        self.pooler = pooler
        self.pool = pool
        self.host = host
        self.port = port
        self.dbname = dbname
        self.credentials = credentials
        self.startup_params = startup_params
        self.state = ServerState.CONNECTING
        self.transport: asyncio.Transport | None = None
        self.client: ClientConnection | None = None
        self.backend_pid = 0
        self.backend_secret = 0
        # The transaction log's reader of this server's replies; None with the log off.
        self.txlog: ServerTap | None = None if pooler.txlog is None else pooler.txlog.tap(self)
        # The protocol trace (observe/trace.py) while a traced client is linked (or all are).
        self.trace: WireTrace | None = pooler.trace_all
        now = pooler.now()
        self.connect_time = now
        self.request_time = now  # when last linked or released
        # CancelRequests aimed at this server's backend not yet known to have landed: while
        # any is, the server is handed to no one (Pool.being_canceled).
        self.cancels_in_flight = 0
        # The client whose requests wait for the check's and SET's replies (pooler.link).
        self.setting_for: ClientConnection | None = None
        # Clients whose transactions are queued on this server behind the linked client's,
        # in order (net/pipeline.py); their replies follow its ReadyForQuery.
        self.chain: deque[ClientConnection] = deque()
        self.open_line = False  # listed in its pool's open_lines
        # Prepared statements on this server and the requests its replies answer.
        self.statements = prepared.ServerStatements(
            pooler.statement_registry, pooler.settings.pooler.max_prepared_statements,
            pool.stats,
        )
        # Everything read after the login: framing, the backend ledger, the server's
        # session parameters (core/replies.py).
        self.reader = replies.ReplyReader(self.statements, pool.stats)
        self.backend = self.reader.backend
        self.params = self.reader.params
        # The settings clients made here that follow them (pooling/session_state.py): name ->
        # the statement that made it, None when unsure. Undone before anyone else runs here.
        self.session_sets: dict[bytes, bytes | None] = {}
        self.close_reason = ""
        self.reader.name = repr(self)
        self.local_port = 0
        self.ready: asyncio.Future[None] = pooler.loop.create_future()
        # The login, to its first ReadyForQuery (net/server_login.py), and TLS's line of
        # SHOW SERVERS ("" in plaintext).
        self.login = ServerLogin(self)
        self.tls_info = ""
        self._reading_paused = False
        self.writing_paused = False  # our socket to PostgreSQL is above its high-water mark
        # Requests written together when this round of the event loop has read everything
        # that was ready (net/deferred_writes.py).
        self.deferred: list[bytes] = []

    # --- state ----------------------------------------------------------------------------

    def on(self, event: int) -> None:
        """Move to the state the table (core/states.py) gives for `event`."""
        self.state = server_transition(self.state, event)

    def __repr__(self) -> str:
        return f"S-{self.id}:{self.pool.database}/{self.pool.user}@{self.host}:{self.port}"

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            tune_tcp(sock, self.pooler.settings.pooler)  # TCP_NODELAY and the tcp_* keys
            try:
                self.local_port = sock.getsockname()[1]
            except OSError:
                pass
        self.on(ServerEvent.CONNECTED)
        self.login.connected()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state is ServerState.CLOSED:
            return
        if not self.ready.done():
            self.ready.set_exception(
                ServerLoginError(
                    "server closed the connection during login",
                    m.error_response("server closed the connection during login", "08006",
                                     "FATAL"),
                )
            )
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
        if self.deferred:
            self.deferred.append(data)
        else:
            assert self.transport is not None
            self.transport.write(data)

    @property
    def hidden_syncs(self) -> int:
        """Pooler-issued queries still to be answered."""
        return len(self.backend.hidden)

    @property
    def checking(self) -> bool:
        """server_check_query's reply is still to come."""
        return self.backend.checking

    def link(self, client: ClientConnection | None) -> None:
        """Serve `client` from now on (None: nobody); its ledger and session parameters
        are what the reply reader keeps up to date."""
        self.client = client
        self.trace = (client.trace if client is not None and client.trace is not None
                      else self.pooler.trace_all)
        reader = self.reader
        if client is None:
            reader.frontend = None
            reader.client_params = None
        else:
            reader.frontend = client.ledger
            reader.client_params = client.params
            reader.statement_mode = self.pool.limits.pool_mode == "statement"

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
            self._relay(data)
        if trace is not None:
            trace.server_done(self)

    def login_write(self, data: bytes) -> None:
        """Write the login's messages (core/server_login.py)."""
        if self.trace is not None:
            self.trace.server_write(self, data, True)
        assert self.transport is not None
        self.transport.write(data)

    # --- the hot path: server to client (framing and judging: core/replies.py) -------------

    def _relay(self, data: bytes) -> None:
        """Feed the server's bytes to the reply reader, write what it leaves for the client,
        and act where it stops: a client's ReadyForQuery, a settled pooler-issued query."""
        reader = self.reader
        event = reader.feed(data)
        while True:
            out = reader.out
            if out:
                client = self.client
                if client is not None:
                    client.write(out[0] if len(out) == 1 else b"".join(out))
                out.clear()
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
        if self.statements.blocked:
            # The client whose messages wait is the last one queued on this server.
            sender = self.chain[-1] if self.chain else self.client
            if sender is not None:
                outbox.resume_rewriting(sender)

    def at_message_boundary(self) -> bool:
        """Whether the next byte from the server starts a message (nothing half-relayed)."""
        return self.reader.at_message_boundary()
