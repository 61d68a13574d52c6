"""The untyped first packets: StartupMessage, SSLRequest, GSSENCRequest, CancelRequest.

A connection opens with an Int32 length and an Int32 code; the code says which packet it
is. `parse_startup_packet` turns one whole packet into a value and rejects what is not one.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

PROTOCOL_3_0 = 196608
SSL_REQUEST_CODE = 80877103
GSSENC_REQUEST_CODE = 80877104
CANCEL_REQUEST_CODE = 80877102

# Anything longer is not a startup packet (PostgreSQL's own bound is 10000).
MAX_STARTUP_PACKET = 10000


class StartupError(Exception):
    """The first packet is malformed or asks for a protocol the pooler does not speak."""


@dataclass(frozen=True)
class SSLRequest:
    pass


@dataclass(frozen=True)
class GSSENCRequest:
    pass


@dataclass(frozen=True)
class CancelRequest:
    pid: int
    secret: int


@dataclass(frozen=True)
class StartupMessage:
    major: int
    minor: int
    params: dict[str, str] = field(default_factory=dict)
    # Protocol options (names starting with "_pq_.") the client asked for; none is supported.
    protocol_options: tuple[str, ...] = ()


StartupPacket = SSLRequest | GSSENCRequest | CancelRequest | StartupMessage


def startup_packet_size(data: bytes | bytearray) -> int | None:
    """Size of the packet at the start of `data`, or None while fewer than 4 bytes arrived."""
    if len(data) < 4:
        return None
    (size,) = struct.unpack_from("!I", data, 0)
    if size < 8 or size > MAX_STARTUP_PACKET:
        raise StartupError(f"invalid startup packet length {size}")
    return int(size)


def parse_startup_packet(packet: bytes) -> StartupPacket:
    size, code = struct.unpack_from("!II", packet, 0)
    if code == SSL_REQUEST_CODE and size == 8:
        return SSLRequest()
    if code == GSSENC_REQUEST_CODE and size == 8:
        return GSSENCRequest()
    if code == CANCEL_REQUEST_CODE and size == 16:
        pid, secret = struct.unpack_from("!II", packet, 8)
        return CancelRequest(pid, secret)
    major, minor = code >> 16, code & 0xFFFF
    if major != 3:
        raise StartupError(f"unsupported frontend protocol {major}.{minor}")
    # name NUL value NUL ... then one more NUL ending the list (PostgreSQL: "expected
    # terminator as last byte").
    strings = packet[8:-1]
    if len(packet) <= 8 or not packet.endswith(b"\x00") or (
        strings and not strings.endswith(b"\x00")
    ):
        raise StartupError("invalid startup packet: missing terminator")
    parts = strings[:-1].split(b"\x00") if strings else []
    if len(parts) % 2:
        raise StartupError("invalid startup packet: odd number of strings")
    params: dict[str, str] = {}
    options: list[str] = []
    try:
        for i in range(0, len(parts), 2):
            key, value = parts[i].decode(), parts[i + 1].decode()
            if not key:
                raise StartupError("invalid startup packet: empty parameter name")
            if key.startswith("_pq_."):
                options.append(key)
            else:
                params[key] = value
    except UnicodeDecodeError as exc:
        raise StartupError("invalid startup packet: not UTF-8") from exc
    return StartupMessage(major, minor, params, tuple(options))
