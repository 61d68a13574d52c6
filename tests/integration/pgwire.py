"""A small raw-protocol PostgreSQL client on asyncio streams, for tests that must control
every message: which ones go in one write, when to Sync, and exactly what comes back.

`Wire.connect()` logs in (SCRAM-SHA-256, md5 or trust); `send()` writes frontend messages
built by the functions below; `read()` returns one backend message as (type, body);
`until_ready()` reads up to a ReadyForQuery. `summary()` turns backend messages into plain
tuples that compare equal across connections (no backend pids, no error file/line fields).
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
from collections.abc import Iterable, Sequence

from scramp import ScramClient

from pypool.protocol import messages as m

PROTOCOL_VERSION = 196608


class WireError(Exception):
    """Login failed or the connection broke."""


def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


def _cstr(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return raw + b"\x00"


# --- frontend messages ---------------------------------------------------------------------


def parse(name: str | bytes, sql: str, types: Sequence[int] = ()) -> bytes:
    body = _cstr(name) + _cstr(sql) + struct.pack("!H", len(types))
    body += b"".join(struct.pack("!I", oid) for oid in types)
    return message(b"P", body)


def bind(portal: str | bytes, statement: str | bytes,
         params: Sequence[str | None] = (), result_binary: bool = False) -> bytes:
    body = _cstr(portal) + _cstr(statement)
    body += struct.pack("!H", 0)  # all parameters in text
    body += struct.pack("!H", len(params))
    for value in params:
        if value is None:
            body += struct.pack("!i", -1)
        else:
            raw = value.encode()
            body += struct.pack("!i", len(raw)) + raw
    body += struct.pack("!HH", 1, 1) if result_binary else struct.pack("!H", 0)
    return message(b"B", body)


def describe(what: str, name: str | bytes) -> bytes:
    return message(b"D", what.encode() + _cstr(name))


def execute(portal: str | bytes = "", max_rows: int = 0) -> bytes:
    return message(b"E", _cstr(portal) + struct.pack("!I", max_rows))


def close(what: str, name: str | bytes) -> bytes:
    return message(b"C", what.encode() + _cstr(name))


def sync() -> bytes:
    return message(b"S")


def flush() -> bytes:
    return message(b"H")


def query(sql: str) -> bytes:
    return message(b"Q", _cstr(sql))


def terminate() -> bytes:
    return message(b"X")


# --- backend messages ----------------------------------------------------------------------


error_fields = m.parse_error_fields


def summary(kind: bytes, body: bytes) -> tuple[object, ...]:
    """A backend message as a comparable tuple."""
    if kind == b"E" or kind == b"N":
        fields = error_fields(body)
        return (kind.decode(), fields.get("C"), fields.get("M"))
    if kind == b"D":
        return ("D", tuple(m.parse_data_row(body)))
    if kind == b"T":
        (count,) = struct.unpack_from("!H", body, 0)
        pos, columns = 2, []
        for _ in range(count):
            end = body.index(b"\x00", pos)
            name = body[pos:end].decode()
            _table, _col, type_oid, _size, _mod, fmt = struct.unpack_from("!IhIhih", body,
                                                                           end + 1)
            columns.append((name, type_oid, fmt))
            pos = end + 1 + 18
        return ("T", tuple(columns))
    if kind == b"t":
        (count,) = struct.unpack_from("!H", body, 0)
        return ("t", struct.unpack_from(f"!{count}I", body, 2))
    if kind == b"C":
        return ("C", body.rstrip(b"\x00").decode())
    if kind == b"Z":
        return ("Z", body.decode())
    return (kind.decode(),)


class Wire:
    """One connection speaking the frontend/backend protocol 3.0 by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.params: dict[str, str] = {}
        self.backend_key = (0, 0)

    @classmethod
    async def connect(cls, host: str, port: int, user: str, password: str, database: str,
                      timeout: float = 10.0, **params: str) -> Wire:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        wire = cls(reader, writer)
        try:
            await asyncio.wait_for(wire._login(user, password, database, params), timeout)
        except BaseException:
            writer.close()
            raise
        return wire

    async def _login(self, user: str, password: str, database: str,
                     params: dict[str, str] | None = None) -> None:
        body = struct.pack("!I", PROTOCOL_VERSION)
        body += _cstr("user") + _cstr(user) + _cstr("database") + _cstr(database)
        for name, value in (params or {}).items():
            body += _cstr(name) + _cstr(value)
        body += b"\x00"
        self.writer.write(struct.pack("!I", len(body) + 4) + body)
        scram: ScramClient | None = None
        while True:
            kind, payload = await self.read()
            if kind == b"R":
                (code,) = struct.unpack_from("!I", payload, 0)
                if code == 0:
                    continue
                if code == 5:
                    salt = payload[4:8]
                    inner = hashlib.md5((password + user).encode()).hexdigest()
                    outer = hashlib.md5(inner.encode() + salt).hexdigest()
                    self.writer.write(message(b"p", _cstr("md5" + outer)))
                elif code == 3:
                    self.writer.write(message(b"p", _cstr(password)))
                elif code == 10:
                    mechanisms = [x.decode() for x in payload[4:].split(b"\x00") if x]
                    scram = ScramClient(mechanisms, user, password)
                    first = scram.get_client_first().encode()
                    self.writer.write(message(
                        b"p", _cstr(scram.mechanism_name) + struct.pack("!I", len(first)) + first
                    ))
                elif code == 11:
                    assert scram is not None
                    scram.set_server_first(payload[4:].decode())
                    self.writer.write(message(b"p", scram.get_client_final().encode()))
                elif code == 12:
                    assert scram is not None
                    scram.set_server_final(payload[4:].decode())
                else:
                    raise WireError(f"unsupported authentication request {code}")
            elif kind == b"S":
                name, value, _ = payload.split(b"\x00", 2)
                self.params[name.decode()] = value.decode()
            elif kind == b"K":
                self.backend_key = struct.unpack("!II", payload[:8])
            elif kind == b"E":
                raise WireError(error_fields(payload).get("M", "login failed"))
            elif kind == b"Z":
                return

    def send(self, *messages: bytes) -> None:
        """Write messages in one go (the pooler sees them in as few reads as TCP allows)."""
        self.writer.write(b"".join(messages))

    async def read(self) -> tuple[bytes, bytes]:
        try:
            header = await self.reader.readexactly(5)
            kind = header[:1]
            (length,) = struct.unpack("!I", header[1:])
            body = await self.reader.readexactly(length - 4)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise WireError(f"connection lost: {exc}") from None
        return kind, body

    async def until_ready(self, timeout: float = 30.0) -> list[tuple[bytes, bytes]]:
        """Messages up to and including the next ReadyForQuery (ParameterStatus dropped)."""
        got = []
        async with asyncio.timeout(timeout):
            while True:
                kind, body = await self.read()
                if kind == b"S":
                    continue
                got.append((kind, body))
                if kind == b"Z":
                    return got

    async def read_n(self, count: int, timeout: float = 30.0) -> list[tuple[bytes, bytes]]:
        """The next `count` messages (ParameterStatus and notices dropped)."""
        got = []
        async with asyncio.timeout(timeout):
            while len(got) < count:
                kind, body = await self.read()
                if kind in (b"S", b"N"):
                    continue
                got.append((kind, body))
        return got

    async def run(self, *messages: bytes, syncs: int = 1) -> list[tuple[object, ...]]:
        """Send messages, read up to the `syncs`-th ReadyForQuery, return the summaries."""
        self.send(*messages)
        out: list[tuple[object, ...]] = []
        for _ in range(syncs):
            out += [summary(k, b) for k, b in await self.until_ready()]
        return out

    async def close(self) -> None:
        try:
            self.writer.write(terminate())
            await self.writer.drain()
        except (ConnectionError, RuntimeError):
            pass
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, RuntimeError):
            pass


def kinds(summaries: Iterable[tuple[object, ...]]) -> str:
    """The message types of summaries as one string, e.g. "12DCZ"."""
    return "".join(str(s[0]) for s in summaries)
