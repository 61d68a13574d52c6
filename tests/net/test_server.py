"""net/server.py: one connection to PostgreSQL, from its login to its close, over fake
transports (tests/net/fakes.py)."""

from __future__ import annotations

from typing import Any

import pytest

from pypool.core.states import ClientState, ServerState
from pypool.protocol import messages as m
from tests.net.fakes import command, errors_in, kinds, query_texts, select_one

pytestmark = pytest.mark.timeout(10)

LOGIN_REFUSED = m.error_response('password authentication failed for user "app"', "28P01",
                                 "FATAL")


def test_a_server_that_dies_mid_transaction_closes_its_client(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("BEGIN"))
    server.send(command("BEGIN", m.TX_IN_BLOCK))
    client.take()
    server.lose()
    (error,) = errors_in(client.take())
    assert (error["S"], error["C"], error["M"]) == ("FATAL", "08P01", "server conn crashed?")
    assert client.state is ClientState.CLOSED and client.transport.closed
    assert net.pool().server_count == 0
    assert net.pool().stats.errors["server_conn_crashed"] == 1


def test_a_server_that_dies_mid_query_closes_its_client(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("SELECT 1"))
    server.send(m.row_description([("x", 23)]))  # half its replies
    server.lose()
    received = client.take()
    assert kinds(received) == "TE" and errors_in(received)[0]["M"] == "server conn crashed?"
    assert client.state is ClientState.CLOSED


