"""One client connection: its login, and the client-to-server hot path.

States: STARTUP, AUTH, WELCOME, IDLE, WAITING, ACTIVE, CLOSED, changed only through the
(state, event) table in core/states.py, which says what each means.

Reply bookkeeping, which decides when a server can be handed on, is the sans-IO
`FrontendLedger` (core/ledger.py): this Protocol tells it each message type the client sends
and each ReadyForQuery and COPY reply the server forwards. A server goes back to the pool
only on ReadyForQuery 'I' with the ledger owed nothing.

Prepared statements (pooling/prepared/): when they are rewritten (`statements`), Parse,
Bind, Describe, Close and Query messages are read whole and handed, with every other request,
to the linked server's ServerStatements, which returns the bytes to send. A client with no
server keeps whole messages in its outbox; they are rewritten when it is linked.
"""

from __future__ import annotations

import asyncio
import logging
import pwd
import socket
import struct
from collections.abc import Generator
from typing import TYPE_CHECKING, Final

from ..core import client_login
from ..core import ledger as lg
from ..core.client_login import Authenticated, FirstPacket, StartTls, StartupTls
from ..core.exchange import advance
from ..core.ledger import FrontendLedger
from ..core.states import ClientEvent, ClientState, client_transition
from ..pooling import prepared
from ..pooling.params import canonical_name, same_encoding
from ..protocol import errors
from ..protocol import messages as m
from ..protocol.errors import PoolerError
from ..protocol.framing import FramingError
from ..protocol.startup import CancelRequest
from . import tls
from .flow_control import ReadingSwitch

if TYPE_CHECKING:
    from ..pooler import Pooler
    from ..pooling.pool import Pool
    from .hooks import ConsoleSession
    from .server import ServerConnection

log = logging.getLogger("pypool.client")

