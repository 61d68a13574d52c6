"""One connection from the pooler to PostgreSQL: its login, and the server-to-client hot path.

States: CONNECTING, LOGIN, IDLE, ACTIVE, CLOSED, changed only through the (state, event)
table in core/states.py, which says what each means.

The server is never handed on while replies are owed: the release decision is taken on a
ReadyForQuery with status `I` when the linked client owes nothing more (see client.py).
Replies to queries the pooler sends itself (SET for session parameters, the reset query)
are counted in `hidden_syncs` and swallowed up to their ReadyForQuery. While prepared
statements are rewritten (`statements`, see pooling/prepared/) and the request at the head
of its queue needs it, replies are read one message at a time and matched to their requests;
a plain Query or Sync at the head leaves the hot path as it is.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import deque
from collections.abc import Generator
from typing import TYPE_CHECKING, Final

from ..core import server_login
from ..core.exchange import advance
from ..core.server_login import LoggedIn, ServerLoginError
from ..core.states import ServerEvent, ServerState, server_transition
from ..pooling import prepared
from ..pooling.params import covers, set_statements
from ..protocol import messages as m
from . import tls
from .flow_control import ReadingSwitch

if TYPE_CHECKING:
    from ..pooler import Pooler, ServerCredentials
    from ..pooling.pool import Pool
    from .client import ClientConnection

log = logging.getLogger("pypool.server")


_ids = iter(range(1, 1 << 62))
# Replies the hot path passes through without a look, indexed by type byte (every type but
# ReadyForQuery, ParameterStatus, ErrorResponse, CommandComplete and the three that start a
# COPY, which the client's ledger must see: core/ledger.py).
_COPY_RESPONSES: Final = (m.COPY_IN_RESPONSE, m.COPY_OUT_RESPONSE, m.COPY_BOTH_RESPONSE)
_LOOKED_AT: Final = (m.READY_FOR_QUERY, m.PARAMETER_STATUS, m.ERROR_RESPONSE,
                     m.COMMAND_COMPLETE) + _COPY_RESPONSES
_STREAMED: Final = tuple(kind not in _LOOKED_AT for kind in range(256))


# What a pooler-issued query is for (ServerConnection._hidden).
HIDDEN_PLAIN: Final = 0  # reset query, connect_query: replies swallowed, errors logged
HIDDEN_CHECK: Final = 1  # server_check_query before a client's requests
HIDDEN_SET: Final = 2  # the client's session parameters before its requests


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
        self.params: dict[str, str] = {}
        self.backend_pid = 0
        self.backend_secret = 0
        now = pooler.now()
        self.connect_time = now
        self.request_time = now  # when last linked or released
        self.hidden_syncs = 0
        # CancelRequests aimed at this server's backend not yet known to have landed: while
        # any is, the server is handed to no one (Pool.being_canceled).
        self.cancels_in_flight = 0
        self._setting: list[str] = []  # parameters a hidden SET in flight changes
        # What each pooler-issued query in flight is for, oldest first (one per hidden
        # ReadyForQuery), and the error the oldest one got, if any: each reply is matched to
        # its own query, so a failing connect_query is never taken for the SET behind it.
        self._hidden: list[int] = []
        self._hidden_error: dict[str, str] | None = None
        # The client whose requests wait for the check's and SET's replies (pooler.link),
        # and whether server_check_query's reply is still to come.
        self.setting_for: ClientConnection | None = None
        self.checking = False
        # Clients whose transactions are queued on this server behind the linked client's,
        # in order (net/pipeline.py); their replies follow its ReadyForQuery.
        self.chain: deque[ClientConnection] = deque()
        self.open_line = False  # listed in its pool's open_lines
        # Prepared statements on this server and the requests its replies answer.
        self.statements = prepared.ServerStatements(
            pooler.statement_registry, pooler.settings.pooler.max_prepared_statements,
            pool.stats,
        )
        self.close_reason = ""
        self.local_port = 0
        self.ready: asyncio.Future[None] = pooler.loop.create_future()
        # The login exchange (core/server_login.py), from connection_made to ReadyForQuery.
        self._login: Generator[bytes, bytes, LoggedIn] | None = None
        # TLS (net/tls.py): the SSLRequest's answer is awaited; the `tls` column of SHOW
        # SERVERS ("" in plaintext).
        self._awaiting_tls_answer = False
        self.tls_info = ""
        # Hot-path framing state: bytes of an unparsed message body still to pass through,
        # and an incomplete message held back until its end arrives.
        self._skip = 0
        self._partial = b""
        self._reading_paused = False
        self.writing_paused = False  # our socket to PostgreSQL is above its high-water mark
        # Requests queued by `send_soon`, written together when this round of the event loop
        # has read everything that was ready.
        self._deferred: list[bytes] = []

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
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.local_port = sock.getsockname()[1]
            except OSError:
                pass
        self.on(ServerEvent.CONNECTED)
        if self.pooler.tls.server.context is not None:
            self._awaiting_tls_answer = True
            transport.write(server_login.SSL_REQUEST)  # type: ignore[attr-defined]
            return
        self._start_login(None)

    def _start_login(self, channel_binding: bytes | None) -> None:
        creds = self.credentials
        verifier = creds.verifier
        self._login = server_login.login(
            creds.user, self.dbname, self.startup_params, password=creds.password,
            md5_hash=creds.md5_hash, client_key=creds.scram_client_key,
            server_key=verifier.server_key if verifier is not None else None,
            channel_binding=channel_binding,
        )
        self.transport.write(next(self._login))  # type: ignore[union-attr]  # StartupMessage

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
        self.flush()
        if self.state in (ServerState.IDLE, ServerState.ACTIVE):
            try:
                self.transport.write(m.terminate())
            except Exception:  # noqa: BLE001 - the socket may already be gone
                pass
        self.transport.close()

    def send(self, data: bytes) -> None:
        """Write client requests to the server now, behind any still deferred."""
        if self._deferred:
            self._deferred.append(data)
        else:
            assert self.transport is not None
            self.transport.write(data)

    def send_soon(self, data: bytes) -> None:
        """Write client requests once this round of the event loop has read everything that
        was ready: requests pipelined onto this server meanwhile go out in one write, and wake
        its backend once (net/pipeline.py)."""
        if not self._deferred:
            self.pooler.flush_soon(self)
        self._deferred.append(data)

    def flush(self) -> None:
        """Write what `send_soon` deferred (`close` does so first; dropped if the server is
        already closed: the clients it was for got an error from the close)."""
        if self._deferred:
            data = b"".join(self._deferred)
            self._deferred.clear()
            if self.transport is not None and self.state is not ServerState.CLOSED:
                self.transport.write(data)

    def send_hidden_query(self, sql: str, purpose: int = HIDDEN_PLAIN) -> None:
        """Send a query whose replies the client must not see."""
        self.hidden_syncs += 1
        self._hidden.append(purpose)
        self.send(m.query(sql))

    def prepare_for(self, client: ClientConnection, check_query: str) -> None:
        """What must succeed before `client`'s requests may go: `check_query` (if any),
        then a SET of the parameters whose values differ from the client's. The pooler is
        told how it went (parameters_applied, check_failed, parameters_failed)."""
        self.setting_for = client
        if check_query:
            self.checking = True
            self.send_hidden_query(check_query, HIDDEN_CHECK)
        if not covers(self.params, client.params):
            self.send_parameters(client)

    def send_parameters(self, client: ClientConnection) -> None:
        """SET the parameters whose values differ from the linked `client`'s. Its requests
        wait for the reply (pooler.parameters_applied): if the SET fails, they must not run
        under the wrong client_encoding or TimeZone.

        PostgreSQL sends a ParameterStatus only when a value changes: a SET of another
        spelling of the current value (client_encoding 'utf-8' for UTF8, DateStyle ISO for
        "ISO, MDY") changes nothing and says nothing. So once the SET has succeeded, the
        client's values become the server's, whichever way it went; else the next link would
        send the same SET again."""
        wanted = client.params
        self._setting = [name for name, value in wanted.items() if self.params.get(name) != value]
        self.setting_for = client
        self.send_hidden_query(set_statements(wanted, self.params), HIDDEN_SET)

    # --- login ----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.state is ServerState.LOGIN:
            self._login_data(data)
        else:
            self.pool.stats.bytes_sent += len(data)  # what goes on to clients, give or take
            self._relay(data)

    def _login_data(self, data: bytes) -> None:
        if self._awaiting_tls_answer:
            self._tls_answer(data)
            return
        login = self._login
        if login is None:
            return  # logged in but closing (pooler.server_available): nothing more to read
        assert self.transport is not None
        try:
            done = advance(login, data, self.transport.write)
        except ServerLoginError as exc:
            self._login = None
            self._fail_login(exc)
            return
        if done is None:
            return
        self._login = None
        self.params.update(done.params)
        self.backend_pid, self.backend_secret = done.backend_pid, done.backend_secret
        self.ready.set_result(None)
        self.pooler.server_logged_in(self)
        if self.state is not ServerState.LOGIN and done.rest:
            self._relay(done.rest)

    def _tls_answer(self, data: bytes) -> None:
        """The server's 'S' or 'N' to the SSLRequest (core/server_login.tls_answer)."""
        self._awaiting_tls_answer = False
        tls_config = self.pooler.tls
        try:
            start = server_login.tls_answer(data, tls_config.server.sslmode)
        except ServerLoginError as exc:
            self._fail_login(exc)
            return
        if not start:
            self._start_login(None)
            return
        assert self.transport is not None
        self.transport.pause_reading()  # the TLS layer reads from here on
        self.pooler.spawn(tls.connect_server(
            self, tls_config, self.host, self.pooler.settings.pooler.server_connect_timeout,
            self._tls_started, self._tls_failed))

    def _tls_started(self, transport: asyncio.Transport, channel_binding: bytes | None) -> None:
        if self.state is ServerState.CLOSED:
            transport.close()
            return
        self.transport = transport
        self.tls_info = tls.connection_info(transport)
        self._start_login(channel_binding)

    def _tls_failed(self, reason: str) -> None:
        text = f"server TLS handshake failed: {reason}"
        self._fail_login(ServerLoginError(text, m.error_response(text, "08006", "FATAL")))

    def _fail_login(self, exc: ServerLoginError) -> None:
        if not self.ready.done():
            self.ready.set_exception(exc)
        self.close(f"login failed: {exc}")

    # --- the hot path: server to client ---------------------------------------------------

    def _relay(self, data: bytes) -> None:
        """Forward the server's bytes to the linked client, acting on the few messages that
        matter: ReadyForQuery (release), ParameterStatus (tracking), ErrorResponse
        (counting), CommandComplete of DISCARD/DEALLOCATE ALL. Everything else streams
        through untouched, unless the prepared-statement queue says otherwise."""
        if self._partial:
            data = self._partial + data
            self._partial = b""
        n = len(data)
        pos = self._skip
        st = self.statements
        if pos >= n and not self.hidden_syncs:
            self._skip = pos - n
            if self.client is not None:
                self.client.write(data)
            if st.tracking == 2 and not self._skip:
                self._write_synthetic()
            return
        self._skip = 0
        out = 0  # start of the bytes not yet written to the client
        while n - pos >= 5:
            kind = data[pos]
            end = pos + 1 + int.from_bytes(data[pos + 1 : pos + 5], "big")
            if _STREAMED[kind] and not st.tracking and not self.hidden_syncs:
                # BindComplete, RowDescription, DataRow, ...: nothing to act on.
                if end > n:
                    self._skip = end - n
                    pos = n
                    break
                pos = end
                continue
            if st.tracking and not self.hidden_syncs:
                # The slow path: this reply is matched to the request at the queue's head.
                client = self.client
                if st.tracking == 2:  # a reply the pooler makes goes out before this one
                    synthetic = st.emit_synthetic()
                    if client is not None:
                        if out < pos:
                            client.write(data[out:pos])
                        client.write(synthetic)
                    out = pos
                    continue
                if end > n:
                    if (kind == m.DATA_ROW or kind == m.COPY_DATA) and not st.queue[0][1]:
                        self._skip = end - n  # stream long rows; they complete nothing
                        pos = n
                    break
                if (kind == m.COMMAND_COMPLETE or kind == m.ERROR_RESPONSE
                        or kind == m.READY_FOR_QUERY):
                    body = data[pos + 5 : end]
                    if kind == m.ERROR_RESPONSE:
                        errs = self.pool.stats.errors
                        errs["server"] = errs.get("server", 0) + 1
                        if client is not None:
                            client.ledger.copy_failed()
                elif kind == m.PARAMETER_STATUS:
                    body = data[pos + 5 : end]
                    self._parameter_status(body)
                else:
                    if kind in _COPY_RESPONSES and client is not None:
                        struck = client.ledger.copy_started(kind)
                        if struck:
                            st.ignored_syncs(struck)
                    body = b""
                verdict = st.reply(kind, body)
                if verdict or st.to_client:
                    if verdict == prepared.READY:
                        if (data[pos + 5] != m.TX_IDLE
                                and self.pool.limits.pool_mode == "statement"):
                            stop = pos  # withheld, as on the hot path below
                        else:
                            stop = end
                    else:
                        stop = pos if verdict else end
                    if client is not None and out < stop:
                        client.write(data[out:stop])
                    out = end
                    if client is not None and verdict == prepared.REPLACE:
                        client.write(st.replacement)
                    if verdict == prepared.READY and client is not None:
                        # This may hand the server to the next client of its chain: the
                        # synthesised replies that follow are that client's.
                        client.ready_for_query(data[pos + 5])
                        client = self.client
                        if self.close_reason:
                            return
                    if st.to_client:
                        if client is not None:
                            client.write(b"".join(st.to_client))
                        st.to_client.clear()
                pos = end
                continue
            if kind == m.READY_FOR_QUERY or kind == m.PARAMETER_STATUS or self.hidden_syncs:
                if end > n:
                    break
                if self.hidden_syncs:
                    client = self.client
                    if client is not None and out < pos:
                        client.write(data[out:pos])
                    out = end
                    self._hidden_message(kind, data[pos + 5 : end])
                elif kind == m.READY_FOR_QUERY:
                    client = self.client
                    if st.queue:
                        st.pop_ready(data[pos + 5])
                    if client is None:
                        out = end
                    elif data[pos + 5] != m.TX_IDLE and self.pool.limits.pool_mode == "statement":
                        # As PgBouncer: the ReadyForQuery is withheld, so the statement that
                        # opened the transaction fails (ready_for_query sends the FATAL).
                        client.write(data[out:pos])
                        out = end
                        client.ready_for_query(data[pos + 5])
                    else:
                        client.write(data[out:end])
                        out = end
                        client.ready_for_query(data[pos + 5])
                        if st.to_client:  # for whoever is linked now (net/pipeline.py)
                            if self.client is not None:
                                self.client.write(b"".join(st.to_client))
                            st.to_client.clear()
                        if self.close_reason:
                            return
                else:
                    self._parameter_status(data[pos + 5 : end])
            elif kind == m.ERROR_RESPONSE:
                if st.queue and st.queue[0][2] == prepared.OP_RENAME:
                    # A folded segment of the client's statements: name them in the error.
                    if end > n:
                        break
                    renamed = st.renamed_error(data[pos + 5 : end])
                    if renamed is not None:
                        client = self.client
                        if client is not None:
                            if out < pos:
                                client.write(data[out:pos])
                            client.write(renamed)
                        out = end
                self.pool.stats.errors["server"] = self.pool.stats.errors.get("server", 0) + 1
                if self.client is not None:
                    self.client.ledger.copy_failed()
                if end > n:
                    self._skip = end - n
                    pos = n
                    break
            elif kind == m.COMMAND_COMPLETE:
                if end > n:
                    break  # small: wait for all of it
                if data[pos + 5] == 68:  # "D": DISCARD ALL, DEALLOCATE ALL drop statements
                    st.command_tag(data[pos + 5 : end])
            elif kind in _COPY_RESPONSES:
                if self.client is not None:
                    struck = self.client.ledger.copy_started(kind)
                    if struck:
                        st.ignored_syncs(struck)
                if end > n:
                    self._skip = end - n
                    pos = n
                    break
            elif end > n:
                self._skip = end - n
                pos = n
                break
            pos = end
        if pos < n:
            self._partial = data[pos:]
        if out < pos:
            client = self.client
            if client is not None:
                client.write(data[out:pos] if out or pos < n else data)
        if st.tracking == 2 and not self._skip and not self._partial:
            self._write_synthetic()
        if st.blocked:
            # The client whose messages wait is the last one queued on this server.
            sender = self.chain[-1] if self.chain else self.client
            if sender is not None:
                sender.resume_rewriting()

    def at_message_boundary(self) -> bool:
        """Whether the next byte from the server starts a message (nothing half-relayed)."""
        return not self._skip and not self._partial

    def _write_synthetic(self) -> None:
        synthetic = self.statements.emit_synthetic()
        if self.client is not None and synthetic:
            self.client.write(synthetic)

    def _parameter_status(self, body: bytes) -> None:
        name, value = m.parse_parameter_status(body)
        self.params[name] = value
        if self.client is not None:
            self.client.params_seen(name, value)

    def _hidden_message(self, kind: int, body: bytes) -> None:
        if kind == m.READY_FOR_QUERY:
            self.hidden_syncs -= 1
            purpose = self._hidden.pop(0) if self._hidden else HIDDEN_PLAIN
            error, self._hidden_error = self._hidden_error, None
            if purpose == HIDDEN_CHECK:
                self.checking = False
                client = self.setting_for
                if error is not None:
                    self._setting = []
                    self.setting_for = None
                    self.pooler.check_failed(self, client, error.get("M", ""))
                elif not self._setting:
                    self.setting_for = None
                    if client is not None and client is self.client:
                        self.pooler.parameters_applied(self, client)
            elif purpose == HIDDEN_SET and self._setting:
                names, self._setting = self._setting, []
                client, self.setting_for = self.setting_for, None
                if client is None or client is not self.client:
                    return  # it left meanwhile
                if error is not None:
                    self.pooler.parameters_failed(self, client, error)
                    return
                for name in names:
                    if name in self.params:
                        client.params_seen(name, self.params[name])
                self.pooler.parameters_applied(self, client)
        elif kind == m.PARAMETER_STATUS:
            self._parameter_status(body)
        elif kind == m.COMMAND_COMPLETE:
            self.statements.command_tag(body)  # a reset query's DISCARD ALL
        elif kind == m.ERROR_RESPONSE:
            fields = m.parse_error_fields(body)
            self._hidden_error = fields
            log.warning("%r: pooler-issued query failed: %s %s", self, fields.get("C"),
                        fields.get("M"))

