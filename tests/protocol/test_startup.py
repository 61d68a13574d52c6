"""parse_startup_packet and startup_packet_size: the untyped first packets."""

from __future__ import annotations

import struct

import pytest

from pypool.protocol import messages as m
from pypool.protocol.startup import (
    CANCEL_REQUEST_CODE,
    GSSENC_REQUEST_CODE,
    MAX_STARTUP_PACKET,
    PROTOCOL_3_0,
    SSL_REQUEST_CODE,
    CancelRequest,
    GSSENCRequest,
    SSLRequest,
    StartupError,
    StartupMessage,
    parse_startup_packet,
    startup_packet_size,
)

pytestmark = pytest.mark.timeout(10)


def packet(code: int, body: bytes = b"") -> bytes:
    return struct.pack("!II", len(body) + 8, code) + body


def startup(body: bytes, major: int = 3, minor: int = 0) -> bytes:
    return packet((major << 16) | minor, body)


def test_plain_startup_message() -> None:
    data = m.startup_message({"user": "app", "database": "app", "application_name": "t"})
    assert startup_packet_size(data) == len(data)
    parsed = parse_startup_packet(data)
    assert parsed == StartupMessage(
        3, 0, {"user": "app", "database": "app", "application_name": "t"}, ()
    )


def test_startup_without_parameters() -> None:
    parsed = parse_startup_packet(startup(b"\x00"))
    assert isinstance(parsed, StartupMessage)
    assert parsed.params == {}


def test_empty_value_is_kept() -> None:
    parsed = parse_startup_packet(startup(b"user\x00app\x00options\x00\x00\x00"))
    assert isinstance(parsed, StartupMessage)
    assert parsed.params == {"user": "app", "options": ""}


def test_utf8_values() -> None:
    parsed = parse_startup_packet(startup("user\x00j\u00fcrgen\x00\x00".encode()))
    assert isinstance(parsed, StartupMessage)
    assert parsed.params["user"] == "j\u00fcrgen"


def test_ssl_request() -> None:
    data = packet(SSL_REQUEST_CODE)
    assert startup_packet_size(data) == 8
    assert parse_startup_packet(data) == SSLRequest()


def test_gssenc_request() -> None:
    assert parse_startup_packet(packet(GSSENC_REQUEST_CODE)) == GSSENCRequest()


def test_cancel_request() -> None:
    data = m.cancel_request(1234, 0xDEADBEEF)
    assert len(data) == 16
    assert startup_packet_size(data) == 16
    assert parse_startup_packet(data) == CancelRequest(1234, 0xDEADBEEF)


@pytest.mark.parametrize("code", [SSL_REQUEST_CODE, GSSENC_REQUEST_CODE, CANCEL_REQUEST_CODE])
def test_special_codes_with_wrong_length_are_rejected(code: int) -> None:
    # An SSLRequest with a body, a CancelRequest without its key: major 1234 is no protocol.
    with pytest.raises(StartupError):
        parse_startup_packet(packet(code, b"\x00" * 4))


def test_minor_version_above_zero_is_accepted_and_reported() -> None:
    parsed = parse_startup_packet(startup(b"user\x00app\x00\x00", minor=2))
    assert isinstance(parsed, StartupMessage)
    assert (parsed.major, parsed.minor) == (3, 2)
    assert parsed.params == {"user": "app"}


def test_protocol_options_are_split_out() -> None:
    body = b"user\x00app\x00_pq_.compression\x00on\x00_pq_.other\x00x\x00\x00"
    parsed = parse_startup_packet(startup(body))
    assert isinstance(parsed, StartupMessage)
    assert parsed.params == {"user": "app"}
    assert parsed.protocol_options == ("_pq_.compression", "_pq_.other")


@pytest.mark.parametrize("major", [1, 2, 4, 1234])
def test_other_major_versions_are_rejected(major: int) -> None:
    with pytest.raises(StartupError, match="unsupported frontend protocol"):
        parse_startup_packet(startup(b"user\x00app\x00\x00", major=major))


def test_missing_terminator() -> None:
    with pytest.raises(StartupError):
        parse_startup_packet(startup(b"user\x00app"))


def test_missing_final_empty_string() -> None:
    # Each string is terminated but the list-ending NUL is missing (PostgreSQL: "expected
    # terminator as last byte").
    with pytest.raises(StartupError):
        parse_startup_packet(startup(b"user\x00app\x00"))


@pytest.mark.parametrize(
    "body",
    [
        b"user\x00\x00",  # a name without a value
        b"user\x00app\x00database\x00\x00",  # three strings, then the terminator
        b"user\x00app\x00database\x00",  # three strings, no terminator
    ],
)
def test_odd_number_of_strings(body: bytes) -> None:
    with pytest.raises(StartupError):
        parse_startup_packet(startup(body))


def test_empty_parameter_name_in_the_middle() -> None:
    with pytest.raises(StartupError):
        parse_startup_packet(startup(b"user\x00app\x00\x00x\x00y\x00\x00"))


def test_invalid_utf8() -> None:
    with pytest.raises(StartupError):
        parse_startup_packet(startup(b"user\x00\xff\xfe\x00\x00"))


def test_size_waits_for_four_bytes() -> None:
    assert startup_packet_size(b"") is None
    assert startup_packet_size(b"\x00\x00\x00") is None
    assert startup_packet_size(bytearray(b"\x00\x00\x00\x08")) == 8


@pytest.mark.parametrize("size", [0, 4, 7, MAX_STARTUP_PACKET + 1, 0x7FFFFFFF, 0xFFFFFFFF])
def test_invalid_sizes(size: int) -> None:
    # PgBouncer's words, with the header in hex as it prints it.
    header = struct.pack("!I", size)
    with pytest.raises(StartupError, match=f"^bad packet header: '{header.hex()}'$"):
        startup_packet_size(header)


def test_http_request_is_not_a_startup_packet() -> None:
    # "GET " as a length is ~1.2 GB, and G is no frontend message: rejected at once.
    with pytest.raises(StartupError, match="^bad packet header: '474554202f204854'$"):
        startup_packet_size(b"GET / HTTP/1.1\r\n")
    with pytest.raises(StartupError, match="^bad packet header"):
        startup_packet_size(b"POST / HTTP/1.1\r\n")  # P is Parse, but no Parse is 1.3 GB


def test_password_message_before_startup() -> None:
    with pytest.raises(StartupError, match="^client password pkt before startup packet$"):
        startup_packet_size(m.password_message(m.cstring("secret")))


@pytest.mark.parametrize("message", [m.query("SELECT 1"), m.sync(), m.terminate()])
def test_typed_message_before_startup(message: bytes) -> None:
    with pytest.raises(StartupError, match=f"^unexpected message type '{chr(message[0])}' "
                                           "before startup packet$"):
        startup_packet_size(message)


def test_a_typed_message_is_told_from_its_fifth_byte() -> None:
    # 'Q' then three bytes could still be a Query header; wait for the length to end.
    assert startup_packet_size(b"Q\x00\x00\x00") is None
    with pytest.raises(StartupError, match="before startup packet"):
        startup_packet_size(b"Q\x00\x00\x00\x0d")


def test_largest_allowed_size() -> None:
    assert startup_packet_size(struct.pack("!I", MAX_STARTUP_PACKET)) == MAX_STARTUP_PACKET


def test_protocol_constant() -> None:
    assert PROTOCOL_3_0 == 3 << 16
    assert m.startup_message({})[4:8] == struct.pack("!I", PROTOCOL_3_0)


def test_startup_with_no_body_at_all() -> None:
    with pytest.raises(StartupError):
        parse_startup_packet(startup(b""))
