"""A pool's listening server connection (listen_mode = shared): an asyncio adapter that logs
into PostgreSQL and then only LISTENs, UNLISTENs and hears notifications.

It is not one of the pool's servers: it is never linked to a client, never counted in
pool_size, and is shown by SHOW LISTENERS only. The login is core/server_login.py's (with
TLS first when server_tls_sslmode asks, on 'S'); after it every byte goes to the pool's
`Listening` (pooling/listening.py), which says what arrived and what to ask next. What the
notifications mean for clients, and what happens when the connection goes, is the pooler's
(pooler/notifications.py, through the two callbacks).

Owns the socket and the login; never writes to a client.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Generator

from ..core import server_login
from ..core.exchange import advance
from ..core.server_login import LoggedIn, ServerLoginError
from ..pooling.listening import CONNECTING, Listening
from ..protocol import messages as m

log = logging.getLogger("pypool.listen")


class ListenServer(asyncio.Protocol):
    """One listening connection. `heard(found)` gets each batch of notifications, in order
    (after every read, even with none);
    `up()` when it has logged in; `lost(reason)` once when it is gone (or never came up)."""

    def __init__(self, listening: Listening, name: str,
                 login: Callable[[], Generator[bytes, bytes, LoggedIn]],
                 tls: tuple[ssl.SSLContext, str, str] | None,
                 heard: Callable[[list[tuple[bytes, bytes]]], None],
                 lost: Callable[[str], None], up: Callable[[], None]) -> None:
        self.listening = listening
        self.name = name  # for log lines: database/user
        self._login_factory = login
        self._tls = tls  # (context, sslmode, host) when server_tls_sslmode asks for TLS
        self._heard = heard
        self._lost = lost
        self._up = up
        self.transport: asyncio.Transport | None = None
        self._login: Generator[bytes, bytes, LoggedIn] | None = None
        self._awaiting_tls_answer = False
        self._gone = False

    async def connect(self, loop: asyncio.AbstractEventLoop, host: str, port: int,
                      timeout: float) -> None:
        """Open the connection and start the login; a failure ends in `lost`."""
        self.listening.state = CONNECTING
        try:
            async with asyncio.timeout(timeout or None):
                await loop.create_connection(lambda: self, host, port)
        except (OSError, TimeoutError) as exc:
            self._end(f"connect failed: {exc or type(exc).__name__}")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        if self._gone:
            transport.close()
            return
        if self._tls is not None:
            self._awaiting_tls_answer = True
            self._write(server_login.SSL_REQUEST)
        else:
            self._start()

    def _start(self) -> None:
        self._login = self._login_factory()
        self._write(next(self._login))  # the StartupMessage

    def data_received(self, data: bytes) -> None:
        if self._gone:
            return
        if self._awaiting_tls_answer:
            self._tls_answer(data)
            return
        login = self._login
        if login is not None:
            try:
                done = advance(login, data, self._write)
            except ServerLoginError as exc:
                self._end(f"login failed: {exc}")
                return
            if done is None:
                return
            self._login = None
            self.listening.backend_pid = done.backend_pid
            self.listening.logged_in()
            log.info("%s: listening connection up (backend pid %d)", self.name,
                     done.backend_pid)
            self._up()
            data = done.rest
        found = self.listening.feed(data) if data else []
        self.ask()
        self._heard(found)  # even none: a LISTEN answered may end a bridge

    def ask(self) -> None:
        """Write the LISTENs and UNLISTENs the pool's channels need now, if any."""
        if self._gone or self._login is not None or self.transport is None:
            return
        requests = self.listening.requests()
        if requests:
            self._write(requests)

    def _tls_answer(self, data: bytes) -> None:
        self._awaiting_tls_answer = False
        assert self._tls is not None
        context, sslmode, host = self._tls
        try:
            start = server_login.tls_answer(data, sslmode)
        except ServerLoginError as exc:
            self._end(f"login failed: {exc}")
            return
        if not start:
            self._start()
            return
        asyncio.get_running_loop().create_task(self._start_tls(context, sslmode, host))

    async def _start_tls(self, context: ssl.SSLContext, sslmode: str, host: str) -> None:
        transport = self.transport
        assert transport is not None
        try:
            new = await asyncio.get_running_loop().start_tls(
                transport, self, context, server_side=False,
                server_hostname=host if sslmode == "verify-full" else None)
        except Exception as exc:  # noqa: BLE001 - any failure ends this connection
            self._end(f"TLS handshake failed: {exc}")
            return
        if new is None or self._gone:
            self._end("connection closed during the TLS handshake")
            return
        self.transport = new  # type: ignore[assignment]
        self._start()

    def _write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        said = self.listening.error  # a FATAL first (pg_terminate_backend, a shutdown)
        self._end(said or ("server closed the connection" if exc is None
                           else f"connection lost: {exc}"))

    def close(self, reason: str) -> None:
        """Close it (nobody listens any more, or the pool goes)."""
        if self.transport is not None and not self._gone and self._login is None:
            try:
                self.transport.write(m.terminate())
            except Exception:  # noqa: BLE001 - the socket may already be gone
                pass
        self._end(reason)

    def _end(self, reason: str) -> None:
        if self._gone:
            return
        self._gone = True
        if self.transport is not None:
            self.transport.close()
        self._lost(reason)
