"""Message builders and parsers: what the pooler writes must frame, what it reads must parse."""

from __future__ import annotations

import struct

import pytest

from pypool.protocol import messages as m
from pypool.protocol.framing import MessageBuffer

pytestmark = pytest.mark.timeout(10)


def one(data: bytes) -> tuple[int, bytes]:
    """The single message in `data`; fails if there is more or less."""
    buf = MessageBuffer()
    buf.feed(data)
    msgs = list(buf.messages())
    assert len(msgs) == 1 and len(buf) == 0, msgs
    return msgs[0]


def test_message_framing() -> None:
    assert m.message(m.SYNC) == b"S\x00\x00\x00\x04"
    assert m.message(m.QUERY, b"x\x00") == b"Q\x00\x00\x00\x06x\x00"


def test_error_response_round_trip() -> None:
    kind, body = one(m.error_response("no such database: nope", "08P01", "FATAL"))
    assert kind == m.ERROR_RESPONSE
    fields = m.parse_error_fields(body)
    assert fields["S"] == "FATAL"
    assert fields["V"] == "FATAL"
    assert fields["C"] == "08P01"
    assert fields["M"] == "no such database: nope"


def test_parse_error_fields_of_a_real_server_error() -> None:
    # As PostgreSQL 15 sends "division by zero", with file/line/routine fields.
    body = (
        b"SERROR\x00VERROR\x00C22012\x00Mdivision by zero\x00"
        b"Fint.c\x00L841\x00Rint4div\x00\x00"
    )
    fields = m.parse_error_fields(body)
    assert fields == {
        "S": "ERROR", "V": "ERROR", "C": "22012", "M": "division by zero",
        "F": "int.c", "L": "841", "R": "int4div",
    }
    assert m.parse_error_fields(memoryview(body)) == fields


def test_parse_error_fields_non_utf8_and_empty() -> None:
    fields = m.parse_error_fields(b"Mbad \xff byte\x00\x00")
    assert fields["M"].startswith("bad ")
    assert m.parse_error_fields(b"\x00") == {}


def test_notice_response() -> None:
    kind, body = one(m.notice_response("hello"))
    assert kind == m.NOTICE_RESPONSE
    assert m.parse_error_fields(body) == {"S": "NOTICE", "V": "NOTICE", "C": "00000",
                                          "M": "hello"}


def test_parameter_status_round_trip() -> None:
    kind, body = one(m.parameter_status("application_name", "caf\u00e9"))
    assert kind == m.PARAMETER_STATUS
    assert m.parse_parameter_status(body) == ("application_name", "caf\u00e9")
    assert m.parse_parameter_status(memoryview(body)) == ("application_name", "caf\u00e9")


def test_parameter_status_empty_value() -> None:
    _, body = one(m.parameter_status("application_name", ""))
    assert m.parse_parameter_status(body) == ("application_name", "")


def test_backend_key_data_round_trip() -> None:
    kind, body = one(m.backend_key_data(0x7FFFFFFF, 0xFFFFFFFF))
    assert kind == m.BACKEND_KEY_DATA
    assert m.parse_backend_key_data(body) == (0x7FFFFFFF, 0xFFFFFFFF)


@pytest.mark.parametrize("status", [m.TX_IDLE, m.TX_IN_BLOCK, m.TX_FAILED])
def test_ready_for_query(status: int) -> None:
    assert one(m.ready_for_query(status)) == (m.READY_FOR_QUERY, bytes((status,)))


def test_authentication_messages() -> None:
    kind, body = one(m.authentication(m.AUTH_OK))
    assert kind == m.AUTHENTICATION
    assert m.parse_authentication(body) == (0, b"")
    _, body = one(m.authentication(m.AUTH_MD5_PASSWORD, b"salt"))
    assert m.parse_authentication(body) == (5, b"salt")
    _, body = one(m.authentication_sasl(["SCRAM-SHA-256", "SCRAM-SHA-256-PLUS"]))
    code, payload = m.parse_authentication(body)
    assert code == m.AUTH_SASL
    assert payload == b"SCRAM-SHA-256\x00SCRAM-SHA-256-PLUS\x00\x00"
    assert m.parse_sasl_mechanisms(payload) == ["SCRAM-SHA-256", "SCRAM-SHA-256-PLUS"]


def test_negotiate_protocol_version() -> None:
    kind, body = one(m.negotiate_protocol_version(3 << 16, ["_pq_.a", "_pq_.b"]))
    assert kind == m.NEGOTIATE_PROTOCOL_VERSION
    version, count = struct.unpack_from("!II", body)
    assert (version, count) == (0x00030000, 2)
    assert body[8:] == b"_pq_.a\x00_pq_.b\x00"


