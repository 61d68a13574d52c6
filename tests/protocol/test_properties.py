"""Properties of the login-phase parsers, checked with hypothesis on generated input.

- framing: any split of a stream of messages gives back the same messages; a length below 4
  or above the buffer's limit raises FramingError, never anything else;
- startup packets: what the builder makes parses back to the same parameters and options;
  arbitrary bytes raise StartupError or nothing;
- SCRAM: arbitrary client-first and client-final messages (and, the other way, arbitrary
  server messages to the pooler's own SCRAM client) raise the module's ScramAuthError or
  nothing; a SASLInitialResponse parses or raises ValueError;
- the auth_file: quoted user/secret pairs with embedded quotes survive a round trip, and
  arbitrary text never crashes the reader.

Each property runs ~200 examples without a deadline, a second or so each.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pypool.auth.auth_file import format_auth_file, parse_auth_file
from pypool.auth.scram import (
    ScramAuthError,
    ScramClientLogin,
    ScramServerExchange,
    ScramVerifier,
)
from pypool.protocol import messages as m
from pypool.protocol.framing import FramingError, MessageBuffer
from pypool.protocol.startup import (
    StartupError,
    StartupMessage,
    parse_startup_packet,
    startup_packet_size,
)

pytestmark = pytest.mark.timeout(60)

PROPERTY = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
VERIFIER = ScramVerifier.from_password("app-secret")

# --- framing --------------------------------------------------------------------------------

messages_st = st.lists(
    st.tuples(st.integers(0, 255), st.binary(max_size=300)), min_size=1, max_size=20
)


@PROPERTY
@given(messages_st, st.data())
def test_any_split_gives_back_the_same_messages(
    msgs: list[tuple[int, bytes]], data: st.DataObject
) -> None:
    stream = b"".join(m.message(kind, body) for kind, body in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    buf = MessageBuffer()
    got: list[tuple[int, bytes]] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        buf.feed(stream[start:cut])
        start = cut
        got.extend(buf.messages())
    assert got == msgs
    assert len(buf) == 0


@PROPERTY
@given(st.integers(0, 255), st.integers(0, 3), st.binary(max_size=20))
def test_length_below_four_is_a_framing_error(kind: int, length: int, rest: bytes) -> None:
    buf = MessageBuffer()
    buf.feed(bytes((kind,)) + struct.pack("!I", length) + rest)
    with pytest.raises(FramingError):
        list(buf.messages())


@PROPERTY
@given(st.integers(5, 10_000), st.integers(0, 255), st.data())
def test_length_above_the_limit_is_a_framing_error(
    limit: int, kind: int, data: st.DataObject
) -> None:
    length = data.draw(st.integers(limit, 0xFFFFFFFF))  # total size length + 1 > limit
    buf = MessageBuffer(max_size=limit)
    buf.feed(bytes((kind,)) + struct.pack("!I", length))  # the header alone is enough
    with pytest.raises(FramingError):
        list(buf.messages())


@PROPERTY
@given(st.binary(max_size=400), st.integers(5, 500))
def test_arbitrary_bytes_frame_or_raise_framing_error(data: bytes, limit: int) -> None:
    buf = MessageBuffer(max_size=limit)
    buf.feed(data)
    try:
        for _kind, body in buf.messages():
            assert len(body) <= limit - 5
    except FramingError:
        pass


# --- startup packets ------------------------------------------------------------------------

# Names and values are C strings: anything but NUL, names not empty.
# (No lone surrogates: they cannot be sent as UTF-8 at all.)
c_chars = st.characters(exclude_characters="\x00", exclude_categories=("Cs",))
names = st.text(c_chars, min_size=1, max_size=20)
values = st.text(c_chars, max_size=40)


@PROPERTY
@given(st.dictionaries(names, values, max_size=8), st.integers(0, 0xFFFF))
def test_startup_message_round_trip(params: dict[str, str], minor: int) -> None:
    body = b"".join(m.cstring(k) + m.cstring(v) for k, v in params.items()) + b"\x00"
    packet = struct.pack("!II", len(body) + 8, (3 << 16) | minor) + body
    if len(packet) > 10000:
        with pytest.raises(StartupError):
            startup_packet_size(packet)
        return
    assert startup_packet_size(packet) == len(packet)
    expected = StartupMessage(
        3, minor,
        {k: v for k, v in params.items() if not k.startswith("_pq_.")},
        tuple(k for k in params if k.startswith("_pq_.")),
    )
    assert parse_startup_packet(packet) == expected


@PROPERTY
@given(st.dictionaries(names, values, max_size=8))
def test_the_builder_for_servers_round_trips(params: dict[str, str]) -> None:
    packet = m.startup_message(params)
    if len(packet) <= 10000:
        assert startup_packet_size(packet) == len(packet)
        parsed = parse_startup_packet(packet)
        assert isinstance(parsed, StartupMessage)
        assert {**parsed.params, **dict.fromkeys(parsed.protocol_options, "")}.keys() == \
            params.keys()


@PROPERTY
@given(st.binary(max_size=64))
def test_arbitrary_first_bytes_raise_only_startup_error(data: bytes) -> None:
    try:
        startup_packet_size(data)
    except StartupError:
        pass
    try:
        parse_startup_packet(data)
    except StartupError:
        pass


@PROPERTY
@given(st.integers(0, 0xFFFFFFFF), st.binary(max_size=64))
def test_arbitrary_packet_bodies_raise_only_startup_error(code: int, body: bytes) -> None:
    try:
        parse_startup_packet(struct.pack("!II", len(body) + 8, code) + body)
    except StartupError:
        pass


# --- SCRAM ----------------------------------------------------------------------------------

# Text shaped like SCRAM messages (letters, '=', ',', base64) finds more than random bytes.
scram_text = st.text(st.sampled_from("anmryc=,pvise01+/AZ\x00\x7f\u00e9"), max_size=60)
scram_bytes = st.one_of(st.binary(max_size=80), scram_text.map(str.encode))


@PROPERTY
@given(scram_bytes)
def test_arbitrary_client_first_raises_only_scram_auth_error(first: bytes) -> None:
    try:
        ScramServerExchange(VERIFIER).client_first(first)
    except ScramAuthError:
        pass


@PROPERTY
@given(scram_bytes, st.booleans())
def test_arbitrary_client_final_raises_only_scram_auth_error(final: bytes, known: bool) -> None:
    server = ScramServerExchange(VERIFIER if known else None, "app")
    server.client_first(b"n,,n=,r=abcdef")
    try:
        server.client_final(final)
    except ScramAuthError:
        assert server.client_key is None


@PROPERTY
@given(st.text(max_size=40), st.text(max_size=60))
def test_client_final_with_the_right_nonce_and_any_proof_fails(extra: str, proof: str) -> None:
    server = ScramServerExchange(VERIFIER)
    nonce = server.client_first(b"n,,n=,r=abcdef").decode().split(",")[0][2:]
    final = f"c=biws,r={nonce}{extra},p={proof}".encode()
    with pytest.raises(ScramAuthError):
        server.client_final(final)


@PROPERTY
@given(scram_bytes, scram_bytes, st.booleans())
def test_arbitrary_server_messages_raise_only_scram_auth_error(
    first: bytes, final: bytes, with_password: bool
) -> None:
    # The pooler's own SCRAM client reads what a server sends; net/server.py catches
    # ScramAuthError and ValueError, so nothing else may come out.
    if with_password:
        login = ScramClientLogin("app", password="app-secret")
    else:
        login = ScramClientLogin("app", client_key=bytes(32), server_key=bytes(32))
    login.client_first()
    try:
        login.server_first(first)
        login.server_final(final)
    except ScramAuthError:
        pass


@PROPERTY
@given(st.binary(max_size=80))
def test_arbitrary_sasl_initial_response_parses_or_raises_value_error(body: bytes) -> None:
    try:
        _mechanism, data = m.parse_sasl_initial_response(body)
    except ValueError:
        return
    # What parses is a mechanism, its NUL, and a length that accounts for the rest exactly.
    end = body.index(b"\x00")
    (length,) = struct.unpack_from("!i", body, end + 1)
    assert (length, data) == (-1, None) or (length == len(body) - end - 5 and data is not None
                                            and body.endswith(data))


# --- the auth_file --------------------------------------------------------------------------

# A line break inside a name or secret cannot be written to the file at all.
line_text = st.text(
    st.characters(exclude_categories=("Cc", "Cs", "Zl", "Zp"), exclude_characters="\x85"),
    max_size=30,
)


@PROPERTY
@given(st.dictionaries(line_text, line_text.map(lambda s: s + '"' if s else s), max_size=6))
def test_auth_file_round_trip_with_quotes(users: dict[str, str]) -> None:
    assert parse_auth_file(format_auth_file(users)) == users


@PROPERTY
@given(st.text(max_size=300))
def test_arbitrary_auth_file_text_never_crashes(text: str) -> None:
    users = parse_auth_file(text)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in users.items())


@PROPERTY
@given(st.lists(st.text(st.sampled_from('"ab \t\n#\\'), max_size=12), max_size=10))
def test_quote_heavy_auth_file_text_never_crashes(lines: list[str]) -> None:
    parse_auth_file("\n".join(lines))
