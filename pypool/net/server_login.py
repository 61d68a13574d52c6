"""The pooler's login into PostgreSQL, as the asyncio side drives it: from the TCP
connection to the first ReadyForQuery.

The exchange itself is a sans-IO generator (core/server_login.py: StartupMessage, the
Authentication requests, ParameterStatus and BackendKeyData). This is the glue that feeds it
the server's bytes, sends an SSLRequest first when server_tls_sslmode asks for TLS and
starts the handshake on 'S' (net/tls_handshake.py), and tells the pooler how the login went
(`server_logged_in`, or the connection's `ready` future failing with the server's error).
It owns the login's state and nothing after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import TYPE_CHECKING

from ..core import server_login
from ..core.exchange import advance
from ..core.server_login import LoggedIn, ServerLoginError
from ..core.states import ServerState
from ..protocol import messages as m
from . import tls, tls_handshake
from .socket_options import tune_tcp

if TYPE_CHECKING:
    from .records import ServerRecord


class ServerLogin:
    """The login of one server connection."""

    def __init__(self, server: ServerRecord) -> None:
        self.server = server
        self._login: Generator[bytes, bytes, LoggedIn] | None = None
        self._awaiting_tls_answer = False  # the SSLRequest's 'S' or 'N' is still to come

    def connected(self, transport: asyncio.BaseTransport) -> None:
        """The TCP connection is up: tune its socket, then the SSLRequest or the
        StartupMessage."""
        server = self.server
        sock = transport.get_extra_info("socket")
        if sock is not None:
            tune_tcp(sock, server.pooler.settings.pooler)  # the tcp_* keys
            try:
                server.local_port = sock.getsockname()[1]
            except OSError:
                pass
        if server.pooler.tls.server.context is not None:
            self._awaiting_tls_answer = True
            assert server.transport is not None
            server.transport.write(server_login.SSL_REQUEST)
            return
        self._start(None)

    def _start(self, channel_binding: bytes | None) -> None:
        server = self.server
        creds = server.credentials
        verifier = creds.verifier
        self._login = server_login.login(
            creds.user, server.dbname, server.startup_params, password=creds.password,
            md5_hash=creds.md5_hash, client_key=creds.scram_client_key,
            server_key=verifier.server_key if verifier is not None else None,
            channel_binding=channel_binding,
        )
        self.write(next(self._login))  # the StartupMessage

    def data(self, data: bytes) -> None:
        if self._awaiting_tls_answer:
            self._tls_answer(data)
            return
        login = self._login
        if login is None:
            return  # logged in but closing (pooler.server_available): nothing more to read
        server = self.server
        try:
            done = advance(login, data, self.write)
        except ServerLoginError as exc:
            self._login = None
            self.failed(exc)
            return
        if done is None:
            return
        self._login = None
        server.params.update(done.params)
        server.backend_pid, server.backend_secret = done.backend_pid, done.backend_secret
        server.ready.set_result(None)
        server.pooler.server_logged_in(server)
        if server.state is not ServerState.LOGIN and done.rest:
            server.data_received(done.rest)

    def _tls_answer(self, data: bytes) -> None:
        """The server's 'S' or 'N' to the SSLRequest (core/server_login.tls_answer)."""
        self._awaiting_tls_answer = False
        server = self.server
        tls_config = server.pooler.tls
        try:
            start = server_login.tls_answer(data, tls_config.server.sslmode)
        except ServerLoginError as exc:
            self.failed(exc)
            return
        if not start:
            self._start(None)
            return
        assert server.transport is not None
        server.transport.pause_reading()  # the TLS layer reads from here on
        server.pooler.spawn(tls_handshake.connect_server(
            server, tls_config, server.host, server.pooler.settings.pooler.server_connect_timeout,
            self._tls_started, self._tls_failed))

    def _tls_started(self, transport: asyncio.Transport, channel_binding: bytes | None) -> None:
        server = self.server
        if server.state is ServerState.CLOSED:
            transport.close()
            return
        server.transport = transport
        server.tls_info = tls.connection_info(transport)
        self._start(channel_binding)

    def _tls_failed(self, reason: str) -> None:
        text = f"server TLS handshake failed: {reason}"
        self.failed(ServerLoginError(text, m.error_response(text, "08006", "FATAL")))

    def write(self, data: bytes) -> None:
        """Write the login's messages (core/server_login.py)."""
        server = self.server
        if server.trace is not None:
            server.trace.server_write(server, data, True)
        assert server.transport is not None
        server.transport.write(data)

    def lost(self) -> None:
        """The connection closed: if still logging in, whoever waits gets the error."""
        ready = self.server.ready
        if not ready.done():
            text = "server closed the connection during login"
            ready.set_exception(ServerLoginError(
                text, m.error_response(text, "08006", "FATAL"), unreachable=True))

    def failed(self, exc: ServerLoginError) -> None:
        server = self.server
        if not server.ready.done():
            server.ready.set_exception(exc)
        server.close(f"login failed: {exc}")