_ids = iter(range(1, 1 << 62))


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
        self.ledger = FrontendLedger()
        self._drop = 0  # bytes still to drop of a message the ledger said to drop
        self._need = 0  # size `_partial` must reach before it holds a whole message
        self.writing_paused = False  # our socket is above its high-water mark
        self._outbox_size = 0
        self.close_after_release = False
        self._outbox: list[bytes] = []
        # A driver segment in the outbox, and the end of its Bind (see _relay's fast path).
        self._outbox_segment: tuple[bytes, int] = (b"", 0)
        # Prepared-statement rewriting (None when off: session mode, max_prepared_statements
        # = 0, the admin console). While `_blocked`, what the client sends waits: uncounted
        # bytes in `_partial`, counted ones taken from the outbox in `_held`.
        self.statements: prepared.ClientStatements | None = None
        self._blocked = False
        self._held = b""
        # The login (core/client_login.py): the startup packet's exchange, what the client
        # sends between its StartupMessage and start_auth(), then the password exchange.
        self._startup: Generator[bytes, bytes, FirstPacket | StartTls] = (
            client_login.read_startup())
        next(self._startup)
        # TLS (net/tls.py): the `tls` column of SHOW CLIENTS ("" in plaintext), and the
        # tls-server-end-point data SCRAM-SHA-256-PLUS binds to.
        self.tls_info = ""
        self._channel_binding: bytes | None = None
        self._startup_buffer = bytearray()
        self._auth: Generator[bytes, bytes, Authenticated] | None = None
        self._skip = 0
        self._partial = bytearray()
        self._reading_paused = False
        self._max_packet = pooler.settings.pooler.max_packet_size

    def __repr__(self) -> str:
        return f"C-{self.id}:{self.database}/{self.user}@{self.peer[0]}:{self.peer[1]}"

    def on(self, event: int) -> None:
        """Move to the state the table (core/states.py) gives for `event`."""
        self.state = client_transition(self.state, event)
        self.state_since = self.pooler.now()

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer = (str(peer[0]), int(peer[1]))
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        elif sock is not None and sock.family == socket.AF_UNIX:
            self.peer = ("unix", self.pooler.settings.pooler.listen_port)
            try:
                creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                        struct.calcsize("3i"))
                self.peer_uid = int(struct.unpack("3i", creds)[1])  # pid, uid, gid
            except OSError as exc:
                log.warning("%r: unix peer uid failed: %s", self, exc)
        startup_tls = self.pooler.tls.client.startup(over_unix_socket=self.peer[0] == "unix")
        self._startup = client_login.read_startup(startup_tls)
        next(self._startup)
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
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        try:
            if self.state is ClientState.ACTIVE or self.state is ClientState.IDLE:
                if self.pool is not None:  # None on the admin console
                    self.pool.stats.bytes_received += len(data)
                self._relay(data)
            elif self.state is ClientState.WAITING:
                self._relay(data)
            elif self.state is ClientState.STARTUP:
                self._startup_data(data)
            elif self.state is ClientState.AUTH:
                self._auth_data(data)
            elif self.state is ClientState.WELCOME:
                # Nothing is expected before ReadyForQuery; keep it for later.
                self._partial += data
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
        self.write(m.error_response(exc.message, exc.sqlstate, severity))
        if exc.fatal:
            self.close(exc.message)

    def close(self, reason: str) -> None:
        if self.state is ClientState.CLOSED:
            return
        self.pooler.client_closed(self, reason)
        if self.transport is not None:
            self.transport.close()

    # --- startup and authentication (the exchanges are core/client_login.py) --------------

    def _startup_data(self, data: bytes) -> None:
        if self.user:
            # The StartupMessage is in and auth_query is looking the user up: what follows
            # waits, bounded, for start_auth().
            self._startup_buffer += data
            client_login.check_held(self._startup_buffer)
            return
        first = advance(self._startup, data, self.write)
        if first is None:
            return
        if isinstance(first, StartTls):
            self._start_tls(first.hello)
            return
        packet = first.packet
        if isinstance(packet, CancelRequest):
            self.pooler.forward_cancel(packet.pid, packet.secret)
            self.close("cancel request")
            return
        settings = self.pooler.settings.pooler
        self.user, self.database = client_login.login_names(packet.params)
        self.startup_params = packet.params
        self.params.update(client_login.tracked_parameters(
            packet.params, settings.track_extra_parameters, settings.ignore_startup_parameters))
        if settings.log_connections:
            log.info("%r: login attempt: db=%s user=%s tls=%s", self, self.database, self.user,
                     self.tls_info or "no")
        self._startup_buffer += first.rest
        self.pooler.begin_authentication(self)
        if self.state is ClientState.STARTUP:
            client_login.check_held(self._startup_buffer)

    def start_auth(self, secret: str | None, auth_type: str) -> None:
        """Ask for the client's password in the way `auth_type` and the secret allow.

        `secret` None means the user is unknown: the exchange still runs in full and fails
        as a wrong password would.
        """
        if auth_type in ("trust", "any"):
            self.authenticated(None)
        elif auth_type == "peer":
            client_login.check_peer(self.user, secret, self._peer_os_user())
            self.authenticated(None)
        elif auth_type == "cert":
            problem = client_login.cert_login_problem(
                self.user, secret, bool(self.tls_info), tls.peer_common_names(self.transport))
            if problem is not None:
                log.warning("%r: %s", self, problem)
                raise PoolerError(client_login.CERT_LOGIN_FAILED, errors.INVALID_AUTHORIZATION,
                                  side=errors.Side.CLIENT)
            self.authenticated(None)
        else:
            self.on(ClientEvent.AUTH_REQUESTED)
            self._auth = client_login.password_exchange(self.user, secret, auth_type,
                                                        self._max_packet, self._channel_binding)
            self.write(next(self._auth))  # the authentication request
        if self._startup_buffer and self.state is not ClientState.CLOSED:
            # What the client sent after its StartupMessage while auth_query ran (or in the
            # same read as it).
            rest = bytes(self._startup_buffer)
            self._startup_buffer.clear()
            self.data_received(rest)

    def _start_tls(self, hello: bytes) -> None:
        """'S' went out: what the client sends next is its TLS ClientHello, for the TLS
        layer start_tls puts under this Protocol, not for `data_received`. Direct TLS:
        `hello` is the start of the ClientHello, already read."""
        assert self.transport is not None
        timeout = self.pooler.settings.pooler.client_login_timeout
        if hello:
            self.pooler.spawn(tls.accept_direct(self, self.pooler.tls, timeout, hello))
            return
        self.transport.pause_reading()
        self.pooler.spawn(tls.accept_client(self, self.pooler.tls, timeout))

    def tls_started(self, transport: asyncio.Transport, client_tls: tls.ClientTls,
                    direct: bool = False) -> None:
        """The handshake is done: the startup packets are read again, now inside TLS. Direct
        TLS (no SSLRequest first) must have agreed on ALPN `postgresql`, as PostgreSQL 17
        requires: that is what keeps a TLS connection meant for another protocol out."""
        self.transport = transport
        self.tls_info = tls.connection_info(transport, client_tls.curve)
        self._channel_binding = client_tls.channel_binding
        self._startup = client_login.read_startup(StartupTls(active=True))
        next(self._startup)
        if direct and tls.alpn_protocol(transport) != tls.ALPN_POSTGRESQL:
            self.fail(errors.ClientProtocolError(
                "received direct SSL connection request without ALPN protocol negotiation "
                "extension"))

    def tls_failed(self, reason: str) -> None:
        log.warning("%r: %s", self, reason)
        self.close(reason)

    def _peer_os_user(self) -> str | None:
        """The name of the OS user at the other end of the unix socket; None over TCP."""
        if self.peer_uid is None:
            return None
        try:
            return pwd.getpwuid(self.peer_uid).pw_name
        except KeyError:
            return None

    def _auth_data(self, data: bytes) -> None:
        exchange = self._auth
        assert exchange is not None
        done = advance(exchange, data, self.write)
        if done is None:
            return
        self._auth = None
        if done.reply:
            self.write(done.reply)
        self.authenticated(done.client_key)
        if self.state is not ClientState.AUTH and done.rest:
            self._partial += done.rest

    def authenticated(self, scram_client_key: bytes | None) -> None:
        """The password checked out. AuthenticationOk waits for the welcome, so that an
        unknown database or a failing server login is reported in its place."""
        self.on(ClientEvent.AUTHENTICATED)
        self.pooler.client_authenticated(self, scram_client_key)

    def welcome(self, server_params: dict[str, str]) -> None:
        """Send AuthenticationOk, ParameterStatus, BackendKeyData and ReadyForQuery."""
        out = [m.authentication(m.AUTH_OK)]
        encoding = self.params.get("client_encoding")
        server_encoding = server_params.get("client_encoding")
        if encoding and server_encoding and same_encoding(encoding, server_encoding):
            self.params["client_encoding"] = server_encoding  # reported as PostgreSQL would
        for name, value in server_params.items():
            if name in self.params:
                continue
            out.append(m.parameter_status(name, value))
        for name, value in self.params.items():
            out.append(m.parameter_status(name, value))
        # Tracked parameters the client did not set take the server's defaults.
        for name, value in server_params.items():
            if canonical_name(name, self.pooler.settings.pooler.track_extra_parameters):
                self.params.setdefault(name, value)
        out.append(m.backend_key_data(*self.cancel_key))
        out.append(m.ready_for_query(m.TX_IDLE))
        self.write(b"".join(out))
        self.on(ClientEvent.WELCOMED)
        cfg = self.pooler.settings.pooler
        pool = self.pool
        if (cfg.max_prepared_statements > 0 and pool is not None and self.admin is None
                and pool.limits.pool_mode != "session" and self.statements is None):
            self.statements = prepared.ClientStatements(
                self.pooler.statement_registry, cfg.max_client_prepared_statements
            )
        self.carry_on()

    # --- the hot path: client to server ---------------------------------------------------

    def _relay(self, data: bytes) -> None:
        """Walk the client's message headers, keep the reply bookkeeping, forward the bytes
        to the linked server (or hold them until one is assigned)."""
        if self._blocked:
            self._partial += data
            return
        if self._partial:
            # An incomplete message waits for its end: gather the pieces, and walk them
            # only once it is whole (a 64 MiB Bind arrives in thousands of reads).
            partial = self._partial
            partial += data
            if len(partial) < self._need:
                return
            data = bytes(partial)
            partial.clear()
            self._need = 0
        if self._drop:
            if len(data) <= self._drop:
                self._drop -= len(data)
                return
            data = data[self._drop :]
            self._drop = 0
        n = len(data)
        pos = self._skip
        if pos >= n:
            self._skip = pos - n
            self._forward(data)
            return
        self._skip = 0
        server = self.server
        ledger = self.ledger
        if pos == 0 and self.statements is not None and not ledger.unsynced:
            # The steady state of libpq-style drivers: one whole Bind, Describe, Execute,
            # Sync of a prepared statement, done in one step (ServerStatements.bind_segment).
            bind_end = prepared.driver_segment(data)
            if 13 <= bind_end <= self._max_packet:
                st = server.statements if server is not None else None
                fast = data if st is None else st.bind_segment(data, bind_end)
                if fast is not None:
                    if not ledger.pending:
                        self.query_start = self.pooler.now()
                        if self.tx_status == m.TX_IDLE:
                            self.xact_start = self.query_start
                    ledger.request(_SYNC)
                    if st is None and not self._outbox:
                        # take_outbox need not look again at these very bytes
                        self._outbox_segment = (fast, bind_end)
                    self._forward(fast)
                    if st is not None and server is not None:
                        self._sent(server, st)
                    return
        was_idle = ledger.idle()
        admin = self.admin is not None
        max_packet = self._max_packet
        # Prepared statements: messages to rewrite are read whole (so are all messages while
        # there is no server), and `parts` collects the rewritten bytes up to `start`.
        rewriting = self.statements is not None
        st = server.statements if rewriting and server is not None else None
        parts: list[bytes] = []
        start = 0
        while n - pos >= 5:
            kind = data[pos]
            size = int.from_bytes(data[pos + 1 : pos + 5], "big") + 1
            if size < 5 or size > max_packet:
                self._forward(self._rewritten(data, pos, parts, start))
                raise errors.ClientProtocolError(f"invalid packet length {size - 1}")
            if rewriting:
                end = pos + size
                if end > n and (st is None or _WHOLE[kind] or st.discarding):
                    break
                # A Sync in copy-in is ignored by PostgreSQL: no request for its queue either.
                if st is not None and _REQUESTS[kind] and not (
                        kind == _SYNC and ledger.copy == _COPY_IN):
                    try:
                        out = st.from_client(kind, data, pos, end)
                    except (ValueError, IndexError):
                        self._forward(self._rewritten(data, pos, parts, start))
                        raise errors.ClientProtocolError(
                            f"malformed message of type {chr(kind)!r}") from None
                    if out is not None:
                        if out is prepared.WAIT:
                            self._blocked = True  # resume_rewriting() carries on from here
                            break
                        if start < pos:
                            parts.append(data[start:pos])
                        parts.append(out)  # type: ignore[arg-type]
                        start = end
            action = _ACTION[kind]
            if action == _OPENS_SEGMENT:
                ledger.segment()
            elif action == _OWES_READY:
                ledger.request(kind)
            elif action == _FLUSH or action == _COPY_MESSAGE:
                # Flush asks for pending output and owes no reply of its own: it must not
                # pin a server (psycopg's pipeline sends one after its Sync). With nothing
                # owed and no server, it is dropped rather than take a server for nothing.
                # CopyData/CopyDone/CopyFail when nothing is owed belong to a COPY that
                # already failed: PostgreSQL would ignore them, and no reply will come.
                if action == _FLUSH:
                    drop = self.server is None and ledger.idle() and size == 5
                else:
                    drop = not ledger.copy_message(kind)
                if drop:
                    if pos:
                        self._forward(self._rewritten(data, pos, parts, start))
                    end = pos + size
                    if end > n:
                        self._drop = end - n
                        return
                    data = data[end:]
                    n, pos, parts, start = len(data), 0, [], 0
                    continue
            elif action == _TERMINATE:
                if pos:
                    self._forward(self._rewritten(data, pos, parts, start))
                self.close("client sent Terminate")
                return
            else:
                if pos:
                    self._forward(self._rewritten(data, pos, parts, start))
                raise errors.ClientProtocolError(f"unsupported pkt type: {kind}")
            if admin and kind != _QUERY:
                raise PoolerError("extended query protocol not supported by admin console")
            pos += size
        if pos > n:
            self._skip = pos - n
        elif pos < n:
            self._partial[:] = memoryview(data)[pos:]
            # The whole message's size once its header is here (else its header's).
            self._need = (int.from_bytes(data[pos + 1 : pos + 5], "big") + 1
                          if n - pos >= 5 else 5)
            data = data[:pos]
        if was_idle and not ledger.idle():
            self.query_start = self.pooler.now()
            if self.tx_status == m.TX_IDLE:
                self.xact_start = self.query_start
        if parts:
            if start < len(data):
                parts.append(data[start:])
            data = b"".join(parts)
        if data:
            self._forward(data)
            if st is not None and server is not None:
                self._sent(server, st)
        elif st is not None and st.tracking == 2 and server is not None:
            if server.client is self and server.at_message_boundary():
                self.write(st.emit_synthetic())

    def _sent(self, server: ServerConnection, st: prepared.ServerStatements) -> None:
        """After the client's messages went to its server: let waiting clients queue behind
        a whole transaction that ends at its Sync (net/pipeline.py); send what the pooler
        answers itself when it is the client's turn."""
        ledger = self.ledger
        if ledger.pending == 1 and not ledger.unsynced and st.last_neutral is not False:
            self.pooler.pipeline(server)
        if st.tracking == 2 and server.client is self and server.at_message_boundary():
            self.write(st.emit_synthetic())

    @staticmethod
    def _rewritten(data: bytes, pos: int, parts: list[bytes], start: int) -> bytes:
        """The bytes for the server up to `pos`: the rewritten ones, then the rest as is."""
        if not parts:
            return data[:pos]
        return b"".join(parts) + data[start:pos]

    def _forward(self, data: bytes) -> None:
        server = self.server
        if server is not None:
            server.send(data)
            return
        if self.admin is not None:
            self.admin.received(data)
            return
        self._outbox.append(data)
        self._outbox_size += len(data)
        if self._outbox_size > OUTBOX_HIGH_WATER:
            # Waiting for a server with this much to send: stop reading until linked, as a
            # socket buffer would fill.
            self.pause_reading()
        if self.state is ClientState.IDLE:
            self.pooler.request_server(self)

    def take_outbox(self, server: ServerConnection | None = None) -> bytes:
        """What the client sent while it had no server, for `server` that it is linked to
        now (rewritten for it when prepared statements are)."""
        outbox = self._outbox
        segment, bind_end = self._outbox_segment
        self._outbox_segment = (b"", 0)
        if self._outbox_size > OUTBOX_HIGH_WATER and self._reading_paused and (
            server is None or not server.writing_paused
        ):
            self.resume_reading()
        self._outbox_size = 0
        if len(outbox) == 1:
            data = outbox[0]
            if data is not segment:
                bind_end = 0
        else:
            data = b"".join(outbox)
            bind_end = 0
        outbox.clear()
        if self.statements is None or server is None:
            return data
        st = server.statements
        return st.attach(self.statements) + self._rewrite_whole(st, data, bind_end)

    def _rewrite_whole(self, st: prepared.ServerStatements, data: bytes,
                       bind_end: int = 0) -> bytes:
        """Rewrite whole, already counted messages; on WAIT keep the rest in `_held`.
        `bind_end`: data is a driver segment with its Bind ending there, if known."""
        bind_end = bind_end or (prepared.driver_segment(data) if data else 0)
        if bind_end:
            fast = st.bind_segment(data, bind_end)
            if fast is not None:
                return fast
        parts = []
        start = pos = 0
        n = len(data)
        while pos < n:
            kind = data[pos]
            end = pos + 1 + int.from_bytes(data[pos + 1 : pos + 5], "big")
            if _REQUESTS[kind]:
                try:
                    out = st.from_client(kind, data, pos, end)
                except (ValueError, IndexError):
                    # A malformed message: send what came before it, then drop the client
                    # (not from here: this may run inside the server's relay).
                    exc = errors.ClientProtocolError(f"malformed message of type {chr(kind)!r}")
                    self.pooler.loop.call_soon(self.fail, exc)
                    n = pos
                    break
                if out is not None:
                    if out is prepared.WAIT:
                        self._blocked = True
                        self._held = data[pos:]
                        n = pos
                        break
                    parts.append(data[start:pos])
                    parts.append(out)  # type: ignore[arg-type]
                    start = end
            pos = end
        if not parts:
            return data[:n]
        parts.append(data[start:n])
        return b"".join(parts)

    def resume_rewriting(self) -> None:
        """The reply a WAIT depended on has come (or the server was released): carry on
        with what the client sent meanwhile."""
        if not self._blocked:
            return
        self._blocked = False
        server = self.server
        if server is not None:
            server.statements.blocked = False
        held, self._held = self._held, b""
        if held:
            if server is not None:
                out = self._rewrite_whole(server.statements, held)
                if out:
                    server.send(out)
                if self._blocked:
                    return
            else:
                self._forward(held)
        self.carry_on()

    def carry_on(self) -> None:
        """Relay what the client sent while it had to wait (login, a WAIT, a SET)."""
        if self._partial:
            rest = bytes(self._partial)
            self._partial.clear()
            self._need = 0
            self._relay(rest)

    def params_seen(self, name: str, value: str) -> None:
        """A ParameterStatus from the linked server: the client's setting changed."""
        self.params[name] = value

    def ready_for_query(self, status: int) -> None:
        """Called by the linked server for each ReadyForQuery it forwards to this client."""
        self.tx_status = status
        pool = self.pool
        assert pool is not None
        stats = pool.stats
        stats.query_count += 1
        ledger = self.ledger
        if not ledger.ready():
            return
        if ledger.doubtful and self.server is not None:
            # The count of replies owed may be wrong (core/ledger.py): never hand it on.
            self.server.close("reply bookkeeping in doubt after a failed COPY")
            return
        now = self.pooler.now()
        stats.query_time_us += int((now - self.query_start) * 1e6)
        self.state_since = now
        mode = pool.limits.pool_mode
        if status == m.TX_IDLE:
            if mode != "session":
                self.pooler.release(self, now)
            else:
                stats.xact_count += 1
        elif self.state is ClientState.CLOSED or (
            self.server is not None and self.server.chain
        ):
            # A client that left inside a transaction (its replies were still to come behind
            # a pipeline), or a pipelined transaction that did not end at its Sync: the server
            # cannot serve anyone else. Closing it rolls the transaction back.
            assert self.server is not None
            self.server.close("transaction still open where the pipeline expected none")
        elif mode == "statement":
            self.fail(PoolerError("transaction blocks not allowed in statement pooling mode"))


