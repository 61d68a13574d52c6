"""A client's login, as the asyncio side drives it: from the first byte to ReadyForQuery.

The exchanges themselves are sans-IO generators (core/client_login.py: the startup packet,
then the cleartext, md5, SCRAM-SHA-256 or SCRAM-SHA-256-PLUS password exchange). This is the
glue that feeds them the client's bytes (after a load balancer's PROXY protocol header, when
proxy_protocol_sources names the peer: its client's address becomes the client's), starts
TLS when the startup exchange asks for it (net/tls_handshake.py), asks the pooler for the
user's secret (`begin_authentication`, which may run auth_query first), and sends the welcome once
the pool is ready: AuthenticationOk, ParameterStatus, BackendKeyData, ReadyForQuery. What
the client sends meanwhile is held, bounded, and relayed after the welcome. It owns the
login's state and nothing after it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import sys
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING

from .. import PGBOUNCER_VERSION
from ..core import client_login
from ..core.client_login import Authenticated, FirstPacket, Proxied, StartTls, StartupTls
from ..core.exchange import advance
from ..core.states import ClientEvent, ClientState
from ..pooling import prepared
from ..pooling import session_state as ss
from ..pooling.params import TRACKED, canonical_name, reported, same_encoding, unreported
from ..protocol import errors, replication
from ..protocol import messages as m
from ..protocol.errors import PoolerError
from ..protocol.startup import MAX_AUTH_MESSAGE, CancelRequest
from . import outbox, tls, tls_handshake
from .records import ClientLoginSteps
from .unix_socket import os_user_name, peer_uid

if TYPE_CHECKING:
    from .records import ClientRecord

log = logging.getLogger("pypool.client")

# The login line's `replication=` word for each kind, as PgBouncer 1.23+ writes it.
_LOGGED_KIND = {replication.NONE: "no", replication.LOGICAL: "database",
                replication.PHYSICAL: "yes"}


class ClientLogin(ClientLoginSteps):
    """The login of one client connection."""

    # Held for every idle client, so no __dict__ (10,000 idle clients: issue 15).
    __slots__ = ("client", "_startup", "_buffer", "_auth", "_channel_binding", "_handshaking",
                 "_early", "_final")

    def __init__(self, client: ClientRecord) -> None:
        self.client = client
        # The startup packet's exchange (made by connected(), after the PROXY header's when
        # there is one; None once it has returned), what the client sends between its
        # StartupMessage and start_auth(), then the password exchange.
        self._startup: Generator[bytes, bytes, FirstPacket | StartTls | Proxied] | None = None
        self._buffer = b""
        self._auth: Generator[bytes, bytes, Authenticated] | None = None
        # The tls-server-end-point data SCRAM-SHA-256-PLUS binds to (TLS only).
        self._channel_binding: bytes | None = None
        # Between 'S' (or a direct ClientHello) and tls_started: the handshake is running.
        # What reaches the connection meanwhile came through the TLS layer (the plaintext
        # side is paused or handed to it), decrypted: with TLS 1.3 the client's
        # StartupMessage travels with its Finished, and the layer may deliver it before the
        # handshake's waiter has woken tls_started. It waits here for the new exchange.
        self._handshaking = False
        self._early = b""
        # SCRAM's AuthenticationSASLFinal, held to leave with the welcome in one write.
        self._final = b""
        # Logged in by the process this one took over (-R, pooler/takeover.py): what sets
        # it up here, called once, at connection_made.
        self.adopting: Callable[[], None] | None = None

    def connected(self, transport: asyncio.BaseTransport) -> None:
        """The connection is up: note who is at the other end (its address; over the unix
        socket, its uid), then read its startup packet as the TLS settings say."""
        client = self.client
        settings = client.pooler.settings.pooler
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            # TCP. Its tcp_* options are its listener's (net/socket_options.py,
            # tune_listeners). Interned: the clients of one application host share one string.
            client.peer = (sys.intern(str(peer[0])), int(peer[1]))
        else:
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family == socket.AF_UNIX:
                client.peer = ("unix", settings.listen_port)
                try:
                    client.peer_uid = peer_uid(sock)
                except OSError as exc:
                    log.warning("%r: unix peer uid failed: %s", client, exc)
        if self.adopting is not None:
            # Passed by the process this one took over (pooler/takeover.py), logged in
            # there: no startup packet comes; set up now, before its first byte is read.
            restore, self.adopting = self.adopting, None
            restore()
            return
        sources = settings.proxy_protocol_sources
        if sources and client.peer[0] != "unix":
            # Only at connect: with no sources, not a byte is read differently.
            self._startup = client_login.read_proxy_header(
                client_login.trusted_proxy(client.peer[0], sources))
            next(self._startup)
            return
        self._read_startup()

    def _read_startup(self) -> None:
        over_unix_socket = self.client.peer[0] == "unix"
        startup_tls = self.client.pooler.tls.client.startup(over_unix_socket=over_unix_socket)
        self._startup = client_login.read_startup(startup_tls)
        next(self._startup)

    def _proxied(self, proxied: Proxied) -> None:
        """The PROXY header is read (or, from a peer that is no balancer, known absent):
        the address it names is the client's from now on (SHOW CLIENTS, the log, hba,
        application_name_add_host); then the startup packets, TLS included, as usual."""
        client = self.client
        header = proxied.header
        if header is not None:
            if header.source is not None:
                log.debug("%r: PROXY v%d header: client %s:%d", client, header.version,
                          *header.source)
                client.peer = (sys.intern(header.source[0]), header.source[1])
            else:
                log.debug("%r: PROXY v%d header naming no client (LOCAL or UNKNOWN)",
                          client, header.version)
        self._read_startup()
        if proxied.rest:
            self.startup_data(proxied.rest)

    def startup_data(self, data: bytes) -> None:
        client = self.client
        if self._handshaking:
            self._early = self._early + data
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
        assert self._startup is not None
        first = advance(self._startup, data, client.write)
        if first is None:
            return
        self._startup = None  # done: an idle client keeps no finished generator
        if isinstance(first, Proxied):
            self._proxied(first)
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
        startup_params = shared_startup_params(packet.params)
        client.user, client.database = client_login.login_names(startup_params)
        client.startup_params = startup_params
        # A replication client's `options` goes to its own server untouched.
        kind = replication.kind(startup_params)
        client.params.update(client_login.tracked_parameters(
            replication.tracked_part(startup_params, kind), settings.track_extra_parameters,
            settings.ignore_startup_parameters))
        if settings.log_connections:
            log.info("%r: login attempt: db=%s user=%s tls=%s replication=%s", client,
                     client.database, client.user, client.tls_info or "no",
                     _LOGGED_KIND[kind])
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
                client.user, secret, auth_type, client.reader.max_packet, self._channel_binding,
                client.pooler.settings.pooler.scram_iterations)
            client.write(next(self._auth))  # the authentication request
        if self._buffer and client.state is not ClientState.CLOSED:
            # What the client sent after its StartupMessage while auth_query ran (or in the
            # same read as it).
            rest, self._buffer = self._buffer, b""
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
            pooler.spawn(tls_handshake.accept_direct(client, pooler.tls, timeout, hello))
            return
        client.transport.pause_reading()
        pooler.spawn(tls_handshake.accept_client(client, pooler.tls, timeout))

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
            early, self._early = self._early, b""
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
        # SASLFinal goes with the welcome when that follows at once (one write, one wake-up
        # of the client); else, and before any error, on its own.
        self._final = done.reply
        try:
            self.authenticated(done.client_key)
        finally:
            if self._final:
                final, self._final = self._final, b""
                client.write(final)
        if client.state is not ClientState.AUTH and done.rest:
            client.reader.keep(done.rest)

    def authenticated(self, scram_client_key: bytes | None) -> None:
        """The password checked out. AuthenticationOk waits for the welcome, so that an
        unknown database or a failing server login is reported in its place."""
        client = self.client
        client.on(ClientEvent.AUTHENTICATED)
        client.pooler.client_authenticated(client, scram_client_key)

    def welcome(self, server_params: dict[str, str], send: bool = True) -> None:
        """Send AuthenticationOk, ParameterStatus, BackendKeyData and ReadyForQuery, and set
        the client up for its requests (prepared statements, session state). `send` False:
        a client taken over from another process, welcomed there already."""
        client = self.client
        params = client.params
        cfg = client.pooler.settings.pooler
        pool = client.pool
        follow = (pool is not None and client.admin is None
                  and pool.limits.pool_mode == "transaction"
                  and pool.limits.session_state == "follow")
        follows = _followed(cfg.track_extra_parameters,
                            reported(server_params, cfg.track_extra_parameters))
        if send and not self._place_unreported(server_params, follows if follow else None):
            return
        encoding = params.get("client_encoding")
        server_encoding = server_params.get("client_encoding")
        if encoding and server_encoding and same_encoding(encoding, server_encoding):
            params["client_encoding"] = server_encoding  # reported as PostgreSQL would
        statuses, defaults = _welcome_parameters(server_params, params,
                                                 cfg.track_extra_parameters)
        # Tracked parameters the client did not set take the server's defaults.
        for name, value in defaults:
            params.setdefault(name, value)
        reader = client.reader
        reader.admin = client.admin is not None
        final, self._final = self._final, b""
        if send:
            pooler_statuses = (b"" if pool is None or client.admin is not None else
                               _pooler_statuses(pool.limits.pool_mode,
                                                cfg.max_prepared_statements))
            client.write(b"".join((final, _AUTH_OK, statuses, pooler_statuses,
                                   m.backend_key_data(*client.cancel_key),
                                   _login_notice(cfg.login_notify_message), _READY_IDLE)))
        client.on(ClientEvent.WELCOMED)
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
                client.follows = follows
        outbox.carry_on(client)

    def _place_unreported(self, server_params: dict[str, str],
                          follows: frozenset[bytes] | None) -> bool:
        """Startup values of parameters the pool tracks only where its server reports them
        (pooling/params.py), when it does not: made by the client's session-state record
        where one follows it (`follows` not None), else dropped if ignore_startup_parameters
        lists them, else refused as untracked startup parameters always were. False when
        the client was refused."""
        client = self.client
        params = client.params
        cfg = client.pooler.settings.pooler
        names = unreported(params, server_params, cfg.track_extra_parameters)
        if not names:
            return True
        if follows is not None:
            session = client.session = ss.ClientSession(follows)
            for name in names:
                key = name.encode()
                session.started_with(key, ss.set_config_statement(key, params.pop(name).encode()))
            return True
        ignored = {name.lower() for name in cfg.ignore_startup_parameters}
        for name in names:
            if name not in ignored:
                client.fail(PoolerError(f"unsupported startup parameter: {name}"))
                return False
            del params[name]
        return True


# --- what every login shares --------------------------------------------------------------
# A connect-per-transaction client makes these per login, and 10,000 idle clients hold them:
# each distinct value is made once and shared (none of them is changed in place).

_AUTH_OK = m.authentication(m.AUTH_OK)


@functools.lru_cache(maxsize=16)
def _pooler_statuses(pool_mode: str, max_prepared: int) -> bytes:
    """PgBouncer 1.26's ParameterStatus messages that tell a driver it talks to a pooler:
    the PgBouncer version pypool answers as, the client's pool mode, and whether prepared
    statements are carried across servers (max_prepared_statements > 0)."""
    return (m.parameter_status("pgbouncer.version", PGBOUNCER_VERSION)
            + m.parameter_status("pgbouncer.pool_mode", pool_mode)
            + m.parameter_status("pgbouncer.max_prepared_statements", str(max_prepared)))


@functools.lru_cache(maxsize=8)
def _login_notice(text: str) -> bytes:
    """login_notify_message's NOTICE (b"" when unset), made once per text."""
    return m.notice_response(text) if text else b""

