"""parse_proxy_header: HAProxy's PROXY protocol, v1 and v2, fed whole, in pieces and broken."""

from __future__ import annotations

import struct

import pytest

from pypool.protocol.proxy_header import (
    NEED_MORE,
    V1_MAX_LENGTH,
    V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
    looks_like_proxy_header,
    parse_proxy_header,
    proxy_v1,
    proxy_v2,
)

pytestmark = pytest.mark.timeout(10)

STARTUP = struct.pack("!II", 8, 80877103)  # an SSLRequest: what a client sends next


# --- v1 ------------------------------------------------------------------------------------


def test_v1_tcp4() -> None:
    header = b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 6432\r\n"
    assert parse_proxy_header(header + STARTUP) == ProxyHeader(1, ("192.0.2.7", 56324),
                                                               len(header))


def test_v1_tcp6_is_written_as_ipaddress_writes_it() -> None:
    header = b"PROXY TCP6 2001:DB8:0:0::7 2001:db8::1 1 65535\r\n"
    parsed = parse_proxy_header(header)
    assert parsed == ProxyHeader(1, ("2001:db8::7", 1), len(header))


def test_v1_unknown_names_nobody_and_its_rest_is_ignored() -> None:
    assert parse_proxy_header(b"PROXY UNKNOWN\r\n") == ProxyHeader(1, None, 15)
    line = b"PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n"
    assert parse_proxy_header(line) == ProxyHeader(1, None, len(line))


def test_v1_the_longest_header_fits() -> None:
    six = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
    header = f"PROXY TCP6 {six} {six} 65535 65535\r\n".encode()
    assert parse_proxy_header(header) == ProxyHeader(1, (six, 65535), len(header))
    # The specification's worst case: UNKNOWN with the longest text after it.
    unknown = b"PROXY UNKNOWN " + b"x" * (V1_MAX_LENGTH - 16) + b"\r\n"
    assert len(unknown) == V1_MAX_LENGTH
    assert parse_proxy_header(unknown) == ProxyHeader(1, None, V1_MAX_LENGTH)


def test_v1_byte_by_byte_needs_more_until_the_crlf() -> None:
    header = proxy_v1(("10.1.2.3", 5555), ("10.0.0.1", 6432))
    for end in range(len(header)):
        assert parse_proxy_header(header[:end]) is NEED_MORE, header[:end]
    assert parse_proxy_header(header) == ProxyHeader(1, ("10.1.2.3", 5555), len(header))


def test_v1_oversize_without_crlf_is_refused_at_107_bytes() -> None:
    long = b"PROXY TCP4 " + b"1" * 200
    assert parse_proxy_header(long[:V1_MAX_LENGTH - 1]) is NEED_MORE
    with pytest.raises(ProxyHeaderError, match="longer than 107"):
        parse_proxy_header(long[:V1_MAX_LENGTH])
    with pytest.raises(ProxyHeaderError, match="longer than 107"):
        parse_proxy_header(long)


@pytest.mark.parametrize("line", [
    b"PROXY TCP4 192.0.2.7 198.51.100.1 56324\r\n",  # a port missing
    b"PROXY TCP4 192.0.2.7  198.51.100.1 56324 6432\r\n",  # two spaces
    b"PROXY TCP4 2001:db8::7 198.51.100.1 56324 6432\r\n",  # IPv6 as TCP4
    b"PROXY TCP6 192.0.2.7 2001:db8::1 56324 6432\r\n",  # IPv4 as TCP6
    b"PROXY TCP4 192.0.2.300 198.51.100.1 56324 6432\r\n",
    b"PROXY TCP4 192.0.2.7 198.51.100.1 65536 6432\r\n",
    b"PROXY TCP4 192.0.2.7 198.51.100.1 -1 6432\r\n",
    b"PROXY TCP4 192.0.2.7 198.51.100.1 0080 6432\r\n",
    b"PROXY UDP4 192.0.2.7 198.51.100.1 56324 6432\r\n",
    b"PROXY tcp4 192.0.2.7 198.51.100.1 56324 6432\r\n",
    b"PROXY TCP4 192.0.2.\xff 198.51.100.1 56324 6432\r\n",
    b"PROXY \r\n",
])
def test_v1_garbage_is_refused(line: bytes) -> None:
    with pytest.raises(ProxyHeaderError):
        parse_proxy_header(line)


# --- v2 ------------------------------------------------------------------------------------


def test_v2_tcp4() -> None:
    header = proxy_v2(("192.0.2.7", 56324), ("198.51.100.1", 6432))
    assert len(header) == 16 + 12
    assert parse_proxy_header(header + STARTUP) == ProxyHeader(2, ("192.0.2.7", 56324), 28)


