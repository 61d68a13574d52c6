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

It owns the socket, the client's state and its flow control; what a transaction means for
the server is decided elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import TYPE_CHECKING

from ..core.frontend import RequestReader
from ..core.states import ClientState, client_transition
from ..pooling import prepared
from ..pooling import session_state as ss
from ..protocol import errors
from ..protocol import messages as m
from ..protocol.errors import PoolerError
from ..protocol.framing import FramingError
from . import outbox
from .client_login import ClientLogin
from .flow_control import ReadingSwitch
from .socket_ids import socket_ids as _ids  # shared with the other side
from .socket_options import tune_tcp
from .unix_socket import peer_uid

if TYPE_CHECKING:
    from ..pooler import Pooler
    from ..pooling.pool import Pool
    from .hooks import ConsoleSession, TransactionLog, WireTrace
    from .server import ServerConnection

log = logging.getLogger("pypool.client")


class ClientConnection(ReadingSwitch, asyncio.Protocol):
    """A client of the pooler, from its first byte to its Terminate."""

    def __init__(self, pooler: Pooler) -> None:
        self.id = next(_ids)
        self.pooler = pooler
        self.state = ClientState.STARTUP
        self.transport: asyncio.Transport | None = None
        self.peer = ("", 0)  # ("unix", listen_port) on the unix socket, as PgBouncer shows it
        # On the unix socket: the peer process's uid (SO_PEERCRED), for `auth_type = peer` and
        # the console's `pgbouncer` login; None over TCP.
        self.peer_uid: int | None = None
        # Logged into the console as user `pgbouncer` by the pooler's own OS user over the
        # unix socket (PgBouncer's own_user): an admin without a password.
        self.own_user = False
        self.user = ""
        self.database = ""
        self.pool: Pool | None = None
        self.server: ServerConnection | None = None
        self.admin: ConsoleSession | None = None  # set when connected to the console
        # Tracked session parameters as this client should see them.
        self.params: dict[str, str] = {}
        self.startup_params: dict[str, str] = {}
        self.cancel_key = (0, 0)
        now = pooler.now()
        self.connect_time = now
        self.state_since = now  # when the current state (IDLE, WAITING, ...) began
        self.wait_start = 0.0
        self.link_time = 0.0
        self.query_start = 0.0
        self.xact_start = 0.0  # when its current transaction began (transaction_timeout)
        self.wait_notified = False  # query_wait_notify's NOTICE sent for this wait
        self.check_failures = 0  # servers in a row that failed server_check_query for it
        self.tx_status = m.TX_IDLE
        # The transaction log (observe/txlog.py), fed each read; None with the log off.
        self.txlog: TransactionLog | None = pooler.txlog
        # The protocol trace (observe/trace.py) when this client is traced; else None.
        self.trace: WireTrace | None = pooler.trace_all
        # What the client sends after login: framed, counted by its ledger and rewritten
        # for prepared statements (core/frontend.py).
        self.reader = RequestReader(pooler.settings.pooler.max_packet_size)
        self.ledger = self.reader.ledger
        self.writing_paused = False  # our socket is above its high-water mark
        self.close_after_release = False
        # What it sent while it had no server (net/outbox.py), its size, and the driver
        # segment in it with the end of its Bind (see relay's fast path).
        self.outbox: list[bytes] = []
        self.outbox_size = 0
        self.outbox_segment: tuple[bytes, int] = (b"", 0)
        # Prepared-statement rewriting (None when off: session mode, max_prepared_statements
        # = 0, the admin console).
        self.statements: prepared.ClientStatements | None = None
        # The session state that follows or pins it (transaction mode, session_state =
        # follow; pooling/session_state.py); None when it is not looked at.
        self.session: ss.ClientSession | None = None
        # The login, to its ReadyForQuery (net/client_login.py), and TLS's line of SHOW
        # CLIENTS ("" in plaintext).
        self.login = ClientLogin(self)
        self.tls_info = ""
        self._reading_paused = False

    def __repr__(self) -> str:
        return f"C-{self.id}:{self.database}/{self.user}@{self.peer[0]}:{self.peer[1]}"

    def on(self, event: int, now: float = 0.0) -> None:
        """Move to the state the table (core/states.py) gives for `event` (at `now`, when
        the caller has just read the clock)."""
        self.state = client_transition(self.state, event)
        self.state_since = now or self.pooler.now()

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer = (str(peer[0]), int(peer[1]))
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            tune_tcp(sock, self.pooler.settings.pooler)  # TCP_NODELAY and the tcp_* keys
        elif sock is not None and sock.family == socket.AF_UNIX:
            self.peer = ("unix", self.pooler.settings.pooler.listen_port)
            try:
                self.peer_uid = peer_uid(sock)
            except OSError as exc:
                log.warning("%r: unix peer uid failed: %s", self, exc)
        self.login.connected(over_unix_socket=self.peer[0] == "unix")
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
                self.login.startup_data(data)
            elif self.state is ClientState.AUTH:
                self.login.auth_data(data)
            elif self.state is ClientState.WELCOME:
                # Nothing is expected before ReadyForQuery; keep it for later.
                self.reader.partial += data
        except PoolerError as exc:
            self.fail(exc)
        except FramingError as bad:  # own name: mypyc types a name by its first except
            self.fail(errors.ClientProtocolError(str(bad)))

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

    def welcome(self, server_params: dict[str, str]) -> None:
        """The end of the login (net/client_login.py): AuthenticationOk to ReadyForQuery."""
        self.login.welcome(server_params)

    # --- the hot path: client to server (framing, counting, rewriting: core/frontend.py) ---

    def relay(self, data: bytes) -> None:
        """Feed the client's bytes to the request reader and send what it returns to the
        linked server (or keep it until one is assigned)."""
        server = self.server
        st = server.statements if server is not None and self.statements is not None else None
        reader = self.reader
        out = reader.feed(data, st, server is not None)
        if reader.changes or reader.refused:
            self.pooler.session_changed(self)  # pooler/transactions.py
        if reader.began:
            self.query_start = self.pooler.now()
            if self.tx_status == m.TX_IDLE:
                self.xact_start = self.query_start
        if out:
            if reader.segment_end and not self.outbox:
                # take_outbox need not look again at these very bytes
                self.outbox_segment = (out, reader.segment_end)
            self.forward(out)
            if st is not None and server is not None:
                self._sent(server, st)
        elif st is not None and st.tracking == 2 and server is not None:
            if server.client is self and server.at_message_boundary():
                self.write(st.emit_synthetic())
        if reader.terminated:
            self.close("client sent Terminate")
        elif reader.error is not None:
            exc, reader.error = reader.error, None
            raise exc

    def _sent(self, server: ServerConnection, st: prepared.ServerStatements) -> None:
        """After the client's messages went to its server: let waiting clients queue behind
        a whole transaction that ends at its Sync (net/pipeline.py); send what the pooler
        answers itself when it is the client's turn."""
        ledger = self.ledger
        session = self.session
        if (ledger.pending == 1 and not ledger.unsynced and st.last_neutral is not False
                and (session is None or not (session.pins or session.pending))):
            self.pooler.pipeline(server)
        if st.tracking == 2 and server.client is self and server.at_message_boundary():
            self.write(st.emit_synthetic())

    def forward(self, data: bytes) -> None:
        """To the linked server, the console, or the outbox until a server is linked."""
        server = self.server
        if server is not None:
            server.send(data)
        elif self.admin is not None:
            self.admin.received(data)
        else:
            outbox.keep(self, data)

    def params_seen(self, name: str, value: str) -> None:
        """A ParameterStatus from the linked server: the client's setting changed."""
        self.params[name] = value
