"""One client connection: an asyncio adapter around the sans-IO core.

States: STARTUP, AUTH, WELCOME, IDLE, WAITING, ACTIVE, CLOSED, changed only through the
(state, event) table in core/states.py, which says what each means.

The login is net/client_login.py's, around core/client_login.py's exchanges (the startup
packet, TLS, then the password). After it, every byte the client sends goes to the request
reader (core/frontend.py), which frames it, counts it in the client's FrontendLedger
(core/ledger.py) and rewrites it for prepared statements; this Protocol sends what the
reader returns to the linked server, or keeps it in its outbox until one is assigned
(net/outbox.py, which also rewrites it at the link), and acts where the reader stops
(Terminate, a protocol error). Each ReadyForQuery its server forwards is judged by
pooler/transactions.py: the server goes back to the pool only on ReadyForQuery 'I' with the
ledger owed nothing.

It owns the socket, the client's state and its flow control; its fields are said in
net/records.py, and what a transaction means for the server is decided elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ..core.states import ClientEvent, ClientState, client_transition
from ..protocol import errors
from ..protocol import messages as m
from ..protocol.errors import PoolerError
from ..protocol.framing import FramingError
from . import outbox, pipeline
from .client_login import ClientLogin
from .flow_control import LARGE_READ
from .records import ClientRecord
from .tls_records import RECORD_MAX, write_in_records

if TYPE_CHECKING:
    from .records import PoolerPort

log = logging.getLogger("pypool.client")


class ClientConnection(ClientRecord, asyncio.Protocol):
    """A client of the pooler, from its first byte to its Terminate."""

    def __init__(self, pooler: PoolerPort) -> None:
        ClientRecord.__init__(self, pooler)  # its fields, said once (net/records.py)
        self.transport: asyncio.Transport | None = None
        # Its login, to its ReadyForQuery (net/client_login.py); None after the welcome,
        # which is the last the login does: an idle client holds none of it.
        self.login = ClientLogin(self)
        self._reading_paused = False
        self._yielding = False  # between a large read and the loop's next turn

    def on(self, event: int, now: float = 0.0) -> None:
        """Move to the state the table (core/states.py) gives for `event` (at `now`, when
        the caller has just read the clock)."""
        self.state = client_transition(self.state, event)
        self.state_since = now or self.pooler.now()

    def on_link(self, event: int, now: float = 0.0) -> int:
        """Move its link (core/link.py) on `event`; return the actions the caller carries
        out. What it shows as (IDLE, WAITING, ACTIVE) follows the link's state, and a link
        that ends (GONE) ends the client: its own table's CLOSED (core/states.py), from
        whatever state its login had reached, so one event moves both."""
        link = self.link
        actions = link.on(event)
        shown = link.shown
        if shown is not self.state:
            self.state = (shown if shown is not ClientState.CLOSED
                          else client_transition(self.state, ClientEvent.CLOSED))
            self.state_since = now or self.pooler.now()
        return actions

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        assert self.login is not None
        self.login.connected(transport)  # who it is (its address, its uid), then its startup
        self.pooler.client_connected(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state is not ClientState.CLOSED:
            self.pooler.client_closed(self, "client closed the connection")

    def pause_writing(self) -> None:
        self.writing_paused = True
        if self.server is not None:
            self.server.pause_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.server is not None:
            self.server.resume_reading()

    def write(self, data: bytes) -> None:
        if self.transport is not None and self.state is not ClientState.CLOSED:
            if self.trace is not None:
                self.trace.client_write(self, data)
            if len(data) > RECORD_MAX and self.tls_info:
                write_in_records(self.transport, data)  # PostgreSQL's record size
            else:
                self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        if self.trace is not None:
            self.trace.client_read(self, data)
        if self.txlog is not None:
            self.txlog.client_data(self, len(data))
        try:
            if self.state is ClientState.ACTIVE or self.state is ClientState.IDLE:
                if self.pool is not None:  # None on the admin console
                    self.pool.stats.bytes_received += len(data)
                self.relay(data)
            elif self.state is ClientState.WAITING:
                self.relay(data)
            elif self.state is ClientState.STARTUP:
                assert self.login is not None
                self.login.startup_data(data)
            elif self.state is ClientState.AUTH:
                assert self.login is not None
                self.login.auth_data(data)
            elif self.state is ClientState.WELCOME:
                # Nothing is expected before ReadyForQuery; keep it for later, up to a
                # point (a login can wait long for its pool's first server).
                self.reader.keep(data)
                outbox.hold_back(self)
        except PoolerError as exc:
            self.fail(exc)
        except FramingError as bad:  # own name: mypyc types a name by its first except
            self.fail(errors.ClientProtocolError(str(bad)))
        if len(data) >= LARGE_READ:
            self.take_turns(self.pooler.loop)  # the other connections first (flow_control)

    # --- closing --------------------------------------------------------------------------

    def fail(self, exc: PoolerError) -> None:
        """Send the error; close if it is fatal."""
        level = logging.WARNING if exc.side is errors.Side.CLIENT else logging.INFO
        if self.pooler.settings.pooler.log_pooler_errors:
            log.log(level, "%r: pooler error: %s (%s)", self, exc.message, exc.sqlstate)
        severity = "FATAL" if exc.fatal else "ERROR"
        error = m.error_response(exc.message, exc.sqlstate, severity)
        if not exc.fatal:
            self.write(error)
            return
        if self.state is ClientState.CLOSED:
            return
        # Closed (and its "closing because" logged) before the error goes out, as PgBouncer
        # logs it: whoever reads the error and then the log finds the line there.
        transport = self.transport
        self.pooler.client_closed(self, exc.message)
        if transport is not None:
            transport.write(error)
            transport.close()

    def close(self, reason: str) -> None:
        if self.state is ClientState.CLOSED:
            return
        self.pooler.client_closed(self, reason)
        if self.transport is not None:
            self.transport.close()

    def welcome(self, server_params: dict[str, str], send: bool = True) -> None:
        """The end of the login (net/client_login.py): AuthenticationOk to ReadyForQuery.
        `send` False: a client taken over from another process, welcomed there already."""
        login, self.login = self.login, None
        if login is not None:
            login.welcome(server_params, send)
            if send and self.state is ClientState.IDLE:  # logged in: PgBouncer 1.26's count
                if self.pool is not None:
                    self.pool.stats.client_login_count += 1
                elif self.admin is not None:
                    self.pooler.console_logins += 1

    # --- the hot path: client to server (framing, counting, rewriting: core/frontend.py) ---

    def relay(self, data: bytes) -> None:
        """Feed the client's bytes to the request reader and send what it returns to the
        linked server (or keep it until one is assigned)."""
        server = self.server
        st = server.statements if server is not None and self.statements is not None else None
        reader = self.reader
        rest_owed = reader.skip  # of a message whose start went to the server
        out = reader.feed(data, st, server is not None)
        if reader.blocked:
            outbox.hold_back(self)  # what it sends meanwhile waits unread: up to a point
        if reader.noticed:
            self.pooler.session_changed(self)  # pooler/transactions.py
        now = 0.0  # read once, here, for the query's start and a link or a wait it begins
        if reader.began:
            now = self.query_start = self.pooler.now()
            if self.tx_status == m.TX_IDLE:
                self.xact_start = now
        if out:
            if reader.segment_end and not self.outbox:
                # take_outbox need not look again at these very bytes
                self.outbox_segment = (out, reader.segment_end)
            self.forward(out, now)
            if st is not None and server is not None:
                pipeline.sent(self, server, st)  # waiting clients may queue behind it
        if st is not None and server is not None:
            outbox.answer_own(self, server)  # replies the pooler makes, in their turn
        if rest_owed and not reader.skip and server is not None:
            # That message is whole on the server now: a ReadyForQuery that came before
            # its end is judged now (pooler/transactions.py `message_sent`).
            self.pooler.message_sent(self)
        if reader.terminated:
            self.close("client sent Terminate")
        elif reader.error is not None:
            exc, reader.error = reader.error, None
            raise exc

    def forward(self, data: bytes, now: float = 0.0) -> None:
        """To the linked server, the console, or the outbox until a server is linked (`now`:
        the clock, when the caller has just read it)."""
        server = self.server
        if server is not None:
            server.send(data)
        elif self.admin is not None:
            self.admin.received(data)
        else:
            outbox.keep(self, data, now)
