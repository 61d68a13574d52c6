"""Message type bytes, builders for what the pooler sends, parsers for what it reads.

Only the messages the pooler must understand are parsed; everything else is forwarded as
bytes. Names follow the "Message Formats" section of the PostgreSQL protocol chapter.
"""

from __future__ import annotations

import struct
import sys
from typing import Final

from .framing import HEADER_SIZE, FramingError, header_at
from .startup import CANCEL_REQUEST_CODE, PROTOCOL_3_0

# Frontend (client to server) message types.
BIND: Final[int] = ord("B")
CLOSE: Final[int] = ord("C")
COPY_DATA: Final[int] = ord("d")
COPY_DONE: Final[int] = ord("c")
COPY_FAIL: Final[int] = ord("f")
DESCRIBE: Final[int] = ord("D")
EXECUTE: Final[int] = ord("E")
FLUSH: Final[int] = ord("H")
FUNCTION_CALL: Final[int] = ord("F")
PARSE: Final[int] = ord("P")
PASSWORD_MESSAGE: Final[int] = ord("p")  # also SASLInitialResponse and SASLResponse
QUERY: Final[int] = ord("Q")
SYNC: Final[int] = ord("S")
TERMINATE: Final[int] = ord("X")

# Backend (server to client) message types.
AUTHENTICATION: Final[int] = ord("R")
BACKEND_KEY_DATA: Final[int] = ord("K")
BIND_COMPLETE: Final[int] = ord("2")
CLOSE_COMPLETE: Final[int] = ord("3")
COMMAND_COMPLETE: Final[int] = ord("C")
COPY_IN_RESPONSE: Final[int] = ord("G")
COPY_OUT_RESPONSE: Final[int] = ord("H")
COPY_BOTH_RESPONSE: Final[int] = ord("W")
DATA_ROW: Final[int] = ord("D")
EMPTY_QUERY_RESPONSE: Final[int] = ord("I")
ERROR_RESPONSE: Final[int] = ord("E")
FUNCTION_CALL_RESPONSE: Final[int] = ord("V")
NEGOTIATE_PROTOCOL_VERSION: Final[int] = ord("v")
NO_DATA: Final[int] = ord("n")
NOTICE_RESPONSE: Final[int] = ord("N")
NOTIFICATION_RESPONSE: Final[int] = ord("A")
PARAMETER_DESCRIPTION: Final[int] = ord("t")
PARAMETER_STATUS: Final[int] = ord("S")
PARSE_COMPLETE: Final[int] = ord("1")
PORTAL_SUSPENDED: Final[int] = ord("s")
READY_FOR_QUERY: Final[int] = ord("Z")
ROW_DESCRIPTION: Final[int] = ord("T")

# Authentication request codes (the Int32 after 'R').
AUTH_OK: Final = 0
AUTH_CLEARTEXT_PASSWORD: Final = 3
AUTH_MD5_PASSWORD: Final = 5
AUTH_SASL: Final = 10
AUTH_SASL_CONTINUE: Final = 11
AUTH_SASL_FINAL: Final = 12

# ReadyForQuery transaction status bytes.
TX_IDLE: Final[int] = ord("I")
TX_IN_BLOCK: Final[int] = ord("T")
TX_FAILED: Final[int] = ord("E")

_HEADER: Final = struct.Struct("!cI")
_INT32: Final = struct.Struct("!I")
_SIGNED_INT32: Final = struct.Struct("!i")


def message(kind: int, body: bytes = b"") -> bytes:
    """Frame `body` as one message of type `kind`."""
    return bytes((kind,)) + _INT32.pack(len(body) + 4) + body


def cstring(text: str) -> bytes:
    return text.encode() + b"\x00"


# --- builders: backend messages the pooler sends to clients -------------------------------


def authentication(code: int, payload: bytes = b"") -> bytes:
    return message(AUTHENTICATION, _INT32.pack(code) + payload)


def authentication_sasl(mechanisms: list[str]) -> bytes:
    return authentication(AUTH_SASL, b"".join(cstring(m) for m in mechanisms) + b"\x00")


def parameter_status(name: str, value: str) -> bytes:
    return message(PARAMETER_STATUS, cstring(name) + cstring(value))