def test_v2_tcp6() -> None:
    header = proxy_v2(("2001:db8::7", 443), ("2001:db8::1", 6432))
    assert len(header) == 16 + 36
    assert parse_proxy_header(header) == ProxyHeader(2, ("2001:db8::7", 443), 52)


def test_v2_local_names_nobody() -> None:
    # HAProxy's health checks: LOCAL, family UNSPEC, no addresses.
    header = proxy_v2(None)
    assert parse_proxy_header(header + STARTUP) == ProxyHeader(2, None, 16)


def test_v2_local_with_addresses_ignores_them() -> None:
    proxied = proxy_v2(("192.0.2.7", 1), ("198.51.100.1", 2))
    local = proxied[:12] + bytes([0x20]) + proxied[13:]
    assert parse_proxy_header(local) == ProxyHeader(2, None, len(local))


def test_v2_tlvs_are_skipped() -> None:
    tlvs = b"\x02\x00\x05pypol" + b"\x05\x00\x10" + b"u" * 16  # AUTHORITY, UNIQUE_ID
    header = proxy_v2(("192.0.2.7", 56324), ("198.51.100.1", 6432), tlvs)
    parsed = parse_proxy_header(header + STARTUP)
    assert parsed == ProxyHeader(2, ("192.0.2.7", 56324), len(header))


def test_v2_unspec_and_unix_families_name_nobody() -> None:
    unspec = V2_SIGNATURE + bytes([0x21, 0x00]) + struct.pack("!H", 0)
    assert parse_proxy_header(unspec) == ProxyHeader(2, None, 16)
    unix = (V2_SIGNATURE + bytes([0x21, 0x31]) + struct.pack("!H", 216)
            + b"/run/client.sock".ljust(108, b"\0") + b"/run/pypool.sock".ljust(108, b"\0"))
    assert parse_proxy_header(unix) == ProxyHeader(2, None, 16 + 216)


def test_v2_byte_by_byte_needs_more_until_whole() -> None:
    header = proxy_v2(("2001:db8::7", 443), ("2001:db8::1", 6432), b"\x04\x00\x01x")
    for end in range(len(header)):
        assert parse_proxy_header(header[:end]) is NEED_MORE, end
    assert parse_proxy_header(header) == ProxyHeader(2, ("2001:db8::7", 443), len(header))


def test_v2_reads_no_further_than_its_length() -> None:
    header = proxy_v2(("192.0.2.7", 56324), ("198.51.100.1", 6432))
    data = bytearray(header + b"\x00" * 100)
    parsed = parse_proxy_header(data)
    assert isinstance(parsed, ProxyHeader) and parsed.size == len(header)


@pytest.mark.parametrize(("byte13", "byte14", "length", "match"), [
    (0x11, 0x11, 12, "version 1"),  # version 1 in the binary form
    (0x31, 0x11, 12, "version 3"),
    (0x22, 0x11, 12, "unknown command 2"),
    (0x21, 0x12, 12, "family/transport 0x12"),  # DGRAM on a TCP listener
    (0x21, 0x41, 12, "family/transport 0x41"),
    (0x21, 0x11, 8, "address block of 8 bytes, 12 needed"),
    (0x21, 0x21, 12, "address block of 12 bytes, 36 needed"),
])
def test_v2_garbage_is_refused(byte13: int, byte14: int, length: int, match: str) -> None:
    header = V2_SIGNATURE + bytes([byte13, byte14]) + struct.pack("!H", length)
    with pytest.raises(ProxyHeaderError, match=match):
        parse_proxy_header(header + b"\x00" * length)


# --- what opens a connection -----------------------------------------------------------------


def test_no_header_is_refused_at_the_first_differing_byte() -> None:
    for first in (STARTUP, b"\x16\x03\x01", b"GET / HTTP/1.1\r\n", b"PROXX"):
        with pytest.raises(ProxyHeaderError, match="no PROXY protocol header"):
            parse_proxy_header(first)


def test_looks_like_proxy_header() -> None:
    assert looks_like_proxy_header(b"") is None
    assert looks_like_proxy_header(b"PRO") is None
    assert looks_like_proxy_header(b"\r\n\r\n") is None
    assert looks_like_proxy_header(b"PROXY ") is True
    assert looks_like_proxy_header(V2_SIGNATURE) is True
    assert looks_like_proxy_header(STARTUP[:1]) is False  # a startup packet's length
    assert looks_like_proxy_header(b"\x16") is False  # a TLS ClientHello
    assert looks_like_proxy_header(b"PROXY_") is False
