"""The untyped first packets: StartupMessage, SSLRequest, GSSENCRequest, CancelRequest.

A connection opens with an Int32 length and an Int32 code; the code says which packet it
is. `parse_startup_packet` turns one whole packet into a value and rejects what is not one.
Also here: how much a client that has not authenticated yet may send in one message.
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
# Until it has authenticated, a client sends passwords and SASL steps only; PostgreSQL reads
# those with a limit of PG_MAX_AUTH_TOKEN_LENGTH, 65535 bytes of body, and so does the
# pooler, so that an unauthenticated peer cannot make it buffer a 2 GiB "password".
MAX_AUTH_MESSAGE = 65535


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


# Frontend message types (a type byte, then an Int32 length): sent before the startup packet,
# they are a client out of step, told apart from garbage for a clearer error.
_FRONTEND_TYPES = frozenset(b"BCcdDEfFHPpQSX")
# No PostgreSQL message is 1 GiB or more (MaxAllocSize): such a "length" is garbage.
_MAX_MESSAGE_LENGTH = 0x3FFFFFFF


def startup_packet_size(data: bytes | bytearray) -> int | None:
    """Size of the packet at the start of `data`, or None while too few bytes arrived to say.

    A startup packet opens with its Int32 length, at most MAX_STARTUP_PACKET, so its first
    two bytes are zero. A regular message opens with a type byte: one of the frontend types
    followed by a plausible Int32 length is a message sent before the startup packet
    (PgBouncer: "client password pkt before startup packet" for a PasswordMessage);
    anything else is "bad packet header", with the first bytes in hex, as PgBouncer says.
    """
    if len(data) < 4:
        return None
    if data[0] in _FRONTEND_TYPES:
        if len(data) < 5:
            return None  # the length of a typed message ends one byte later
        (length,) = struct.unpack_from("!I", data, 1)
        if 4 <= length <= _MAX_MESSAGE_LENGTH:
            if data[0] == ord("p"):
                raise StartupError("client password pkt before startup packet")
            raise StartupError(f"unexpected message type '{chr(data[0])}' before startup packet")
    (size,) = struct.unpack_from("!I", data, 0)
    if size < 8 or size > MAX_STARTUP_PACKET:
        raise StartupError(f"bad packet header: '{bytes(data[:8]).hex()}'")
    return int(size)


def parse_startup_packet(packet: bytes) -> StartupPacket:
    """The packet `packet` (one whole one, its length first) is; StartupError if none."""
    if len(packet) < 8:
        raise StartupError(f"bad packet header: '{packet.hex()}'")
    size, code = struct.unpack_from("!II", packet, 0)
    if size != len(packet):
        raise StartupError(f"invalid startup packet: length {size}, but {len(packet)} bytes")
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
