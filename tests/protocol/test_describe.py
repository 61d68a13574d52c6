"""One message as one line (protocol/describe.py): names as the protocol chapter spells them,
what matters in each body, and never a secret. Fed bytes built by protocol/messages.py."""

from __future__ import annotations

from pypool.protocol import messages as m
from pypool.protocol.describe import CLIENT, KEPT, SERVER, describe, describe_startup


def body(message: bytes) -> bytes:
    return message[5:]


def test_backend_replies_name_what_matters() -> None:
    error = body(m.error_response('relation "t" does not exist', "42P01"))
    assert describe(SERVER, m.ERROR_RESPONSE, error) == (
        'ErrorResponse ERROR 42P01 "relation \\"t\\" does not exist"')
    assert describe(SERVER, m.READY_FOR_QUERY, body(m.ready_for_query(m.TX_IDLE))) == (
        "ReadyForQuery status=I")
    assert describe(SERVER, m.COMMAND_COMPLETE, body(m.command_complete("SELECT 1"))) == (
        'CommandComplete tag="SELECT 1"')
    assert describe(SERVER, m.ROW_DESCRIPTION, body(m.row_description([("a", 23)]))) == (
        "RowDescription columns=1 [a]")
    row = body(m.data_row(["1", None]))
    assert describe(SERVER, m.DATA_ROW, row) == f"DataRow values=2 [1, NULL] ({len(row)} bytes)"


def test_authentication_shows_the_mechanisms_never_the_exchange() -> None:
    assert describe(SERVER, m.AUTHENTICATION, body(m.authentication(m.AUTH_OK))) == (
        "AuthenticationOk")
    offer = body(m.authentication_sasl(["SCRAM-SHA-256"]))
    assert describe(SERVER, m.AUTHENTICATION, offer) == (
        "AuthenticationSASL mechanisms=SCRAM-SHA-256")
    final = body(m.authentication(m.AUTH_SASL_FINAL, b"v=c2lnbmF0dXJl"))
    text = describe(SERVER, m.AUTHENTICATION, final)
    assert text == "AuthenticationSASLFinal (not shown)" and "c2ln" not in text
    assert "hunter2" not in describe(CLIENT, ord("p"), b"hunter2\0")


def test_unknown_malformed_and_long_bodies() -> None:
    assert describe(CLIENT, ord("?"), b"") == "Unknown('?')"
    assert describe(SERVER, m.READY_FOR_QUERY, b"") == "ReadyForQuery status=?"
    # A body cut short still makes a line: the decoders read what is there.
    assert describe(SERVER, m.PARAMETER_DESCRIPTION, b"\0") == "ParameterDescription types=0"
    assert describe(SERVER, m.COPY_DATA, b"x" * 10, length=KEPT + 1) == (
        f"CopyData ({KEPT + 1} bytes)")
    assert describe(SERVER, m.PARSE_COMPLETE, b"", length=KEPT + 1) == (
        f"ParseComplete ({KEPT + 1} bytes)")


def test_startup_packets_by_their_code() -> None:
    assert describe_startup((80877104).to_bytes(4, "big")) == "GSSENCRequest"