def backend_key_data(pid: int, secret: int) -> bytes:
    return message(BACKEND_KEY_DATA, struct.pack("!II", pid, secret))


def ready_for_query(status: int = TX_IDLE) -> bytes:
    return message(READY_FOR_QUERY, bytes((status,)))


def error_response(message_text: str, sqlstate: str, severity: str = "ERROR") -> bytes:
    body = (
        b"S" + cstring(severity) + b"V" + cstring(severity) + b"C" + cstring(sqlstate)
        + b"M" + cstring(message_text) + b"\x00"
    )
    return message(ERROR_RESPONSE, body)


def notice_response(message_text: str, sqlstate: str = "00000", severity: str = "NOTICE") -> bytes:
    body = (
        b"S" + cstring(severity) + b"V" + cstring(severity) + b"C" + cstring(sqlstate)
        + b"M" + cstring(message_text) + b"\x00"
    )
    return message(NOTICE_RESPONSE, body)


def negotiate_protocol_version(newest_version: int, unsupported: list[str]) -> bytes:
    """NegotiateProtocolVersion: the newest version supported for the major version asked
    for, as PostgreSQL sends it (major << 16 | minor, 0x00030000 for 3.0, which libpq 18
    reads as a full version), then the `_pq_.` options it does not know."""
    body = _INT32.pack(newest_version) + _INT32.pack(len(unsupported))
    body += b"".join(cstring(name) for name in unsupported)
    return message(NEGOTIATE_PROTOCOL_VERSION, body)


def command_complete(tag: str) -> bytes:
    return message(COMMAND_COMPLETE, cstring(tag))


def parse_complete() -> bytes:
    return message(PARSE_COMPLETE)


def close_complete() -> bytes:
    return message(CLOSE_COMPLETE)


def empty_query_response() -> bytes:
    return message(EMPTY_QUERY_RESPONSE)


def row_description(columns: list[tuple[str, int]]) -> bytes:
    """RowDescription for a result the pooler makes itself: (name, type oid) per column, text."""
    body = struct.pack("!H", len(columns))
    for name, type_oid in columns:
        size = {20: 8, 23: 4, 16: 1}.get(type_oid, -1)
        body += cstring(name) + struct.pack("!IhIhih", 0, 0, type_oid, size, -1, 0)
    return message(ROW_DESCRIPTION, body)


def data_row(values: list[str | None]) -> bytes:
    body = struct.pack("!H", len(values))
    for value in values:
        if value is None:
            body += b"\xff\xff\xff\xff"
        else:
            raw = value.encode()
            body += _INT32.pack(len(raw)) + raw
    return message(DATA_ROW, body)


# --- builders: frontend messages the pooler sends to servers ------------------------------


def startup_message(params: dict[str, str], minor: int = 0) -> bytes:
    """A StartupMessage of protocol 3.`minor` (the pooler speaks 3.0 to servers)."""
    body = struct.pack("!I", PROTOCOL_3_0 | minor) + b"".join(
        cstring(k) + cstring(v) for k, v in params.items()
    ) + b"\x00"
    return _INT32.pack(len(body) + 4) + body


def cancel_request(pid: int, secret: int) -> bytes:
    return struct.pack("!IIII", 16, CANCEL_REQUEST_CODE, pid, secret)


def query(sql: str) -> bytes:
    return message(QUERY, cstring(sql))


def password_message(payload: bytes) -> bytes:
    return message(PASSWORD_MESSAGE, payload)


def sasl_initial_response(mechanism: str, data: bytes) -> bytes:
    return message(PASSWORD_MESSAGE, cstring(mechanism) + _INT32.pack(len(data)) + data)


def terminate() -> bytes:
    return message(TERMINATE)


def sync() -> bytes:
    return message(SYNC)


def describe_portal(portal: bytes = b"") -> bytes:
    return message(DESCRIBE, b"P" + portal + b"\x00")


def execute(portal: bytes = b"", max_rows: int = 0) -> bytes:
    return message(EXECUTE, portal + b"\x00" + _INT32.pack(max_rows))


# --- parsers ------------------------------------------------------------------------------


