"""The pooler logging into PostgreSQL, as an exchange that takes and returns bytes.

`login` is a generator run by `core/exchange.advance` (see there). Its first yield is the
StartupMessage; then, sent what the server answers, it yields the replies to its
Authentication requests: a cleartext or md5 password, or SASL SCRAM-SHA-256 with the
password or, when the pooler holds only a verifier, with the ClientKey a client's own proof
gave up (auth/scram.py). It collects ParameterStatus and BackendKeyData and returns
`LoggedIn` at ReadyForQuery.

With `server_tls_sslmode` above disable an SSLRequest goes first (`SSL_REQUEST`), and
`tls_answer` reads the server's one-byte answer: 'S', the adapter does the TLS handshake
and then runs `login`; 'N', plaintext unless the mode requires TLS. Over TLS, when the server
offers SCRAM-SHA-256-PLUS and its certificate has a tls-server-end-point binding, `login`
uses it (`channel_binding`).

It raises ServerLoginError, carrying the ErrorResponse to forward to the clients that waited
for this login, for the server's own ErrorResponse (as the server sent it), for a request it
has no usable secret for, and for what it cannot follow (08P01). The adapter is
net/server.py; never here: sockets, the event loop, the pooler's objects.
"""

from __future__ import annotations

import struct
from collections.abc import Generator
from dataclasses import dataclass
from typing import Final

from ..auth.md5 import md5_response_from_secret
from ..auth.scram import MECHANISM, MECHANISM_PLUS, ScramAuthError, ScramClientLogin
from ..protocol import errors
from ..protocol import messages as m
from ..protocol.framing import MessageBuffer
from ..protocol.startup import SSL_REQUEST_CODE

SSL_REQUEST: Final = struct.pack("!II", 8, SSL_REQUEST_CODE)
# server_tls_sslmode values that refuse a server answering 'N'.
_TLS_REQUIRED: Final = ("require", "verify-ca", "verify-full")


class ServerLoginError(Exception):
    """The server refused the login; `error` is its ErrorResponse, ready to forward.
    `unreachable`: no verdict on the login, the connection went before one (closed during
    it); the pool's queued clients wait for the next try (pooler/server_logins.py)."""

    def __init__(self, text: str, error: bytes, unreachable: bool = False) -> None:
        super().__init__(text)
        self.error = error
        self.unreachable = unreachable


def tls_answer(data: bytes, sslmode: str) -> bool:
    """The server's answer to the SSLRequest: True, start TLS; False, log in in plaintext
    (it said 'N' and `sslmode` allows that). PgBouncer's texts for what it refuses."""
    if data[:1] == b"E":
        # A server that failed before any TLS answers with its ErrorResponse (PostgreSQL
        # out of connection slots: "sorry, too many clients already"); read as libpq does.
        messages = MessageBuffer()
        messages.feed(data)
        message = next(messages.messages(), None)
        if message is not None and message[0] == m.ERROR_RESPONSE:
            fields = m.parse_error_fields(message[1])
            raise ServerLoginError(fields.get("M", "server login failed"), m.message(*message))
    if data[:1] not in (b"S", b"N"):
        raise _tls_refused("bad sslreq answer")
    if len(data) > 1:
        # Sent before the handshake, so not encrypted: maybe injected (CVE-2021-23222).
        raise _tls_refused("received unencrypted data after SSL response")
    if data == b"S":
        return True
    if sslmode in _TLS_REQUIRED:
        raise _tls_refused("server refused SSL")
    return False


def _tls_refused(text: str) -> ServerLoginError:
    return ServerLoginError(text, m.error_response(text, "08006", "FATAL"))


@dataclass(frozen=True)
class LoggedIn:
    """What the server said about itself during its login."""

    params: dict[str, str]  # ParameterStatus, in the order sent
    backend_pid: int  # BackendKeyData, for CancelRequests
    backend_secret: int
    rest: bytes  # what the server sent after its ReadyForQuery