# What a client without a server may have sent before its reads are paused (bytes).
OUTBOX_HIGH_WATER: Final = 1 << 20


def _table(*kinds: int, value: int = 1) -> tuple[int, ...]:
    """A tuple indexed by message type byte: `value` for `kinds`, else 0 (a tuple index is
    the cheapest lookup the hot path can make)."""
    return tuple(value if kind in kinds else 0 for kind in range(256))


# What each frontend message type means for the reply bookkeeping (core/ledger.py).
_ACTION: Final = lg.ACTION
_OWES_READY: Final = lg.OWES_READY
_OPENS_SEGMENT: Final = lg.OPENS_SEGMENT
_FLUSH: Final = lg.FLUSH
_TERMINATE: Final = lg.TERMINATE
_COPY_MESSAGE: Final = lg.COPY_MESSAGE
_COPY_IN: Final = lg.COPY_IN
_QUERY: Final = m.QUERY
_SYNC: Final = m.SYNC
# Prepared statements: what the rewriting reads whole, and the requests it queues.
_WHOLE: Final = _table(m.PARSE, m.BIND, m.DESCRIBE, m.CLOSE, m.QUERY)
_REQUESTS: Final = _table(m.PARSE, m.BIND, m.DESCRIBE, m.CLOSE, m.EXECUTE, m.SYNC, m.QUERY,
                   m.FUNCTION_CALL)
