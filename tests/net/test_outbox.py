"""net/outbox.py: what a client sends while it has no server, kept and handed over at the
link, over fake transports (tests/net/fakes.py)."""

from __future__ import annotations

from typing import Any

import pytest

from pypool.core.states import ClientState
from pypool.net import outbox
from pypool.protocol import messages as m
from tests.net.fakes import command, query_texts, select_one

pytestmark = pytest.mark.timeout(10)


def test_a_waiting_clients_bytes_are_kept_until_it_has_a_server(fake_pooler: Any) -> None:
    net = fake_pooler()
    busy, server = net.client_with_server()
    waiter = net.connect()
    busy.send(m.query("BEGIN"))
    server.send(command("BEGIN", m.TX_IN_BLOCK))
    server.take()
    waiter.send(m.query("SELECT 1"), m.query("SELECT 2"))
    waiter.send(m.query("SELECT 3"))
    assert server.take() == b"" and waiter.state is ClientState.WAITING
    busy.send(m.query("COMMIT"))
    assert query_texts(server.take()) == ["COMMIT"]
    server.send(command("COMMIT"))
    assert server.take() == m.query("SELECT 1") + m.query("SELECT 2") + m.query("SELECT 3"), \
        "in order, in one write"


def test_every_read_kept_goes_in_order_and_none_goes_twice(fake_pooler: Any) -> None:
    """The outbox keeps a first read apart from any that follow it (net/outbox.py `keep`):
    one, two and three reads while waiting each reach the server whole, in order, once,
    and a wait after a link starts from an empty outbox."""
    net = fake_pooler()
    busy, server = net.client_with_server()
    waiter = net.connect()
    for count in (3, 1, 2):
        busy.send(m.query("BEGIN"))
        server.send(command("BEGIN", m.TX_IN_BLOCK))
        server.take()
        sent = [m.query(f"SELECT {count}{n}") for n in range(count)]
        for query in sent:
            waiter.send(query)
        assert server.take() == b"" and waiter.state is ClientState.WAITING
        busy.send(m.query("COMMIT"))
        assert query_texts(server.take()) == ["COMMIT"]
        server.send(command("COMMIT"))
        assert server.take() == b"".join(sent), "each read once, in order, in one write"
        server.send(*[select_one()] * (count - 1), select_one())
        assert waiter.state is ClientState.IDLE, "released: its next wait starts anew"
        waiter.take()


def test_half_a_message_asks_for_no_server(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    query = m.query("SELECT 1")
    client.send(query[:3])
    assert client.state is ClientState.IDLE and server.take() == b""
    client.send(query[3:9])
    assert client.state is ClientState.IDLE
    client.send(query[9:])
    assert client.state is ClientState.ACTIVE and server.take() == query


def test_a_flood_while_waiting_pauses_the_clients_reads_until_linked(fake_pooler: Any) -> None:
    net = fake_pooler()
    busy, server = net.client_with_server()
    waiter = net.connect()
    busy.send(m.query("SELECT pg_sleep(1)"))
    big = m.query("SELECT '" + "x" * (outbox.OUTBOX_HIGH_WATER // 4) + "'")
    for _ in range(5):
        waiter.send(big)
    assert not waiter.transport.reading, "over the high-water mark: reads paused"
    server.take()
    server.send(select_one())
    assert server.take() == big * 5
    assert waiter.transport.reading, "taken by its server: reads resumed"


def test_what_a_client_sends_before_its_welcome_is_relayed_after_it(fake_pooler: Any) -> None:
    net = fake_pooler()
    client = net.connect()
    assert client.state is ClientState.WELCOME
    client.send(m.query("SELECT 1"))  # a client that does not wait for ReadyForQuery
    (server,) = net.open_servers()
    assert client.take() == b"" and client.welcome, "the welcome first"
    assert query_texts(server.take()) == ["SELECT 1"]
    server.send(select_one())
    assert client.take() == select_one()


def test_a_terminate_while_waiting_sends_nothing_to_a_server(fake_pooler: Any) -> None:
    net = fake_pooler()
    busy, server = net.client_with_server()
    waiter = net.connect()
    busy.send(m.query("SELECT 1"))
    waiter.send(m.query("SELECT 2"))
    waiter.send(m.terminate())
    assert waiter.state is ClientState.CLOSED and waiter.transport.closed
    assert not net.pool().waiting
    server.take()
    server.send(select_one())
    assert server.take() == b"" and net.pool().idle == [server.conn], "the query never ran"