def login(
    user: str, database: str, startup_params: dict[str, str], *,
    password: str | None = None, md5_hash: str | None = None,
    client_key: bytes | None = None, server_key: bytes | None = None,
    channel_binding: bytes | None = None,
) -> Generator[bytes, bytes, LoggedIn]:
    """Log into `database` as `user` with the secrets there are: `password`, else
    `md5_hash` for md5, else `client_key` and the verifier's `server_key` for SCRAM.
    `channel_binding`: over TLS, the server certificate's tls-server-end-point data, for
    SCRAM-SHA-256-PLUS when the server offers it."""
    params = {"user": user, "database": database}
    params.update(startup_params)
    messages = MessageBuffer()
    messages.feed((yield m.startup_message(params)))
    found: dict[str, str] = {}
    backend_pid = backend_secret = 0
    scram: ScramClientLogin | None = None
    while True:
        message = next(messages.messages(), None)
        if message is None:
            messages.feed((yield b""))
            continue
        kind, body = message
        reply = b""
        try:
            if kind == m.AUTHENTICATION:
                code, payload = m.parse_authentication(body)
                if code == m.AUTH_SASL:
                    offered = m.parse_sasl_mechanisms(payload)
                    binding = channel_binding if MECHANISM_PLUS in offered else None
                    if MECHANISM not in offered and binding is None:
                        raise _no_password(user, "SASL without SCRAM-SHA-256")
                    if password is not None:
                        scram = ScramClientLogin(user, password=password,
                                                 channel_binding=binding)
                    elif client_key is not None and server_key is not None:
                        scram = ScramClientLogin(user, client_key=client_key,
                                                 server_key=server_key, channel_binding=binding)
                    else:
                        raise _no_password(user, "SCRAM")
                    reply = m.sasl_initial_response(scram.mechanism, scram.client_first())
                else:
                    reply = _answer(code, payload, user, password, md5_hash, scram)
            elif kind == m.PARAMETER_STATUS:
                name, value = m.parse_parameter_status(body)
                found[name] = value
            elif kind == m.BACKEND_KEY_DATA:
                backend_pid, backend_secret = m.parse_backend_key_data(body)
            elif kind == m.ERROR_RESPONSE:
                fields = m.parse_error_fields(body)
                text = fields.get("M", "server login failed")
                if "C" not in fields:  # no SQLSTATE: no PostgreSQL's; the client gets one
                    raise ServerLoginError(text, m.error_response(
                        text, errors.PROTOCOL_VIOLATION, fields.get("S", "FATAL")))
                raise ServerLoginError(text, m.message(kind, body))
            elif kind == m.READY_FOR_QUERY:
                return LoggedIn(found, backend_pid, backend_secret, messages.take_rest())
            elif kind not in (m.NOTICE_RESPONSE, m.NEGOTIATE_PROTOCOL_VERSION):
                raise ValueError(f"unexpected message {chr(kind)!r} during login")
        except (ScramAuthError, ValueError, KeyError, IndexError) as bad:
            text = f"server login failed: {bad}"
            raise ServerLoginError(text, m.error_response(text, "08P01", "FATAL")) from None
        if reply:
            messages.feed((yield reply))


def _answer(code: int, payload: bytes, user: str, password: str | None,
            md5_hash: str | None, scram: ScramClientLogin | None) -> bytes:
    """The reply to an Authentication request other than AuthenticationSASL (b"" for
    none: AuthenticationOk, and SASLFinal once it verifies)."""
    if code == m.AUTH_OK:
        return b""
    if code == m.AUTH_CLEARTEXT_PASSWORD:
        if password is None:
            raise _no_password(user, "cleartext")
        return m.password_message(m.cstring(password))
    if code == m.AUTH_MD5_PASSWORD:
        secret = password or md5_hash
        if secret is None:
            raise _no_password(user, "md5")
        return m.password_message(m.cstring(md5_response_from_secret(secret, user, payload[:4])))
    if code == m.AUTH_SASL_CONTINUE:
        if scram is None:
            raise ValueError("SASLContinue without SASL")
        return m.password_message(scram.server_first(payload))
    if code == m.AUTH_SASL_FINAL:
        if scram is None:
            raise ValueError("SASLFinal without SASL")
        scram.server_final(payload)
        return b""
    raise _no_password(user, f"authentication method {code}")


def _no_password(user: str, method: str) -> ServerLoginError:
    # "wrong password type" first: PgBouncer's words, which its users grep for.
    text = (
        f"wrong password type: cannot do {method} authentication to the server for user "
        f'"{user}": no usable password'
    )
    return ServerLoginError(text, m.error_response(text, "08P01", "FATAL"))
