"""A client logging into the pooler, as exchanges that take and return bytes.

Two exchanges, each a generator run by `core/exchange.advance` (sent the bytes the client
sent, it yields the bytes to answer; see there), with two plain steps between them. What
they decide is the pooler's answer to the client; what comes next (the auth_file or
auth_query lookup, the pool, the welcome) the adapter, net/client.py, asks the pooler for.

0. `read_proxy_header`, only with proxy_protocol_sources set and only over TCP: before
   anything else, the PROXY protocol header a trusted balancer must send
   (protocol/proxy_header.py), or, from any other peer, a check that none comes. It
   returns `Proxied`, with what the client sent after the header for `read_startup`.
1. `read_startup`: the untyped first packets. An SSLRequest is answered 'S' when the
   connection's `StartupTls` offers TLS, and it returns `StartTls`: the adapter does the
   handshake and reads on with a new `read_startup`, `active` set. Else 'N', as is every
   GSSENCRequest. A ClientHello as the first bytes is direct TLS (PostgreSQL 17): also
   `StartTls`, with those bytes. Bytes behind either request were sent in the clear
   before its answer and are refused (CVE-2021-23222); with TLS required a plaintext
   StartupMessage is refused ("SSL required"), a CancelRequest is not. A StartupMessage
   newer than 3.0, or with protocol options, gets NegotiateProtocolVersion. It returns at
   a CancelRequest or a StartupMessage, whose parameters `login_names` and
   `tracked_parameters` then read.
2. Until the pooler asks for a password (auth_query may be looking the user up), what the
   client sends is held, bounded: `check_held`.
3. `check_peer`, for `auth_type = peer` instead of a password: the OS user at the other end
   of the unix socket must be the user logging in; `cert_login_problem`, for `auth_type =
   cert`: the client certificate's common name must be the user.
4. `password_exchange`: given the user's secret (None: an unknown user) and auth_type, it
   asks for a cleartext, md5 or SCRAM-SHA-256 password and checks it (over TLS,
   SCRAM-SHA-256-PLUS is offered too, bound to the pooler's certificate). It returns
   `Authenticated`, with the SCRAM ClientKey that logs into servers as this user, or raises
   a PoolerError: 28P01 for a wrong password, and for an unknown user after a full mock
   SCRAM exchange (auth/scram.py), so that user names cannot be probed; 08P01 for what
   breaks the protocol. Before login a message is at most 64 KiB (MAX_AUTH_MESSAGE).

Never here: sockets, the event loop, the pooler's objects, logging.
"""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Callable, Generator
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Address, IPv6Network, ip_address
from typing import Final

from ..auth.md5 import is_md5_hash, md5_hash, md5_response
from ..auth.scram import (
    DEFAULT_ITERATIONS,
    MECHANISM,
    MECHANISM_PLUS,
    ScramAuthError,
    ScramDowngradeError,
    ScramMalformedError,
    ScramServerExchange,
    ScramVerifier,
    verifier_for_password,
)
from ..ini_values import parse_networks
from ..pooling.params import canonical_name
from ..protocol import errors
from ..protocol import messages as m
from ..protocol.errors import PoolerError
from ..protocol.framing import HEADER_SIZE, FramingError, MessageBuffer, MessageTooLarge
from ..protocol.proxy_header import (
    ProxyHeader,
    ProxyHeaderError,
    looks_like_proxy_header,
    parse_proxy_header,
)
from ..protocol.startup import (
    MAX_AUTH_MESSAGE,
    PROTOCOL_3_0,
    CancelRequest,
    GSSENCRequest,
    SSLRequest,
    StartupError,
    StartupMessage,
    parse_startup_packet,
    startup_packet_size,
)
from ..protocol.startup_options import OptionsError, parse_options

# Startup parameters that are not session settings and need no tracking.
_PLAIN_STARTUP_KEYS: Final = frozenset({"user", "database", "replication"})

# How the password is asked for (`auth_method`).
CLEARTEXT: Final = "cleartext"
MD5: Final = "md5"
SCRAM: Final = "scram"


# --- 0. the PROXY protocol header ----------------------------------------------------------


