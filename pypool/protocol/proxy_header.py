"""The PROXY protocol header (HAProxy's, versions 1 and 2): who the balancer's client was.

A load balancer in front of the pooler (HAProxy `send-proxy` / `send-proxy-v2`, AWS NLB,
...) opens each TCP connection with one header that names the client it relays, before any
byte of the client's own. HAProxy's specification ("The PROXY protocol", proxy-protocol.txt)
defines two forms:

- v1, one text line of at most 107 bytes with its CRLF:
  `PROXY TCP4 <src> <dst> <sport> <dport>\\r\\n` (TCP6 alike), or `PROXY UNKNOWN ...\\r\\n`,
  which names nobody;
- v2, binary: a 12-byte signature, a version/command byte (v2, LOCAL or PROXY), a
  family/transport byte, a 16-bit length, then the addresses and optional TLVs, skipped here.
  LOCAL is the balancer speaking for itself (its health checks): it names nobody either.

`parse_proxy_header(data)` reads one header from the start of what the connection has
received: `NEED_MORE` until the header is whole, else a `ProxyHeader` (its `source`, the
client's address and port, or None when the header names nobody; and its `size`, where the
client's own bytes start), or `ProxyHeaderError` for bytes that are not a valid header.
It waits for at most 107 bytes (v1) or 16 + 65535 (v2, its length field's bound), so a
hostile peer cannot make it hold more; how long it may wait is the login timeout's to say.
`looks_like_proxy_header` tells, from as few bytes as possible, whether a connection opens
with a header at all (None: too few bytes to say).

Never here: sockets, the event loop, which peers are trusted (net/client_login.py decides,
from proxy_protocol_sources), logging.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import Final

V1_PREFIX: Final = b"PROXY "
V1_MAX_LENGTH: Final = 107  # "PROXY TCP6 " + two longest IPv6 + two ports + CRLF
V2_SIGNATURE: Final = b"\r\n\r\n\x00\r\nQUIT\n"
V2_HEADER_SIZE: Final = 16  # signature, version/command, family/transport, length

# v2's 13th byte: the version in the high nibble, the command in the low one.
V2_VERSION: Final = 0x20
V2_LOCAL: Final = 0x0
V2_PROXY: Final = 0x1
# v2's 14th byte: the address family in the high nibble, the transport in the low one.
V2_AF_UNSPEC: Final = 0x0
V2_AF_INET: Final = 0x1
V2_AF_INET6: Final = 0x2
V2_AF_UNIX: Final = 0x3
V2_UNSPEC: Final = 0x0
V2_STREAM: Final = 0x1
# The address block of each family: source and destination addresses, then ports (none for
# AF_UNIX: two 108-byte paths).
_V2_ADDRESS_SIZE: Final = {V2_AF_UNSPEC: 0, V2_AF_INET: 12, V2_AF_INET6: 36, V2_AF_UNIX: 216}


class ProxyHeaderError(ValueError):
    """The bytes are not a valid PROXY protocol header; the message says what is wrong."""


@dataclass(frozen=True)
class ProxyHeader:
    """One header, read whole.

    `source`: the balancer's client, (address, port), the address as Python's ipaddress
    writes it; None when the header names nobody (v1 UNKNOWN, v2 LOCAL, an unspecified or
    AF_UNIX family): the connection keeps its own peer address. `size`: the header's length
    in bytes; the client's own bytes start after it."""

    version: int
    source: tuple[str, int] | None
    size: int