def test_an_idle_server_that_dies_is_forgotten_and_replaced_when_needed(
        fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    server.lose()
    assert net.pool().idle == [] and net.pool().server_count == 0
    assert client.state is ClientState.IDLE and client.take() == b"", "nobody was using it"
    client.send(m.query("SELECT 1"))
    assert client.state is ClientState.WAITING
    (fresh,) = net.open_servers()
    assert fresh.take() == m.query("SELECT 1")


@pytest.mark.parametrize("severity", ["FATAL", "PANIC"])
def test_an_idle_server_that_says_fatal_is_closed_before_its_end_of_file(
        fake_pooler: Any, severity: str) -> None:
    """pg_terminate_backend of an idle server: PostgreSQL sends FATAL 57P01, then exits
    (its end of file can come milliseconds later). A client that asks in between gets a
    new server, never that one (its query would meet "server conn crashed?")."""
    net = fake_pooler()
    client, server = net.client_with_server()
    server.send(m.error_response("terminating connection due to administrator command",
                                 "57P01", severity))
    assert server.state is ServerState.CLOSED and server.transport.closed
    assert net.pool().idle == [] and net.pool().server_count == 0
    client.send(m.query("SELECT 1"))
    assert client.state is ClientState.WAITING and client.take() == b""
    (fresh,) = net.open_servers()
    assert fresh.take() == m.query("SELECT 1")


def test_an_idle_server_keeps_its_place_after_a_notice(fake_pooler: Any) -> None:
    """Only a FATAL closes an idle server: a NoticeResponse or ParameterStatus it sends
    (a reload) does not."""
    net = fake_pooler()
    client, server = net.client_with_server()
    server.send(m.notice_response("note", "01000")
                + m.error_response("not fatal", "XX000", "ERROR")[:5])  # and a part message
    assert server.state is ServerState.IDLE and net.pool().server_count == 1


NAMED_SEGMENT = (m.message(m.PARSE, b"s1\x00SELECT 1\x00\x00\x00")
                 + m.message(m.BIND, b"\x00s1\x00\x00\x00\x00\x00\x00\x00")
                 + m.execute() + m.sync())


@pytest.mark.parametrize("junk", [
    b"E\x00\x00\x00\x00",  # lengths below 4: nothing after them can be framed
    b"C\x00\x00\x00\x02",
    b"D\x00\x00\x00\x03",
    b"1\x00\x00\x00\x04" + b"\x00\x00\x00\x00\x00",
    b"Z\x00\x00\x00\x04",  # a ReadyForQuery with no status
    b"Z\x00\x00\x00\x06II",
    b"Z\x7f\xff\xff\xff",  # one that would be waited for, 2 GiB of it
])
@pytest.mark.parametrize("request_", ["simple", "named"])
def test_a_server_that_breaks_the_framing_goes_and_its_client_is_told(
        fake_pooler: Any, junk: bytes, request_: str) -> None:
    """Bytes no PostgreSQL sends (as PgBouncer's "bad pkt header"): the server is closed,
    its client gets "server conn crashed?", nothing of the bad message reaches it, and no
    exception leaves data_received (compiled, a slice of a message shorter than its header
    raised SystemError). On the hot path and the tracked one (a statement to prepare)."""
    net = fake_pooler(max_prepared_statements=20)
    client, server = net.client_with_server()
    client.send(m.query("SELECT 1") if request_ == "simple" else NAMED_SEGMENT)
    server.take()
    server.send(junk)  # FakeServer.send calls data_received: an exception fails the test
    received = client.take()
    (error,) = errors_in(received)
    assert (error["S"], error["C"], error["M"]) == ("FATAL", "08P01", "server conn crashed?")
    assert kinds(received) == "E" and client.state is ClientState.CLOSED
    assert server.state is ServerState.CLOSED and server.transport.closed
    assert net.pool().server_count == 0


def test_an_idle_server_that_breaks_the_framing_goes(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    server.send(b"Z\x00\x00\x00\x00")
    assert server.state is ServerState.CLOSED and net.pool().server_count == 0
    assert client.state is ClientState.IDLE and client.take() == b""


def test_a_refused_login_gives_the_waiting_clients_the_servers_error(fake_pooler: Any) -> None:
    net = fake_pooler()
    client = net.connect()
    (server,) = net.fail_logins(LOGIN_REFUSED)
    assert client.take() == LOGIN_REFUSED and client.state is ClientState.CLOSED
    assert server.transport.closed
    later = net.connect()
    (error,) = errors_in(later.take())
    assert error["M"] == ('server login has been failing, cached error: password '
                          'authentication failed for user "app" (server_login_retry)')
    assert later.state is ClientState.CLOSED
    assert net.pool().stats.errors["server_login_failed"] == 1


def test_logins_are_retried_after_server_login_retry(fake_pooler: Any) -> None:
    net = fake_pooler(server_login_retry=15)
    net.connect()
    net.fail_logins(LOGIN_REFUSED)
    net.clock.advance(16)
    client = net.connect()
    assert client.state is ClientState.WELCOME
    net.open_servers()
    assert client.take() == b"" and kinds(client.welcome).endswith("KZ")
    assert client.state is ClientState.IDLE


def test_replies_the_server_sends_in_pieces_reach_the_client_whole(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("SELECT 1"))
    reply = m.notice_response("hello") + select_one()
    for cut in range(0, len(reply), 7):
        server.send(reply[cut:cut + 7])
    assert client.take() == reply


def test_a_server_that_stops_reading_pauses_its_client(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("COPY t FROM STDIN"))
    server.conn.pause_writing()
    assert not client.transport.reading
    server.conn.resume_writing()
    assert client.transport.reading


def test_a_parameter_the_client_set_goes_with_it_to_its_next_server(fake_pooler: Any) -> None:
    net = fake_pooler(default_pool_size=2)
    client, one = net.client_with_server()
    client.send(m.query("SET TimeZone = 'Asia/Tokyo'"))
    one.take()
    one.send(m.command_complete("SET") + m.parameter_status("TimeZone", "Asia/Tokyo")
             + m.ready_for_query())
    assert m.parameter_status("TimeZone", "Asia/Tokyo") in client.take()
    other = net.connect()
    other.send(m.query("BEGIN"))  # takes the first server, set back to UTC for it
    (reset,) = query_texts(one.take())
    assert "TimeZone" in reset and "UTC" in reset
    client.send(m.query("SELECT now()"))
    (two,) = net.open_servers()
    (sent,) = query_texts(two.take())
    assert "Asia/Tokyo" in sent, "its own TimeZone set on the new server first"


def test_closing_a_logged_in_server_says_terminate(fake_pooler: Any) -> None:
    net = fake_pooler()
    _, server = net.client_with_server()
    net.pooler.close_server(server.conn, "test")
    assert server.closed() == m.terminate()
    assert server.state is ServerState.CLOSED and net.pool().server_count == 0
