"""pooler/notifications.py: LISTEN without pinning (listen_mode = shared) over fake
transports (tests/net/fakes.py): the bridge, UNLISTEN * before the server's next client,
a notification never inside another message, and the NOTICEs when the listening connection
is lost and back."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from pypool.core.states import ServerState
from pypool.net.listen_server import ListenServer
from pypool.protocol import messages as m
from tests.net.fakes import CancelConnection, command, kinds, query_texts, select_one

pytestmark = pytest.mark.timeout(10)


def notification(channel: bytes, payload: bytes, pid: int = 42) -> bytes:
    return m.message(m.NOTIFICATION_RESPONSE,
                     struct.pack("!I", pid) + channel + b"\0" + payload + b"\0")


def listeners(net: Any) -> list[CancelConnection]:
    """The listening connections the pooler dialed (the fake keeps them with cancels')."""
    net.run_callbacks()
    return [c for c in net.cancels if isinstance(c.protocol, ListenServer)]


def log_in(conn: CancelConnection) -> bytes:
    """PostgreSQL lets the listening connection in; returns what it asked then."""
    assert conn.transport.take()[4:8] == b"\x00\x03\x00\x00", "a StartupMessage first"
    conn.protocol.data_received(m.authentication(m.AUTH_OK) + m.backend_key_data(77, 1)
                                + m.ready_for_query())
    return conn.transport.take()


def test_listen_bridges_then_frees_its_server_and_delivers_at_message_boundaries(
        fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("LISTEN news"))
    assert query_texts(server.take()) == ["LISTEN news"]
    server.send(command("LISTEN"))
    assert kinds(client.take()) == "CZ", "no NOTICE: the bridge pins nothing for long"
    assert server.state is ServerState.ACTIVE, "kept: it hears the channel meanwhile"
    assert client.conn.session.pinned() == "listen", "SHOW CLIENTS says so"
    (listener,) = listeners(net)
    assert query_texts(log_in(listener)) == ['LISTEN "news"']
    listener.protocol.data_received(command("LISTEN"))
    assert server.state is ServerState.IDLE, "the listening connection has it: freed"
    assert client.conn.session.pinned() == ""
    listener.protocol.data_received(notification(b"news", b"idle"))
    assert kinds(client.take()) == "A"
    assert net.pool().stats.notifications_delivered == 1
    # The next transaction: the server is undone first, then the client's Query runs; a
    # notification that arrives mid-reply waits for the ReadyForQuery.
    client.send(m.query("SELECT 1"))
    assert query_texts(server.take()) == ["UNLISTEN *"]
    server.send(command("UNLISTEN"))
    assert query_texts(server.take()) == ["SELECT 1"]
    reply = select_one()
    server.send(reply[:9])
    listener.protocol.data_received(notification(b"news", b"busy"))
    server.send(reply[9:])
    received = client.take()
    assert received.startswith(reply) and kinds(received) == "TDCZA"
    assert received.endswith(notification(b"news", b"busy"))


def test_unlisten_and_leaving_let_the_listening_connection_go(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("LISTEN news"))
    server.take()
    (listener,) = listeners(net)
    log_in(listener)
    listener.protocol.data_received(command("LISTEN"))
    server.send(command("LISTEN"))
    assert server.state is ServerState.IDLE, "held already: no bridge"
    client.send(m.query("UNLISTEN news"))
    assert query_texts(server.take()) == ["UNLISTEN *"]
    server.send(command("UNLISTEN"))
    assert query_texts(server.take()) == ["UNLISTEN news"]
    server.send(command("UNLISTEN"))
    assert listener.transport.closed, "nobody listens: it goes"
    listener.protocol.data_received(notification(b"news", b"late"))
    assert b"late" not in client.take()


def test_a_lost_listening_connection_gives_a_notice_and_another_one(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("LISTEN news"))
    server.take()
    (first,) = listeners(net)
    log_in(first)
    first.protocol.data_received(command("LISTEN"))
    server.send(command("LISTEN"))
    client.take()
    first.transport.closed = True
    first.protocol.connection_lost(ConnectionResetError())
    lost = client.take()
    assert kinds(lost) == "N" and b"notifications sent until it is back may be missed" in lost
    second = [c for c in listeners(net) if c is not first]
    assert len(second) == 1, "opened again at once"
    assert query_texts(log_in(second[0])) == ['LISTEN "news"']
    assert client.take() == b"", "not back until the channel is listened to again"
    second[0].protocol.data_received(command("LISTEN") + notification(b"news", b"again"))
    back = client.take()
    assert kinds(back) == "AN" and b"listening again" in back
    assert back.startswith(notification(b"news", b"again"))


def test_listen_mode_pin_opens_no_listening_connection(fake_pooler: Any) -> None:
    net = fake_pooler(listen_mode="pin")
    client, server = net.client_with_server()
    client.send(m.query("LISTEN news"))
    server.take()
    server.send(command("LISTEN"))
    assert kinds(client.take()) == "CZN"
    assert listeners(net) == [] and server.state is ServerState.ACTIVE
