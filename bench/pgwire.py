"""A minimal asyncio PostgreSQL client: startup, SCRAM-SHA-256 login and simple queries.

The harness needs a client that is cheap enough to hold 10,000 idle connections from a
few processes, and that can probe a pooler or run setup SQL without extra dependencies.
It speaks only what those uses need: protocol 3.0 startup, SCRAM-SHA-256 (or no
password), the simple query protocol, and Terminate. SCRAM's expensive step (PBKDF2 over
the password) depends only on password, salt and iteration count, which a server reuses
for every login of a role, so it is computed once per process and cached.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import hmac
import os
import struct

PROTOCOL_VERSION = 196608  # 3.0

AUTH_OK = 0
AUTH_SASL = 10
AUTH_SASL_CONTINUE = 11
AUTH_SASL_FINAL = 12


class PgError(Exception):
    """An ErrorResponse from the server, or a protocol step this client cannot take."""


def message(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("!i", len(payload) + 4) + payload


def _error_text(payload: bytes) -> str:
    fields = {}
    for part in payload.split(b"\0"):
        if part:
            fields[chr(part[0])] = part[1:].decode(errors="replace")
    return f"{fields.get('S', 'ERROR')}: {fields.get('M', '?')} (SQLSTATE {fields.get('C', '?')})"


@functools.lru_cache(maxsize=16)
def _scram_keys(password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes, bytes]:
    """Return (ClientKey, StoredKey, ServerKey) for a password, salt and iteration count."""
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    return client_key, hashlib.sha256(client_key).digest(), server_key


class Connection:
    """One logged-in connection; use :func:`connect` to make one."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def _read(self) -> tuple[bytes, bytes]:
        header = await self._reader.readexactly(5)
        (length,) = struct.unpack("!i", header[1:])
        return header[:1], await self._reader.readexactly(length - 4)

    async def _login(self, user: str, password: str, database: str) -> None:
        params = f"user\0{user}\0database\0{database}\0application_name\0pypool-bench\0\0"
        payload = struct.pack("!i", PROTOCOL_VERSION) + params.encode()
        self._writer.write(struct.pack("!i", len(payload) + 4) + payload)
        expected_server_signature = b""
        while True:
            kind, body = await self._read()
            if kind == b"E":
                raise PgError(_error_text(body))
            if kind == b"Z":
                return
            if kind != b"R":
                continue  # ParameterStatus, BackendKeyData, notices
            (code,) = struct.unpack("!i", body[:4])
            if code == AUTH_SASL:
                if b"SCRAM-SHA-256" not in body[4:].split(b"\0"):
                    raise PgError(f"server offers no SCRAM-SHA-256: {body[4:]!r}")
                nonce = base64.b64encode(os.urandom(18)).decode()
                client_first_bare = f"n=,r={nonce}"
                first = ("n,," + client_first_bare).encode()
                self._writer.write(
                    message(b"p", b"SCRAM-SHA-256\0" + struct.pack("!i", len(first)) + first)
                )
            elif code == AUTH_SASL_CONTINUE:
                server_first = body[4:].decode()
                attrs = dict(item.split("=", 1) for item in server_first.split(","))
                client_key, stored_key, server_key = _scram_keys(
                    password, base64.b64decode(attrs["s"]), int(attrs["i"])
                )
                final_without_proof = f"c=biws,r={attrs['r']}"
                auth_message = f"{client_first_bare},{server_first},{final_without_proof}".encode()
                signature = hmac.digest(stored_key, auth_message, "sha256")
                proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
                expected_server_signature = hmac.digest(server_key, auth_message, "sha256")
                final = f"{final_without_proof},p={base64.b64encode(proof).decode()}"
                self._writer.write(message(b"p", final.encode()))
            elif code == AUTH_SASL_FINAL:
                verifier = body[4:].decode().partition("v=")[2]
                if base64.b64decode(verifier) != expected_server_signature:
                    raise PgError("server's SCRAM signature does not match")
            elif code != AUTH_OK:
                raise PgError(f"unsupported authentication request {code}")

    async def query(self, sql: str) -> list[tuple[str | None, ...]]:
        """Run one simple-protocol query and return its rows as text."""
        self._writer.write(message(b"Q", sql.encode() + b"\0"))
        rows: list[tuple[str | None, ...]] = []
        error = None
        while True:
            kind, body = await self._read()
            if kind == b"D":
                rows.append(_data_row(body))
            elif kind == b"E":
                error = _error_text(body)
            elif kind == b"Z":
                if error:
                    raise PgError(error)
                return rows

    def hand_over(self, protocol: asyncio.BaseProtocol) -> asyncio.Transport:
        """Give the logged-in socket to `protocol` (bench/pool_floor.py's servers) and return
        its transport. Keep this Connection referenced while the transport is in use: its
        StreamWriter closes the socket when it is collected."""
        transport = self._writer.transport
        transport.set_protocol(protocol)
        return transport  # type: ignore[return-value]

    async def close(self) -> None:
        """Send Terminate and close the socket."""
        try:
            self._writer.write(message(b"X", b""))
            self._writer.close()
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass


def _data_row(body: bytes) -> tuple[str | None, ...]:
    (count,) = struct.unpack("!h", body[:2])
    offset, values = 2, []
    for _ in range(count):
        (length,) = struct.unpack("!i", body[offset : offset + 4])
        offset += 4
        if length < 0:
            values.append(None)
        else:
            values.append(body[offset : offset + length].decode())
            offset += length
    return tuple(values)


async def connect(host: str, port: int, user: str, password: str, database: str) -> Connection:
    """Open a TCP connection and log in; raises :class:`PgError` or ``OSError``."""
    reader, writer = await asyncio.open_connection(host, port)
    connection = Connection(reader, writer)
    try:
        await connection._login(user, password, database)
    except BaseException:
        writer.close()
        raise
    return connection


async def run_sql(host: str, port: int, user: str, password: str, database: str, *sql: str):
    """Log in, run each statement, and return the rows of the last one."""
    connection = await connect(host, port, user, password, database)
    try:
        rows: list[tuple[str | None, ...]] = []
        for statement in sql:
            rows = await connection.query(statement)
        return rows
    finally:
        await connection.close()