@dataclass(frozen=True)
class Proxied:
    """What `read_proxy_header` ended with: the header (None from a peer that is not a
    trusted balancer, which sent none), and the bytes after it, the startup packet's."""

    header: ProxyHeader | None
    rest: bytes


def trusted_proxy(address: str, sources: tuple[str, ...]) -> bool:
    """Whether a TCP peer at `address` is one of proxy_protocol_sources (an IPv4 peer seen
    on an IPv6 socket, ::ffff:a.b.c.d, counts as a.b.c.d)."""
    try:
        ip = ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in network for network in _networks(sources))


@functools.lru_cache(maxsize=4)
def _networks(sources: tuple[str, ...]) -> tuple[IPv4Network | IPv6Network, ...]:
    return parse_networks(sources)  # checked when the setting was read


def read_proxy_header(trusted: bool) -> Generator[bytes, bytes, Proxied]:
    """From a `trusted` peer (in proxy_protocol_sources), the PROXY header it must open
    with; a connection without one is refused. From any other peer, the connection must not
    open with one: a header there could name any address, so it is refused rather than
    believed (and rather than read as a bad startup packet, which would hide why)."""
    buffer = bytearray()
    opens = looks_like_proxy_header(buffer)
    while opens is None:
        buffer += yield b""
        opens = looks_like_proxy_header(buffer)
    if not trusted:
        if opens:
            raise errors.ClientProtocolError(
                "PROXY protocol header from an address not in proxy_protocol_sources")
        return Proxied(None, bytes(buffer))
    if not opens:
        raise errors.ClientProtocolError(
            "no PROXY protocol header from a proxy_protocol_sources address")
    while True:
        try:
            header = parse_proxy_header(buffer)
        except ProxyHeaderError as bad:
            raise errors.ClientProtocolError(str(bad)) from None
        if isinstance(header, ProxyHeader):
            return Proxied(header, bytes(buffer[header.size:]))
        buffer += yield b""


# --- 1. the startup packet -----------------------------------------------------------------


@dataclass(frozen=True)
class FirstPacket:
    """The packet `read_startup` ended at, and what the client sent after it."""

    packet: CancelRequest | StartupMessage
    rest: bytes


@dataclass(frozen=True)
class StartupTls:
    """What the startup packets may do about TLS on one connection (net/tls.py decides)."""

    offered: bool = False  # an SSLRequest is answered 'S' (a client context, over TCP)
    required: bool = False  # client_tls_sslmode require or stricter: no plaintext login
    active: bool = False  # the handshake is done: this reading runs inside TLS


NO_TLS: Final = StartupTls()


@dataclass(frozen=True)
class StartTls:
    """`read_startup` answered an SSLRequest 'S', or the client opened with a ClientHello
    (direct TLS, PostgreSQL 17: `hello` holds the bytes read of it): the TLS handshake comes
    next, and after it a new `read_startup` with `active` set. After an SSLRequest nothing
    is left over (bytes behind it are refused: they were not encrypted)."""

    hello: bytes = b""


# The first byte of a TLS record carrying a handshake: where a startup packet's length would
# start, a ClientHello (no startup packet is 0x16xxxxxx bytes long).
TLS_HANDSHAKE_RECORD: Final = 0x16


