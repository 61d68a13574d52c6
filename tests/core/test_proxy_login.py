"""The PROXY header before the startup packet (core/client_login.read_proxy_header), and
which peers are trusted to send one (trusted_proxy), fed bytes as a balancer sends them."""

from __future__ import annotations

import struct

import pytest

from pypool.core import client_login as cl
from pypool.core.exchange import advance
from pypool.protocol import errors
from pypool.protocol.proxy_header import ProxyHeader, proxy_v1, proxy_v2

pytestmark = pytest.mark.timeout(10)

SSL_REQUEST = struct.pack("!II", 8, 80877103)
CANCEL_REQUEST = struct.pack("!IIII", 16, 80877102, 1234, 5678)


def run(trusted: bool, *chunks: bytes) -> cl.Proxied | None:
    """Feed `chunks` one by one; the result, or None while it waits. Nothing is written."""
    step = cl.read_proxy_header(trusted)
    assert next(step) == b""
    written: list[bytes] = []
    result = None
    for chunk in chunks:
        assert result is None, "fed after the end"
        result = advance(step, chunk, written.append)
    assert not written
    return result


def test_a_trusted_peer_header_then_the_startup_packet() -> None:
    header = proxy_v2(("192.0.2.7", 56324), ("198.51.100.1", 6432))
    assert run(True, header + SSL_REQUEST) == cl.Proxied(
        ProxyHeader(2, ("192.0.2.7", 56324), len(header)), SSL_REQUEST)


def test_a_header_in_pieces() -> None:
    header = proxy_v1(("2001:db8::7", 443), ("2001:db8::1", 6432))
    pieces = [header[i:i + 1] for i in range(len(header))] + [CANCEL_REQUEST]
    assert run(True, *pieces[:-1]) == cl.Proxied(
        ProxyHeader(1, ("2001:db8::7", 443), len(header)), b"")
    assert run(True, *pieces[:-2]) is None


def test_a_trusted_peer_without_a_header_is_refused() -> None:
    with pytest.raises(errors.ClientProtocolError, match="no PROXY protocol header from a "
                       "proxy_protocol_sources address"):
        run(True, SSL_REQUEST)


def test_a_broken_header_is_a_protocol_violation() -> None:
    with pytest.raises(errors.ClientProtocolError, match="bad port") as raised:
        run(True, b"PROXY TCP4 192.0.2.7 198.51.100.1 99999 6432\r\n")
    assert raised.value.sqlstate == errors.PROTOCOL_VIOLATION


def test_an_untrusted_peer_header_is_refused() -> None:
    for header in (proxy_v1(("192.0.2.7", 1), ("192.0.2.8", 2)), proxy_v2(None)):
        with pytest.raises(errors.ClientProtocolError, match="not in proxy_protocol_sources"):
            run(False, header[:3], header[3:])


def test_an_untrusted_peer_without_a_header_passes_every_byte_on() -> None:
    assert run(False, SSL_REQUEST) == cl.Proxied(None, SSL_REQUEST)
    assert run(False, b"\x16\x03\x01") == cl.Proxied(None, b"\x16\x03\x01")  # direct TLS
    assert run(False, b"PRO", b"XX") == cl.Proxied(None, b"PROXX")
    assert run(False, b"PRO") is None


@pytest.mark.parametrize(("address", "trusted"), [
    ("10.1.2.3", True), ("127.0.0.1", True), ("127.0.0.2", False), ("192.0.2.7", False),
    ("::ffff:10.9.9.9", True), ("2001:db8::5", True), ("2001:db9::5", False),
    ("not an address", False),
])
def test_trusted_proxy(address: str, trusted: bool) -> None:
    sources = ("10.0.0.0/8", "127.0.0.1", "2001:db8::/32")
    assert cl.trusted_proxy(address, sources) is trusted
