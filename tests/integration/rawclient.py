"""A tiny blocking PostgreSQL frontend over a raw socket, for tests that must send what no
client library would: garbage, bad lengths, unknown message types, a FunctionCall.

Everything has a timeout: a read that waits longer than `timeout` seconds raises
`socket.timeout` (a test failure, never a hang).
"""

from __future__ import annotations

import socket
import ssl
import struct
from dataclasses import dataclass, field
from pathlib import Path

from pypool.protocol import messages as m

SSL_REQUEST = struct.pack("!II", 8, 80877103)  # what a client sends to ask for TLS


@dataclass
class Login:
    """What the pooler sent from the startup packet up to the first ReadyForQuery."""

    messages: list[tuple[int, bytes]] = field(default_factory=list)
    params: dict[str, str] = field(default_factory=dict)
    backend_key: tuple[int, int] | None = None
    error: dict[str, str] | None = None


class RawClient:
    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self._buf = b""

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- sending --------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_startup(
        self, params: dict[str, str], minor: int = 0, major: int = 3
    ) -> None:
        body = b"".join(m.cstring(k) + m.cstring(v) for k, v in params.items()) + b"\x00"
        self.send(struct.pack("!II", len(body) + 8, (major << 16) | minor) + body)

    def query(self, sql: str) -> None:
        self.send(m.query(sql))

    # --- receiving ------------------------------------------------------------------------

    def _fill(self, n: int) -> bool:
        while len(self._buf) < n:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return False
            self._buf += chunk
        return True

    def read_bytes(self, n: int) -> bytes:
        """Exactly n raw bytes (the answer to SSLRequest is one untyped byte)."""
        if not self._fill(n):
            raise EOFError(f"connection closed; got {self._buf!r}")
        data, self._buf = self._buf[:n], self._buf[n:]
        return data

    def read_message(self) -> tuple[int, bytes] | None:
        """The next message, or None when the pooler closed the connection."""
        if not self._fill(5):
            return None
        length = int.from_bytes(self._buf[1:5], "big")
        if not self._fill(1 + length):
            return None
        kind, body = self._buf[0], self._buf[5 : 1 + length]
        self._buf = self._buf[1 + length :]
        return kind, body

    def read_until(self, kind: int) -> list[tuple[int, bytes]]:
        """Messages up to and including the first of type `kind`; EOFError if it never comes."""
        out = []
        while True:
            msg = self.read_message()
            if msg is None:
                raise EOFError(f"closed before {chr(kind)!r}; got {out!r}")
            out.append(msg)
            if msg[0] == kind:
                return out

    def read_error_and_close(self) -> dict[str, str]:
        """Read to EOF: the fields of the ErrorResponse that must come before it."""
        error = None
        while True:
            msg = self.read_message()
            if msg is None:
                break
            if msg[0] == m.ERROR_RESPONSE:
                error = m.parse_error_fields(msg[1])
        assert error is not None, "connection closed without an ErrorResponse"
        return error

    def is_closed(self) -> bool:
        """True once the pooler has closed the connection (reads to EOF, discarding)."""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return True
            if not chunk:
                return True

    # --- whole exchanges ------------------------------------------------------------------

    def login(self, user: str, database: str, **params: str) -> Login:
        """A trust login (the pooler must run with auth_type=trust): up to ReadyForQuery or
        an ErrorResponse."""
        self.send_startup({"user": user, "database": database, **params})
        result = Login()
        while True:
            msg = self.read_message()
            if msg is None:
                raise EOFError(f"closed during login; got {result.messages!r}")
            result.messages.append(msg)
            kind, body = msg
            if kind == m.AUTHENTICATION:
                code, _ = m.parse_authentication(body)
                assert code == m.AUTH_OK, f"not a trust login: authentication request {code}"
            elif kind == m.PARAMETER_STATUS:
                name, value = m.parse_parameter_status(body)
                result.params[name] = value
            elif kind == m.BACKEND_KEY_DATA:
                result.backend_key = m.parse_backend_key_data(body)
            elif kind == m.ERROR_RESPONSE:
                result.error = m.parse_error_fields(body)
                return result
            elif kind == m.READY_FOR_QUERY:
                return result

    def simple_query(self, sql: str) -> tuple[list[list[str | None]], str, int]:
        """Rows (text), the last CommandComplete tag and the ReadyForQuery status.
        An ErrorResponse raises QueryError."""
        self.query(sql)
        rows: list[list[str | None]] = []
        tag = ""
        error = None
        for kind, body in self.read_until(m.READY_FOR_QUERY):
            if kind == m.DATA_ROW:
                rows.append(m.parse_data_row(body))
            elif kind == m.COMMAND_COMPLETE:
                tag = m.parse_command_tag(body)
            elif kind == m.ERROR_RESPONSE:
                error = m.parse_error_fields(body)
            elif kind == m.READY_FOR_QUERY:
                status = body[0]
        if error is not None:
            raise QueryError(error)
        return rows, tag, status


class TlsRawClient(RawClient):
    """RawClient over TLS: SSLRequest, 'S', then the handshake, verified against `root`."""

    def __init__(self, host: str, port: int, root: Path) -> None:
        super().__init__(host, port)
        self.send(SSL_REQUEST)
        assert self.read_bytes(1) == b"S"
        context = ssl.create_default_context(cafile=str(root))
        self.sock = context.wrap_socket(self.sock, server_hostname="localhost")


class QueryError(Exception):
    def __init__(self, fields: dict[str, str]) -> None:
        super().__init__(f"{fields.get('C')}: {fields.get('M')}")
        self.fields = fields