def read_startup(tls: StartupTls = NO_TLS,
                 ) -> Generator[bytes, bytes, FirstPacket | StartTls]:
    """Read startup packets until a CancelRequest or a StartupMessage, or an SSLRequest
    that `tls` lets TLS start at (see the module)."""
    buffer = bytearray()
    if tls.offered and not tls.active:
        while not buffer:
            buffer += yield b""
        if buffer[0] == TLS_HANDSHAKE_RECORD:
            return StartTls(bytes(buffer))
    while True:
        try:
            size = startup_packet_size(buffer)
        except StartupError as exc:
            # Garbage or a typed message before the startup packet: answered in v3,
            # FATAL 08P01, as PgBouncer does ("bad packet header").
            raise errors.ClientProtocolError(str(exc)) from None
        if size is None or len(buffer) < size:
            data = yield b""
            buffer += data
            continue
        packet = bytes(buffer[:size])
        del buffer[:size]
        try:
            parsed = parse_startup_packet(packet)
        except StartupError as bad:  # own name (mypyc)
            raise errors.ClientProtocolError(str(bad)) from None
        if isinstance(parsed, SSLRequest):
            if buffer:
                # Sent before the answer, so not encrypted whatever the answer: maybe
                # injected by a man in the middle (CVE-2021-23222). PgBouncer's text.
                raise errors.ClientProtocolError("received unencrypted data after SSL request")
            if tls.active:
                raise errors.ClientProtocolError("SSL req inside SSL")
            if tls.offered:
                yield b"S"
                return StartTls()
            data = yield b"N"
            buffer += data
        elif isinstance(parsed, GSSENCRequest):
            if buffer:
                raise errors.ClientProtocolError(
                    "received unencrypted data after GSSAPI encryption request")
            data = yield b"N"
            buffer += data
        elif isinstance(parsed, CancelRequest):
            return FirstPacket(parsed, bytes(buffer))  # allowed in plaintext, as PgBouncer
        else:
            if tls.required and not tls.active:
                raise errors.ClientProtocolError("SSL required")
            if parsed.minor > 0 or parsed.protocol_options:
                # The newest version for major 3 is 3.0, sent whole as PostgreSQL sends it.
                data = yield m.negotiate_protocol_version(
                    PROTOCOL_3_0, list(parsed.protocol_options))
                buffer += data
            return FirstPacket(parsed, bytes(buffer))


def login_names(params: dict[str, str]) -> tuple[str, str]:
    """The user and the database a StartupMessage's parameters log into."""
    user = params.get("user", "")
    if not user:
        raise errors.ClientProtocolError("no username supplied", errors.INVALID_AUTHORIZATION)
    return user, params.get("database") or user


def tracked_parameters(params: dict[str, str], track_extra: tuple[str, ...],
                       ignored: tuple[str, ...]) -> dict[str, str]:
    """The session parameters a StartupMessage sets, by their ParameterStatus names; an
    unknown one that ignore_startup_parameters does not list fails the login."""
    tracked: dict[str, str] = {}
    ignored_lower = {k.lower() for k in ignored}
    for key, value in params.items():
        if key in _PLAIN_STARTUP_KEYS:
            continue
        if key == "options":
            # `-c name=value` settings, each taken as a startup parameter of its own
            # (protocol/startup_options.py); the rest of the string is refused.
            tracked.update(_options_settings(value, track_extra, ignored_lower))
            continue
        name = canonical_name(key, track_extra)
        if name is not None:
            tracked[name] = value
        elif key.lower() not in ignored_lower:
            raise PoolerError(f"unsupported startup parameter: {key}")
    return tracked


def _options_settings(text: str, track_extra: tuple[str, ...],
                      ignored_lower: set[str]) -> dict[str, str]:
    """The tracked settings of an `options` string. With `options` itself in
    ignore_startup_parameters, what pypool cannot track (or parse) is dropped, not refused."""
    lenient = "options" in ignored_lower
    try:
        settings = parse_options(text)
    except OptionsError as bad:
        if lenient:
            return {}
        raise PoolerError(str(bad)) from None
    tracked: dict[str, str] = {}
    for key, value in settings:
        name = canonical_name(key, track_extra)
        if name is not None:
            tracked[name] = value
        elif key.lower() not in ignored_lower and not lenient:
            raise PoolerError(f"unsupported startup parameter in options: {key}")
    return tracked


# --- 2. waiting for the password request ---------------------------------------------------


def check_held(held: bytes | bytearray) -> None:
    """What the client sent after its StartupMessage, while it waits for the password
    request: nothing that could start a second login under a new name while the first one's
    lookup runs, and no more than one password message."""
    if held[:1] == b"\x00":
        raise errors.ClientProtocolError("client re-sent startup pkt")
    if len(held) > MAX_AUTH_MESSAGE + HEADER_SIZE:
        raise errors.ClientProtocolError(
            f"{len(held)} bytes sent before the authentication request"
        )


# --- 3. peer: no password, the OS user on the unix socket -----------------------------------