def test_command_tag_and_query_text() -> None:
    _, body = one(m.command_complete("SELECT 3"))
    assert m.parse_command_tag(body) == "SELECT 3"
    _, body = one(m.query("SELECT '\u00e9'"))
    assert m.parse_query_text(body) == "SELECT '\u00e9'"


def test_empty_bodied_replies() -> None:
    assert one(m.parse_complete()) == (m.PARSE_COMPLETE, b"")
    assert one(m.close_complete()) == (m.CLOSE_COMPLETE, b"")
    assert one(m.empty_query_response()) == (m.EMPTY_QUERY_RESPONSE, b"")
    assert one(m.terminate()) == (m.TERMINATE, b"")
    assert one(m.sync()) == (m.SYNC, b"")


def test_row_description_and_data_row() -> None:
    kind, body = one(m.row_description([("database", 25), ("cl_active", 23)]))
    assert kind == m.ROW_DESCRIPTION
    (count,) = struct.unpack_from("!H", body)
    assert count == 2
    end = body.index(b"\x00", 2)
    assert body[2:end] == b"database"
    pos = end + 1
    table, col, oid, size, mod, fmt = struct.unpack_from("!IhIhih", body, pos)
    assert (oid, size, fmt) == (25, -1, 0)
    end = body.index(b"\x00", pos + 18)
    assert body[pos + 18 : end] == b"cl_active"
    pos = end + 1
    assert struct.unpack_from("!IhIhih", body, pos)[2:4] == (23, 4)
    assert pos + 18 == len(body)

    kind, body = one(m.data_row(["a\u00e9", None, ""]))
    assert kind == m.DATA_ROW
    assert body == (
        b"\x00\x03" + b"\x00\x00\x00\x03a\xc3\xa9" + b"\xff\xff\xff\xff" + b"\x00\x00\x00\x00"
    )


def test_startup_message_layout() -> None:
    data = m.startup_message({"user": "app", "database": "db"})
    assert struct.unpack_from("!II", data) == (len(data), 196608)
    assert data[8:] == b"user\x00app\x00database\x00db\x00\x00"
    assert struct.unpack_from("!I", m.startup_message({}, minor=2), 4) == (196610,)


def test_cancel_request_layout() -> None:
    assert m.cancel_request(1, 2) == struct.pack("!IIII", 16, 80877102, 1, 2)


def test_sasl_initial_response_round_trip() -> None:
    kind, body = one(m.sasl_initial_response("SCRAM-SHA-256", b"n,,n=,r=abc"))
    assert kind == m.PASSWORD_MESSAGE
    assert m.parse_sasl_initial_response(body) == ("SCRAM-SHA-256", b"n,,n=,r=abc")


def test_sasl_initial_response_without_data() -> None:
    # Length -1: no initial response at all (RFC 4422), not an empty one.
    body = b"SCRAM-SHA-256\x00\xff\xff\xff\xff"
    assert m.parse_sasl_initial_response(body) == ("SCRAM-SHA-256", None)


def test_sasl_initial_response_with_empty_data() -> None:
    body = b"SCRAM-SHA-256\x00\x00\x00\x00\x00"
    assert m.parse_sasl_initial_response(body) == ("SCRAM-SHA-256", b"")


@pytest.mark.parametrize(
    "body",
    [
        b"SCRAM-SHA-256\x00" + struct.pack("!i", 5) + b"n,,n=,r=abc",  # shorter than the rest
        b"SCRAM-SHA-256\x00" + struct.pack("!i", 50) + b"n,,n=,r=abc",  # longer
        b"SCRAM-SHA-256\x00" + struct.pack("!i", -1) + b"n,,n=,r=abc",  # none, yet data
        b"SCRAM-SHA-256\x00" + struct.pack("!i", -2),
        b"SCRAM-SHA-256" + struct.pack("!i", 0),  # the mechanism is not terminated
    ],
)
def test_sasl_initial_response_length_must_match_the_rest(body: bytes) -> None:
    # PostgreSQL: pq_getmsgbytes then pq_getmsgend, "invalid message format".
    with pytest.raises(ValueError):
        m.parse_sasl_initial_response(body)


def test_sasl_initial_response_too_short() -> None:
    with pytest.raises(ValueError):
        m.parse_sasl_initial_response(b"SCRAM-SHA-256\x00\x00\x00")


def test_password_message() -> None:
    kind, body = one(m.password_message(m.cstring("s3cret")))
    assert kind == m.PASSWORD_MESSAGE
    assert m.parse_password(body) == "s3cret"


def test_data_row_round_trips_values_and_nulls() -> None:
    built = m.data_row(["1", None, "", "héllo"])
    assert built[:1] == b"D"
    assert m.parse_data_row(built[5:]) == ["1", None, "", "héllo"]
