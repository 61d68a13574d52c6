"""pooler/cancel.py: a CancelRequest forwarded to the server its client holds, over fake
transports (tests/net/fakes.py), PostgreSQL's cancel port included."""

from __future__ import annotations

from typing import Any

import pytest

from pypool.core.states import ClientState, ServerState
from pypool.protocol import messages as m
from tests.net.fakes import command, select_one

pytestmark = pytest.mark.timeout(10)


def test_a_cancel_goes_to_the_server_its_client_holds(fake_pooler: Any) -> None:
    net = fake_pooler(default_pool_size=2)
    first, one = net.client_with_server()
    second = net.connect()
    first.send(m.query("SELECT pg_sleep(60)"))
    second.send(m.query("SELECT pg_sleep(61)"))
    (two,) = net.open_servers()
    asked = net.cancel(second.cancel_key)
    assert asked.closed and asked.take() == b"", "the cancel connection gets no reply"
    (sent,) = net.cancels
    assert (sent.host, sent.port) == ("127.0.0.1", 5432)
    assert sent.request == m.cancel_request(*two.backend_key) != m.cancel_request(
        *one.backend_key)
    net.answer_cancels()
    assert sent.transport.closed, "the pooler closes its side once PostgreSQL has"


def test_a_cancel_with_an_unknown_key_goes_nowhere(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, _ = net.client_with_server()
    client.send(m.query("SELECT pg_sleep(60)"))
    pid, secret = client.cancel_key
    net.cancel((pid, secret ^ 1))
    assert net.cancels == []


def test_a_cancel_from_a_client_without_a_server_goes_nowhere(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, _ = net.client_with_server()
    net.cancel(client.cancel_key)
    assert net.cancels == []


def test_a_server_is_handed_to_no_one_while_its_cancel_is_on_its_way(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    waiter = net.connect()
    client.send(m.query("SELECT pg_sleep(60)"))
    waiter.send(m.query("SELECT 2"))
    net.cancel(client.cancel_key)
    server.take()
    server.send(m.error_response("canceling statement due to user request", "57014")
                + m.ready_for_query())
    assert client.state is ClientState.IDLE
    assert waiter.state is ClientState.WAITING and server.take() == b"", \
        "the cancel could still hit the waiter's query"
    assert server.conn in net.pool().being_canceled
    net.answer_cancels()  # PostgreSQL took the cancel
    assert waiter.state is ClientState.ACTIVE and server.take() == m.query("SELECT 2")


def test_a_server_whose_cancel_did_not_complete_is_closed(fake_pooler: Any) -> None:
    net = fake_pooler()
    net.refuse_cancels = True
    client, server = net.client_with_server()
    client.send(m.query("SELECT pg_sleep(60)"))
    server.take()
    server.send(select_one())
    assert client.state is ClientState.IDLE and net.pool().idle == [server.conn]
    client.send(m.query("SELECT pg_sleep(61)"))
    server.take()
    net.cancel(client.cancel_key)  # refused at once: it did not complete
    assert server.closed() == m.terminate(), "never handed on: the cancel may still land"
    assert server.state is ServerState.CLOSED and net.pool().server_count == 0


def test_a_cancel_during_a_transaction_block_keeps_the_link(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("BEGIN"))
    server.send(command("BEGIN", m.TX_IN_BLOCK))
    client.send(m.query("SELECT pg_sleep(60)"))
    net.cancel(client.cancel_key)
    net.answer_cancels()
    assert net.cancels[0].request == m.cancel_request(*server.backend_key)
    server.send(m.error_response("canceling statement", "57014") + m.ready_for_query(m.TX_FAILED))
    assert client.state is ClientState.ACTIVE and server.state is ServerState.ACTIVE