def check_peer(user: str, secret: str | None, peer_os_user: str | None) -> None:
    """`auth_type = peer`, as PgBouncer's login_as_unix_peer: `user` is in if the OS user at
    the other end of the unix socket (`peer_os_user`, the name of its SO_PEERCRED uid; None
    over TCP or for a uid with no name) has that name, and the pooler knows `user` (`secret`
    not None: auth_file or auth_query, whose password then logs into servers). Else a
    PoolerError with PgBouncer's text."""
    if secret is None or peer_os_user is None or peer_os_user != user:
        raise PoolerError("unix socket login rejected", errors.INVALID_AUTHORIZATION,
                          side=errors.Side.CLIENT)


def cert_login_problem(user: str, secret: str | None, tls_active: bool,
                       peer_names: tuple[str, ...] | None) -> str | None:
    """`auth_type = cert`, as PgBouncer's login_via_cert: `user` is in if the connection
    runs TLS, the client presented a certificate (`peer_names`: its subject's common names,
    None for no certificate), the pooler knows `user` and one of those names is `user`.
    Else why not, for the log; the client is told only "certificate authentication failed"."""
    if not tls_active:
        return "TLS connection required"
    if peer_names is None:
        return "TLS client certificate required"
    if secret is None:
        return "unknown user"
    if user not in peer_names:
        return "TLS certificate name mismatch"
    return None


CERT_LOGIN_FAILED: Final = "certificate authentication failed"


# --- 4. the password -----------------------------------------------------------------------


@dataclass(frozen=True)
class Authenticated:
    """The password checked out. AuthenticationOk is not in `reply`: it waits for the
    welcome, so that an unknown database or a failing server login is reported instead."""

    reply: bytes  # to send now: SCRAM's AuthenticationSASLFinal, else b""
    client_key: bytes | None  # SCRAM's ClientKey, recovered from the client's proof
    rest: bytes  # what the client sent after its last password message


def auth_method(secret: str | None, auth_type: str) -> str:
    """CLEARTEXT, MD5 or SCRAM: how to ask for the password under `auth_type` ("plain",
    "md5", "scram-sha-256") with this secret."""
    if auth_type == "plain":
        return CLEARTEXT
    use_md5 = auth_type == "md5" and not (secret and secret.startswith(MECHANISM))
    # scram-sha-256 with a stored md5 hash stays SCRAM, and fails: the operator asked for
    # SCRAM only (PgBouncer refuses the same), and an md5 challenge would tell the user
    # exists where an unknown one gets SCRAM.
    return MD5 if use_md5 else SCRAM


def password_exchange(user: str, secret: str | None, auth_type: str, max_packet: int,
                      channel_binding: bytes | None = None,
                      scram_iterations: int = DEFAULT_ITERATIONS,
                      ) -> Generator[bytes, bytes, Authenticated]:
    """Ask `user` for a password and check it against `secret` (None: an unknown user, whose
    exchange runs in full and fails as a wrong password would). Its first yield is the
    authentication request. `channel_binding`: over TLS, the tls-server-end-point data of
    the pooler's certificate, and SCRAM-SHA-256-PLUS is offered first, as PostgreSQL does.
    `scram_iterations`: of the verifier made from a plaintext secret, and of an unknown
    user's mock one (the same, so that the count tells nothing)."""
    # A password or SASL step is small: refuse a bigger header before its body.
    messages = MessageBuffer(min(max_packet, MAX_AUTH_MESSAGE + HEADER_SIZE))
    method = auth_method(secret, auth_type)
    if method == SCRAM:
        verifier = None
        if secret is not None and not is_md5_hash(secret):  # an md5 hash cannot check SCRAM
            verifier = (ScramVerifier.parse(secret)
                        or verifier_for_password(user, secret, scram_iterations))
        exchange = ScramServerExchange(verifier, user, channel_binding, scram_iterations)
        offered = [MECHANISM] if channel_binding is None else [MECHANISM_PLUS, MECHANISM]
        messages.feed((yield m.authentication_sasl(offered)))
        return (yield from _sasl(exchange, messages))
    salt = b""
    if method == MD5:
        salt = os.urandom(4)
        messages.feed((yield m.authentication(m.AUTH_MD5_PASSWORD, salt)))
    else:
        messages.feed((yield m.authentication(m.AUTH_CLEARTEXT_PASSWORD)))
    body = yield from _password_message(messages)
    password = m.parse_password(body)
    # A failed login is the client's failure: logged at WARNING, so `-q` still shows it.
    failed = PoolerError("password authentication failed", errors.INVALID_PASSWORD,
                         side=errors.Side.CLIENT)
    if secret is None:
        raise failed
    if method == MD5:
        stored = secret if is_md5_hash(secret) else md5_hash(secret, user)
        if password != md5_response(stored, salt):
            raise failed
    else:
        verifier = ScramVerifier.parse(secret)
        if verifier is not None:
            ok = _scram_matches(verifier, password)
        elif is_md5_hash(secret):
            ok = md5_hash(password, user) == secret
        else:
            ok = password == secret
        if not ok:
            raise failed
    return Authenticated(b"", None, messages.take_rest())


