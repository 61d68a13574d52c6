"""A client's login, as the asyncio side drives it: from the first byte to ReadyForQuery.

The exchanges themselves are sans-IO generators (core/client_login.py: the startup packet,
then the cleartext, md5, SCRAM-SHA-256 or SCRAM-SHA-256-PLUS password exchange). This is the
glue that feeds them the client's bytes, starts TLS when the startup exchange asks for it
(net/tls.py), asks the pooler for the user's secret (`begin_authentication`, which may run
auth_query first), and sends the welcome once the pool is ready: AuthenticationOk,
ParameterStatus, BackendKeyData, ReadyForQuery. What the client sends meanwhile is held,
bounded, and relayed after the welcome. It owns the login's state and nothing after it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Generator
from typing import TYPE_CHECKING

from ..core import client_login
from ..core.client_login import Authenticated, FirstPacket, StartTls, StartupTls
from ..core.exchange import advance
from ..core.states import ClientEvent, ClientState
from ..pooling import prepared
from ..pooling import session_state as ss
from ..pooling.params import TRACKED, canonical_name, same_encoding
from ..protocol import errors
from ..protocol import messages as m
from ..protocol.errors import PoolerError
from ..protocol.startup import MAX_AUTH_MESSAGE, CancelRequest
from . import outbox, tls
from .unix_socket import os_user_name

if TYPE_CHECKING:
    from .client import ClientConnection

log = logging.getLogger("pypool.client")


class ClientLogin:
    """The login of one client connection."""

    def __init__(self, client: ClientConnection) -> None:
        self.client = client
        # The startup packet's exchange, what the client sends between its StartupMessage
        # and start_auth(), then the password exchange.
        self._startup: Generator[bytes, bytes, FirstPacket | StartTls] = (
            client_login.read_startup())
        next(self._startup)
        self._buffer = bytearray()
        self._auth: Generator[bytes, bytes, Authenticated] | None = None
        # The tls-server-end-point data SCRAM-SHA-256-PLUS binds to (TLS only).
        self._channel_binding: bytes | None = None
        # Between 'S' (or a direct ClientHello) and tls_started: the handshake is running.
        # What reaches the connection meanwhile came through the TLS layer (the plaintext
        # side is paused or handed to it), decrypted: with TLS 1.3 the client's
        # StartupMessage travels with its Finished, and the layer may deliver it before the
        # handshake's waiter has woken tls_started. It waits here for the new exchange.
        self._handshaking = False
        self._early = bytearray()

    def connected(self, over_unix_socket: bool) -> None:
        """The connection is up: read its startup packet as the TLS settings say."""
        startup_tls = self.client.pooler.tls.client.startup(over_unix_socket=over_unix_socket)
        self._startup = client_login.read_startup(startup_tls)
        next(self._startup)

    def startup_data(self, data: bytes) -> None:
        client = self.client
        if self._handshaking:
            self._early += data
            if len(self._early) > MAX_AUTH_MESSAGE:  # a StartupMessage, then a password
                raise errors.ClientProtocolError(
                    f"{len(self._early)} bytes sent before the startup packet was read")
            return
        if client.user:
            # The StartupMessage is in and auth_query is looking the user up: what follows
            # waits, bounded, for start_auth().
            self._buffer += data
            client_login.check_held(self._buffer)
            return
        first = advance(self._startup, data, client.write)
        if first is None:
            return
        if isinstance(first, StartTls):
            self._handshaking = True
            self._start_tls(first.hello)
            return
        packet = first.packet
        pooler = client.pooler
        if isinstance(packet, CancelRequest):
            pooler.forward_cancel(packet.pid, packet.secret)
            client.close("cancel request")
            return
        settings = pooler.settings.pooler
        client.user, client.database = client_login.login_names(packet.params)
        client.startup_params = packet.params
        client.params.update(client_login.tracked_parameters(
            packet.params, settings.track_extra_parameters, settings.ignore_startup_parameters))
        if settings.log_connections:
            log.info("%r: login attempt: db=%s user=%s tls=%s", client, client.database,
                     client.user, client.tls_info or "no")
        self._buffer += first.rest
        pooler.begin_authentication(client)
        if client.state is ClientState.STARTUP:
            client_login.check_held(self._buffer)

    def start_auth(self, secret: str | None, auth_type: str) -> None:
        """Ask for the client's password in the way `auth_type` and the secret allow.

        `secret` None means the user is unknown: the exchange still runs in full and fails
        as a wrong password would.
        """
        client = self.client
        if auth_type in ("trust", "any"):
            self.authenticated(None)
        elif auth_type == "peer":
            client_login.check_peer(client.user, secret, os_user_name(client.peer_uid))
            self.authenticated(None)
        elif auth_type == "cert":
            problem = client_login.cert_login_problem(
                client.user, secret, bool(client.tls_info),
                tls.peer_common_names(client.transport))
            if problem is not None:
                log.warning("%r: %s", client, problem)
                raise PoolerError(client_login.CERT_LOGIN_FAILED, errors.INVALID_AUTHORIZATION,
                                  side=errors.Side.CLIENT)
            self.authenticated(None)
        else:
            client.on(ClientEvent.AUTH_REQUESTED)
            self._auth = client_login.password_exchange(
                client.user, secret, auth_type, client.reader.max_packet, self._channel_binding)
            client.write(next(self._auth))  # the authentication request
        if self._buffer and client.state is not ClientState.CLOSED:
            # What the client sent after its StartupMessage while auth_query ran (or in the
            # same read as it).
            rest = bytes(self._buffer)
            self._buffer.clear()
            client.data_received(rest)

    def _start_tls(self, hello: bytes) -> None:
        """'S' went out: what the client sends next is its TLS ClientHello, for the TLS
        layer start_tls puts under the Protocol, not for `data_received`. Direct TLS:
        `hello` is the start of the ClientHello, already read."""
        client = self.client
        assert client.transport is not None
        pooler = client.pooler
        timeout = pooler.settings.pooler.client_login_timeout
        if hello:
            pooler.spawn(tls.accept_direct(client, pooler.tls, timeout, hello))
            return
        client.transport.pause_reading()
        pooler.spawn(tls.accept_client(client, pooler.tls, timeout))

    def tls_started(self, transport: asyncio.Transport, client_tls: tls.ClientTls,
                    direct: bool = False) -> None:
        """The handshake is done: the startup packets are read again, now inside TLS. Direct
        TLS (no SSLRequest first) must have agreed on ALPN `postgresql`, as PostgreSQL 17
        requires: that is what keeps a TLS connection meant for another protocol out."""
        client = self.client
        client.transport = transport
        client.tls_info = tls.connection_info(transport, client_tls.curve)
        self._channel_binding = client_tls.channel_binding
        self._startup = client_login.read_startup(StartupTls(active=True))
        next(self._startup)
        self._handshaking = False
        if direct and tls.alpn_protocol(transport) != tls.ALPN_POSTGRESQL:
            client.fail(errors.ClientProtocolError(
                "received direct SSL connection request without ALPN protocol negotiation "
                "extension"))
            return
        if self._early:
            early = bytes(self._early)
            self._early.clear()
            client.data_received(early)

    def tls_failed(self, reason: str) -> None:
        log.warning("%r: %s", self.client, reason)
        self.client.close(reason)

    def auth_data(self, data: bytes) -> None:
        exchange = self._auth
        assert exchange is not None
        client = self.client
        done = advance(exchange, data, client.write)
        if done is None:
            return
        self._auth = None
        if done.reply:
            client.write(done.reply)
        self.authenticated(done.client_key)
        if client.state is not ClientState.AUTH and done.rest:
            client.reader.partial += done.rest

    def authenticated(self, scram_client_key: bytes | None) -> None:
        """The password checked out. AuthenticationOk waits for the welcome, so that an
        unknown database or a failing server login is reported in its place."""
        client = self.client
        client.on(ClientEvent.AUTHENTICATED)
        client.pooler.client_authenticated(client, scram_client_key)

    def welcome(self, server_params: dict[str, str]) -> None:
        """Send AuthenticationOk, ParameterStatus, BackendKeyData and ReadyForQuery, and set
        the client up for its requests (prepared statements, session state)."""
        client = self.client
        params = client.params
        cfg = client.pooler.settings.pooler
        out = [m.authentication(m.AUTH_OK)]
        encoding = params.get("client_encoding")
        server_encoding = server_params.get("client_encoding")
        if encoding and server_encoding and same_encoding(encoding, server_encoding):
            params["client_encoding"] = server_encoding  # reported as PostgreSQL would
        for name, value in server_params.items():
            if name in params:
                continue
            out.append(m.parameter_status(name, value))
        for name, value in params.items():
            out.append(m.parameter_status(name, value))
        # Tracked parameters the client did not set take the server's defaults.
        for name, value in server_params.items():
            if canonical_name(name, cfg.track_extra_parameters):
                params.setdefault(name, value)
        out.append(m.backend_key_data(*client.cancel_key))
        reader = client.reader
        reader.admin = client.admin is not None
        out.append(m.ready_for_query(m.TX_IDLE))
        client.write(b"".join(out))
        client.on(ClientEvent.WELCOMED)
        pool = client.pool
        if (cfg.max_prepared_statements > 0 and pool is not None and client.admin is None
                and pool.limits.pool_mode != "session" and client.statements is None):
            client.statements = prepared.ClientStatements(
                client.pooler.statement_registry, cfg.max_client_prepared_statements
            )
            reader.rewriting = True
        if pool is not None and client.admin is None and pool.limits.pool_mode == "transaction":
            policy = pool.limits.session_state
            reader.watch = policy != "ignore"
            if policy == "reject":
                reader.reject = "transaction"
            elif policy == "follow":
                client.session = ss.ClientSession(frozenset(
                    name.lower().encode() for name in (*TRACKED, *cfg.track_extra_parameters)))
        outbox.carry_on(client)