_READY_IDLE = m.ready_for_query(m.TX_IDLE)
# Bounds on the caches below: distinct startup packets and parameter sets are few in
# practice; past the bound a cache starts over rather than grow with hostile input.
_SHARED_MAX = 512
_shared_startup: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
_welcomes: dict[tuple[object, ...], tuple[bytes, tuple[tuple[str, str], ...]]] = {}


def shared_startup_params(params: dict[str, str]) -> dict[str, str]:
    """A StartupMessage's parameters, as one dict shared by every client that sent the same
    (only read after login: hba, SHOW CLIENTS)."""
    key = tuple(params.items())
    shared = _shared_startup.get(key)
    if shared is None:
        if len(_shared_startup) >= _SHARED_MAX:
            _shared_startup.clear()
        shared = _shared_startup[key] = {sys.intern(k): v for k, v in params.items()}
    return shared


def _welcome_parameters(server_params: dict[str, str], params: dict[str, str],
                        track_extra: tuple[str, ...],
                        ) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    """The welcome's ParameterStatus messages (the server's values, then the client's own,
    which win) and the server's values of the tracked parameters the client did not set."""
    key = (tuple(server_params.items()), tuple(params.items()), track_extra)
    cached = _welcomes.get(key)
    if cached is not None:
        return cached
    out = [m.parameter_status(name, value) for name, value in server_params.items()
           if name not in params]
    out += [m.parameter_status(name, value) for name, value in params.items()]
    defaults = tuple((name, value) for name, value in server_params.items()
                     if name not in params and canonical_name(name, track_extra))
    if len(_welcomes) >= _SHARED_MAX:
        _welcomes.clear()
    cached = _welcomes[key] = (b"".join(out), defaults)
    return cached


@functools.lru_cache(maxsize=16)
def _followed(track_extra: tuple[str, ...], reported: tuple[str, ...]) -> frozenset[bytes]:
    """The reported parameters, lower case, that session_state = follow leaves alone: the
    tracked ones, and those of TRACKED_WHERE_REPORTED the server reports (`reported`)."""
    return frozenset(name.lower().encode() for name in (*TRACKED, *track_extra, *reported))