def _sasl(exchange: ScramServerExchange,
          messages: MessageBuffer) -> Generator[bytes, bytes, Authenticated]:
    """SASLInitialResponse, SASLResponse: SCRAM-SHA-256 after AuthenticationSASL."""
    failed = PoolerError("SASL authentication failed", errors.INVALID_PASSWORD,
                         side=errors.Side.CLIENT)
    body = yield from _password_message(messages)
    try:
        mechanism, initial = m.parse_sasl_initial_response(body)
    except (ValueError, struct.error) as bad:
        raise errors.ClientProtocolError(str(bad)) from None
    if mechanism == MECHANISM_PLUS and exchange.channel_binding is not None:
        exchange.plus = True
    elif mechanism != MECHANISM:
        raise failed  # PostgreSQL: 08P01, but clients may match 28P01
    if initial is None:
        # No initial response: an empty challenge asks for it (RFC 4422, as PostgreSQL
        # does); it comes back as a SASLResponse.
        messages.feed((yield m.authentication(m.AUTH_SASL_CONTINUE)))
        initial = yield from _password_message(messages)
    server_first = _scram_step(exchange.client_first, initial, failed)
    messages.feed((yield m.authentication(m.AUTH_SASL_CONTINUE, server_first)))
    body = yield from _password_message(messages)
    final = _scram_step(exchange.client_final, body, failed)
    return Authenticated(m.authentication(m.AUTH_SASL_FINAL, final), exchange.client_key,
                         messages.take_rest())


def _scram_step(step: Callable[[bytes], bytes], data: bytes, failed: PoolerError) -> bytes:
    try:
        return step(data)
    except ScramDowngradeError as downgrade:
        raise errors.ClientProtocolError(str(downgrade), errors.INVALID_AUTHORIZATION) from None
    except ScramMalformedError as malformed:
        # Broken grammar is a protocol violation (08P01), as in PostgreSQL.
        raise errors.ClientProtocolError(str(malformed)) from None
    except (ValueError, struct.error) as bad_message:  # own name (mypyc)
        raise errors.ClientProtocolError(str(bad_message)) from None
    except ScramAuthError:
        raise failed from None


def _password_message(messages: MessageBuffer) -> Generator[bytes, bytes, bytes]:
    """The body of the client's next PasswordMessage (SASLInitialResponse and SASLResponse
    share its type byte), waiting for bytes until it is whole."""
    while True:
        try:
            message = next(messages.messages(), None)
        except MessageTooLarge as too_large:
            raise errors.ClientProtocolError(
                f"password packet too long ({too_large.size} bytes, at most "
                f"{too_large.limit} before login)"
            ) from None
        except FramingError as bad_length:  # own name (mypyc)
            raise errors.ClientProtocolError(str(bad_length)) from None
        # Judged at its first byte, as PostgreSQL does: a StartupMessage sent again reads as
        # type 0 with a length of thousands, and must not be waited for.
        kind = message[0] if message is not None else messages.next_type()
        if kind != -1 and kind != m.PASSWORD_MESSAGE:
            raise errors.ClientProtocolError(
                f"expected a password message, got {chr(kind)!r}",
                errors.INVALID_AUTHORIZATION,
            )
        if message is not None:
            return message[1]
        data = yield b""
        messages.feed(data)


def _scram_matches(verifier: ScramVerifier, password: str) -> bool:
    """Whether a cleartext password produces this SCRAM verifier's StoredKey."""
    candidate = ScramVerifier.from_password(password, verifier.iterations, verifier.salt)
    return candidate.stored_key == verifier.stored_key
