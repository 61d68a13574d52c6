"""net/client.py: one client connection, from its StartupMessage to its Terminate, over fake
transports (tests/net/fakes.py)."""

from __future__ import annotations

from typing import Any

import pytest

from pypool.core.states import ClientState, ServerState
from pypool.net.flow_control import LARGE_READ
from pypool.protocol import messages as m
from tests.net.fakes import command, errors_in, kinds, select_one

pytestmark = pytest.mark.timeout(10)


def test_the_welcome_is_authentication_ok_parameters_key_and_ready(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, _ = net.client_with_server(application_name="unit")
    welcome = kinds(client.welcome)
    assert welcome[0] == "R" and welcome.endswith("KZ") and set(welcome[1:-2]) == {"S"}
    assert m.parameter_status("application_name", "unit") in client.welcome
    assert client.state is ClientState.IDLE and client.cancel_key != (0, 0)


def test_an_unknown_database_is_refused(fake_pooler: Any) -> None:
    net = fake_pooler()
    client = net.connect(database="nosuch")
    (error,) = errors_in(client.take())
    assert (error["S"], error["C"], error["M"]) == ("FATAL", "08P01", "no such database: nosuch")
    assert client.state is ClientState.CLOSED and client.transport.closed
    assert net.opening() == []


def test_trust_refuses_a_user_the_pooler_does_not_know(fake_pooler: Any) -> None:
    net = fake_pooler()
    client = net.connect(user="stranger")
    (error,) = errors_in(client.take())
    assert error["M"] == '"trust" authentication failed'
    assert client.state is ClientState.CLOSED


def test_a_terminate_closes_an_idle_client_and_leaves_the_server_idle(
        fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.terminate())
    assert client.state is ClientState.CLOSED and client.transport.closed
    assert server.take() == b"" and net.pool().idle == [server.conn]
    assert client.conn not in net.pool().clients


def test_a_message_with_an_impossible_length_is_a_protocol_violation(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(b"Q\x00\x00\x00\x02")
    (error,) = errors_in(client.take())
    assert (error["S"], error["C"]) == ("FATAL", "08P01")
    assert client.state is ClientState.CLOSED and server.take() == b""


def test_a_client_that_leaves_mid_transaction_takes_its_server_down(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("BEGIN"))
    server.send(command("BEGIN", m.TX_IN_BLOCK))
    client.send(m.query("INSERT INTO t VALUES (1)"))
    server.send(command("INSERT 0 1", m.TX_IN_BLOCK))
    server.take()
    client.leave()
    assert server.closed() == m.terminate(), "never reused: the insert is rolled back"
    assert net.pool().idle == [] and net.pool().server_count == 0


def test_a_client_that_leaves_mid_query_takes_its_server_down(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("SELECT pg_sleep(60)"))
    server.take()
    client.leave()
    assert server.closed() == m.terminate()
    second = net.connect()
    second.send(m.query("SELECT 1"))
    (fresh,) = net.open_servers()
    assert fresh.take() == m.query("SELECT 1") and server.take() == b""


def test_a_client_that_leaves_between_transactions_leaves_its_server_to_others(
        fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("SELECT 1"))
    server.send(select_one())
    client.leave()
    assert not server.transport.closed and net.pool().idle == [server.conn]


def test_a_client_that_stops_reading_pauses_its_servers_reads(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("SELECT * FROM big"))
    client.conn.pause_writing()
    assert not server.transport.reading, "PostgreSQL waits rather than the pooler buffering"
    client.conn.resume_writing()
    assert server.transport.reading


def test_a_client_paused_while_idle_pauses_the_server_it_is_given(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.conn.pause_writing()
    assert server.transport.reading
    client.send(m.query("SELECT 1"))
    assert not server.transport.reading
    client.conn.resume_writing()
    server.send(select_one())
    assert server.transport.reading and net.pool().idle == [server.conn]


def test_after_a_large_read_the_others_are_served_before_the_next(fake_pooler: Any) -> None:
    """A read of LARGE_READ bytes or more (a client streaming a flood of Queries, a server a
    huge result) is followed by a turn of the event loop before its connection is read
    again (net/flow_control.py `take_turns`): libuv would otherwise read it up to 32 times
    in a row while every other connection waits. A small read never pauses; flow control's
    own pause is not lifted by the turn."""
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("SELECT 1"))
    assert client.transport.reading and client.transport.pauses == 0, "small: read on"
    server.send(select_one())
    big = m.query("SELECT '" + "x" * LARGE_READ + "'")
    client.send(big)
    assert server.take() == m.query("SELECT 1") + big, "the large read went on whole"
    assert not client.transport.reading, "then no more reads until the loop's next turn"
    net.run_callbacks()
    assert client.transport.reading, "read again once the others had their turn"
    server.send(select_one())
    client.send(m.query("SELECT * FROM big"))
    row = b"D" + (2 * LARGE_READ).to_bytes(4, "big") + b"\x00" * LARGE_READ  # half a row
    server.send(row)
    assert client.take().endswith(row), "the large read went on whole"
    assert not server.transport.reading, "a server's large read takes turns too"
    client.conn.pause_writing()  # flow control pauses the server, and keeps it paused
    net.run_callbacks()
    assert not server.transport.reading, "the turn does not lift flow control's pause"
    client.conn.resume_writing()
    assert server.transport.reading


def test_bytes_a_client_sends_are_counted_in_its_pool(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    query = m.query("SELECT 1")
    client.send(query)
    server.send(select_one())
    stats = net.pool().stats
    assert stats.bytes_received == len(query) and stats.bytes_sent == len(select_one())


def test_a_terminate_mid_transaction_closes_the_server(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("BEGIN"))
    server.send(command("BEGIN", m.TX_IN_BLOCK))
    server.take()
    client.send(m.terminate())
    assert client.state is ClientState.CLOSED
    assert server.closed() == m.terminate() and server.state is ServerState.CLOSED


def test_max_client_conn_refuses_one_client_too_many(fake_pooler: Any) -> None:
    net = fake_pooler(max_client_conn=2)
    first, _ = net.client_with_server()
    second = net.connect()
    third = net.connect()
    (error,) = errors_in(third.take())
    assert (error["C"], error["M"]) == ("53300", "no more connections allowed (max_client_conn)")
    assert third.state is ClientState.CLOSED
    assert first.state is ClientState.IDLE and second.state is ClientState.IDLE


def test_a_notification_reaches_the_client_that_holds_the_server(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("BEGIN"))
    server.send(command("BEGIN", m.TX_IN_BLOCK))
    client.take()
    notification = m.message(ord("A"), (123).to_bytes(4, "big") + b"news\x00hello\x00")
    server.send(notification)
    assert client.take() == notification