def parse_error_fields(body: bytes | memoryview) -> dict[str, str]:
    """The fields of an ErrorResponse or NoticeResponse body, keyed by their code letter."""
    fields: dict[str, str] = {}
    raw = bytes(body)
    for part in raw.split(b"\x00"):
        if part:
            fields[chr(part[0])] = part[1:].decode("utf-8", "replace")
    return fields


def fatal_error(data: bytes) -> dict[str, str] | None:
    """The fields of the first ErrorResponse of severity FATAL or PANIC among the whole
    backend messages in `data` (a part message at its end is not looked at), or None."""
    pos, n = 0, len(data)
    while n - pos >= HEADER_SIZE:
        try:
            kind, size = header_at(data, pos)
        except FramingError:
            break
        end = pos + size
        if end > n:
            break
        if kind == ERROR_RESPONSE:
            fields = parse_error_fields(data[pos + HEADER_SIZE : end])
            if fields.get("V", fields.get("S")) in ("FATAL", "PANIC"):
                return fields
        pos = end
    return None


def parse_data_row(body: bytes | memoryview) -> list[str | None]:
    """The column values of a DataRow body, as text (None for SQL NULL)."""
    raw = bytes(body)
    (count,) = struct.unpack_from("!H", raw, 0)
    pos = 2
    values: list[str | None] = []
    for _ in range(count):
        (size,) = struct.unpack_from("!i", raw, pos)
        pos += 4
        if size < 0:
            values.append(None)
        else:
            values.append(raw[pos : pos + size].decode("utf-8", "replace"))
            pos += size
    return values


def parse_parameter_status(body: bytes | memoryview) -> tuple[str, str]:
    """Name and value, interned: every server reports the same few, and a client's values
    are copied from its servers', so the comparison at each link (pooling/params.covers)
    mostly meets the very same objects, compared by identity."""
    raw = bytes(body)
    name, _, rest = raw.partition(b"\x00")
    value = rest.split(b"\x00", 1)[0]
    return (sys.intern(name.decode("utf-8", "replace")),
            sys.intern(value.decode("utf-8", "replace")))


def parse_command_tag(body: bytes | memoryview) -> str:
    return bytes(body).split(b"\x00", 1)[0].decode("ascii", "replace")


def parse_query_text(body: bytes | memoryview) -> str:
    return bytes(body).split(b"\x00", 1)[0].decode("utf-8", "replace")


def parse_backend_key_data(body: bytes | memoryview) -> tuple[int, int]:
    pid, secret = struct.unpack_from("!II", body, 0)
    return pid, secret


def parse_authentication(body: bytes | memoryview) -> tuple[int, bytes]:
    (code,) = _INT32.unpack_from(body, 0)
    return code, bytes(body[4:])


def parse_sasl_mechanisms(payload: bytes) -> list[str]:
    return [m.decode() for m in payload.split(b"\x00") if m]


def parse_sasl_initial_response(body: bytes | memoryview) -> tuple[str, bytes | None]:
    """Mechanism name and initial response (the client-first-message) of a
    SASLInitialResponse; None when the client sent none (length -1).

    The Int32 length must account for the rest of the body exactly, as PostgreSQL checks
    it (pq_getmsgbytes, then pq_getmsgend); anything else raises ValueError.
    """
    raw = bytes(body)
    end = raw.find(b"\x00")
    if end < 0:
        raise ValueError("invalid SASLInitialResponse: mechanism name not terminated")
    rest = raw[end + 1 :]
    if len(rest) < 4:
        raise ValueError("invalid SASLInitialResponse: no length")
    (length,) = _SIGNED_INT32.unpack_from(rest, 0)
    data = rest[4:]
    if length == -1:
        if data:
            raise ValueError("invalid SASLInitialResponse: data after length -1")
        return raw[:end].decode("ascii", "replace"), None
    if length != len(data):
        raise ValueError(
            f"invalid SASLInitialResponse: length {length}, but {len(data)} bytes follow"
        )
    return raw[:end].decode("ascii", "replace"), data


def parse_password(body: bytes | memoryview) -> str:
    return bytes(body).split(b"\x00", 1)[0].decode("utf-8", "replace")