class _NeedMore:
    """The header is not whole yet."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_MORE"


NEED_MORE: Final = _NeedMore()


def looks_like_proxy_header(data: bytes | bytearray) -> bool | None:
    """Whether `data`, the first bytes of a connection, opens with a PROXY header's
    signature (v1 or v2); None while every byte so far fits one and more are needed. No
    startup packet or TLS record starts like either: their first byte differs."""
    for signature in (V1_PREFIX, V2_SIGNATURE):
        if data[: len(signature)] == signature[: len(data)]:
            return True if len(data) >= len(signature) else None
    return False


def parse_proxy_header(data: bytes | bytearray) -> ProxyHeader | _NeedMore:
    """The header at the start of `data` (see the module), NEED_MORE, or ProxyHeaderError."""
    opens = looks_like_proxy_header(data)
    if opens is None:
        return NEED_MORE
    if not opens:
        raise ProxyHeaderError(f"no PROXY protocol header: {bytes(data[:16]).hex()}")
    if data[:1] == b"P":
        return _parse_v1(data)
    return _parse_v2(data)


def _parse_v1(data: bytes | bytearray) -> ProxyHeader | _NeedMore:
    end = data.find(b"\r\n", 0, V1_MAX_LENGTH)
    if end < 0:
        if len(data) >= V1_MAX_LENGTH:
            raise ProxyHeaderError(f"PROXY v1 header longer than {V1_MAX_LENGTH} bytes")
        return NEED_MORE
    size = end + 2
    try:
        line = bytes(data[len(V1_PREFIX):end]).decode("ascii")
    except UnicodeDecodeError:
        raise ProxyHeaderError("PROXY v1 header is not ASCII") from None
    words = line.split(" ")
    if words[0] == "UNKNOWN":
        return ProxyHeader(1, None, size)  # whatever follows is to be ignored
    if words[0] not in ("TCP4", "TCP6") or len(words) != 5:
        raise ProxyHeaderError(f"bad PROXY v1 header: {line[:V1_MAX_LENGTH]!r}")
    kind = ipaddress.IPv4Address if words[0] == "TCP4" else ipaddress.IPv6Address
    try:
        source = kind(words[1])
        kind(words[2])
    except ValueError:
        raise ProxyHeaderError(f"bad address in PROXY v1 header: {line!r}") from None
    return ProxyHeader(1, (str(source), _v1_port(words[3], line)), size)


def _v1_port(text: str, line: str) -> int:
    # Decimal, 0..65535; no sign, no spaces, no leading zero (the specification's form).
    if (not text.isascii() or not text.isdigit() or len(text) > 5
            or (len(text) > 1 and text[0] == "0") or int(text) > 65535):
        raise ProxyHeaderError(f"bad port in PROXY v1 header: {line!r}")
    return int(text)


def _parse_v2(data: bytes | bytearray) -> ProxyHeader | _NeedMore:
    if len(data) < V2_HEADER_SIZE:
        return NEED_MORE
    version_command, family_transport, length = struct.unpack_from("!BBH", data, 12)
    if version_command & 0xF0 != V2_VERSION:
        raise ProxyHeaderError(f"PROXY v2 header of version {version_command >> 4}")
    command = version_command & 0x0F
    if command not in (V2_LOCAL, V2_PROXY):
        raise ProxyHeaderError(f"PROXY v2 header with unknown command {command}")
    size = V2_HEADER_SIZE + length
    if len(data) < size:
        return NEED_MORE
    if command == V2_LOCAL:
        return ProxyHeader(2, None, size)  # the balancer's own connection: addresses ignored
    family, transport = family_transport >> 4, family_transport & 0x0F
    address_size = _V2_ADDRESS_SIZE.get(family)
    if address_size is None or transport not in (V2_UNSPEC, V2_STREAM):
        raise ProxyHeaderError(
            f"PROXY v2 header with unsupported family/transport 0x{family_transport:02x}")
    if length < address_size:
        raise ProxyHeaderError(f"PROXY v2 address block of {length} bytes, "
                               f"{address_size} needed")
    if family == V2_AF_INET and transport == V2_STREAM:
        source: tuple[str, int] | None = (
            str(ipaddress.IPv4Address(bytes(data[16:20]))),
            int.from_bytes(data[24:26], "big"))
    elif family == V2_AF_INET6 and transport == V2_STREAM:
        source = (str(ipaddress.IPv6Address(bytes(data[16:32]))),
                  int.from_bytes(data[48:50], "big"))
    else:
        source = None  # AF_UNSPEC, AF_UNIX: no IP address to take; TLVs: skipped
    return ProxyHeader(2, source, size)


# --- building headers: what a balancer sends (the tests' and any in-process sender's) -------


def proxy_v1(source: tuple[str, int], destination: tuple[str, int]) -> bytes:
    """A v1 header (TCP4 or TCP6, by the source address's version)."""
    kind = "TCP4" if ipaddress.ip_address(source[0]).version == 4 else "TCP6"
    return (f"PROXY {kind} {source[0]} {destination[0]} {source[1]} {destination[1]}\r\n"
            .encode("ascii"))


def proxy_v2(source: tuple[str, int] | None, destination: tuple[str, int] | None = None,
             tlvs: bytes = b"") -> bytes:
    """A v2 header: PROXY from `source` to `destination` (same family), or LOCAL when
    `source` is None. `tlvs`: raw TLV bytes appended to the address block."""
    if source is None:
        return V2_SIGNATURE + struct.pack("!BBH", V2_VERSION | V2_LOCAL, 0, len(tlvs)) + tlvs
    src = ipaddress.ip_address(source[0])
    dst = ipaddress.ip_address(destination[0] if destination else source[0])
    family = V2_AF_INET if src.version == 4 else V2_AF_INET6
    ports = struct.pack("!HH", source[1], destination[1] if destination else 0)
    block = src.packed + dst.packed + ports + tlvs
    return (V2_SIGNATURE + struct.pack("!BBH", V2_VERSION | V2_PROXY,
                                       family << 4 | V2_STREAM, len(block)) + block)
