"""pooler/janitor.py: the timeouts and pool sizes enforced by `sweep`, with the fake clock
moved by hand (tests/net/fakes.py)."""

from __future__ import annotations

from typing import Any

import pytest

from pypool.core.states import ClientState, ServerState
from pypool.pooler import janitor
from pypool.protocol import messages as m
from pypool.settings import DatabaseEntry
from tests.net.fakes import Client, FakePooler, command, errors_in, select_one, split

pytestmark = pytest.mark.timeout(10)


def waiting_client(net: FakePooler) -> tuple[Client, Client, Any]:
    """A client holding the only server mid-query, and one waiting for it."""
    busy, server = net.client_with_server()
    waiter = net.connect()
    busy.send(m.query("SELECT pg_sleep(60)"))
    waiter.send(m.query("SELECT 1"))
    assert waiter.state is ClientState.WAITING
    return busy, waiter, server


def test_query_wait_timeout_fails_a_waiting_client_with_pgbouncers_error(
        fake_pooler: Any) -> None:
    net = fake_pooler(query_wait_timeout=5, query_wait_notify=0)
    _, waiter, server = waiting_client(net)
    net.clock.advance(5.1)
    janitor.sweep(net.pooler)
    (error,) = errors_in(waiter.take())
    assert (error["S"], error["C"], error["M"]) == ("FATAL", "08P01", "query_wait_timeout")
    assert waiter.state is ClientState.CLOSED and waiter.transport.closed
    assert not net.pool().waiting
    assert net.pool().stats.errors["query_wait_timeout"] == 1
    assert server.state is ServerState.ACTIVE, "the busy client keeps its server"


def test_query_wait_timeout_spares_a_client_not_yet_past_it(fake_pooler: Any) -> None:
    net = fake_pooler(query_wait_timeout=5, query_wait_notify=0)
    _, waiter, server = waiting_client(net)
    net.clock.advance(4.9)
    janitor.sweep(net.pooler)
    assert waiter.take() == b"" and waiter.state is ClientState.WAITING
    server.take()
    server.send(select_one())
    assert waiter.state is ClientState.ACTIVE and m.query("SELECT 1") in server.take()


def test_query_wait_notify_tells_a_queued_client_once(fake_pooler: Any) -> None:
    net = fake_pooler(query_wait_notify=2, query_wait_timeout=0)
    _, waiter, _ = waiting_client(net)
    net.clock.advance(2.5)
    janitor.sweep(net.pooler)
    janitor.sweep(net.pooler)
    notices = [body for kind, body in split(waiter.take()) if kind == "N"]
    assert len(notices) == 1 and janitor.WAIT_NOTICE.encode() in notices[0]
    assert waiter.state is ClientState.WAITING


def test_query_timeout_closes_the_server_of_a_running_query(fake_pooler: Any) -> None:
    net = fake_pooler(query_timeout=10)
    client, server = net.client_with_server()
    client.send(m.query("SELECT pg_sleep(60)"))
    net.clock.advance(10.5)
    janitor.sweep(net.pooler)
    (error,) = errors_in(client.take())
    assert error["M"] == "query timeout" and client.state is ClientState.CLOSED
    server.take()
    assert server.closed() == b"" and server.state is ServerState.CLOSED
    assert net.pool().server_count == 0


def test_idle_transaction_timeout_closes_an_idle_transaction(fake_pooler: Any) -> None:
    net = fake_pooler(idle_transaction_timeout=3)
    client, server = net.client_with_server()
    client.send(m.query("BEGIN"))
    server.send(command("BEGIN", m.TX_IN_BLOCK))
    client.take()
    net.clock.advance(2)
    janitor.sweep(net.pooler)
    assert client.state is ClientState.ACTIVE
    net.clock.advance(2)
    janitor.sweep(net.pooler)
    (error,) = errors_in(client.take())
    assert error["M"] == "idle transaction timeout" and client.transport.closed
    assert server.transport.closed and server.conn not in net.pool().idle


def test_transaction_timeout_ends_a_long_transaction(fake_pooler: Any) -> None:
    net = fake_pooler(transaction_timeout=5)
    client, server = net.client_with_server()
    client.send(m.query("BEGIN"))
    server.send(command("BEGIN", m.TX_IN_BLOCK))
    for _ in range(3):
        net.clock.advance(2)
        client.send(m.query("SELECT 1"))
        server.send(select_one(m.TX_IN_BLOCK))
        janitor.sweep(net.pooler)
    errors = errors_in(client.take())
    assert [e["M"] for e in errors] == ["transaction timeout"]
    assert server.transport.closed and net.pool().stats.errors["transaction_timeout"] == 1


def test_client_idle_timeout_closes_an_idle_client_only(fake_pooler: Any) -> None:
    net = fake_pooler(client_idle_timeout=30, default_pool_size=2)
    idle, server = net.client_with_server()
    busy = net.connect()
    busy.send(m.query("BEGIN"))
    server.send(command("BEGIN", m.TX_IN_BLOCK))
    net.clock.advance(31)
    janitor.sweep(net.pooler)
    assert errors_in(idle.take())[0]["M"] == "client_idle_timeout"
    assert idle.state is ClientState.CLOSED and busy.state is ClientState.ACTIVE


def test_client_login_timeout_when_no_server_ever_answers(fake_pooler: Any) -> None:
    net = fake_pooler(client_login_timeout=10, query_wait_timeout=0)
    client = net.connect()
    assert client.state is ClientState.WELCOME
    net.clock.advance(11)
    janitor.sweep(net.pooler)
    (error,) = errors_in(client.take())
    assert error["M"] == "client_login_timeout (server down)"
    assert client.state is ClientState.CLOSED


def test_server_idle_timeout_closes_idle_servers_above_min_pool_size(fake_pooler: Any) -> None:
    net = fake_pooler(server_idle_timeout=60, default_pool_size=3,
                      databases={"app": DatabaseEntry(name="app", min_pool_size=1)})
    first, one = net.client_with_server()
    first.send(m.query("BEGIN"))
    one.send(command("BEGIN", m.TX_IN_BLOCK))
    second = net.connect()
    second.send(m.query("SELECT 1"))
    (two,) = net.open_servers()
    two.send(select_one())
    first.send(m.query("COMMIT"))
    one.send(command("COMMIT"))
    assert len(net.pool().idle) == 2 and net.opening() == []
    net.clock.advance(59)
    janitor.sweep(net.pooler)
    assert not one.transport.closed and not two.transport.closed
    net.clock.advance(2)
    janitor.sweep(net.pooler)
    (closed,) = [server for server in (one, two) if server.transport.closed]
    assert closed.closed().endswith(m.terminate())
    assert net.pool().server_count == 1 and len(net.pool().idle) == 1, "min_pool_size kept"


def test_min_pool_size_is_kept_by_the_sweep(fake_pooler: Any) -> None:
    net = fake_pooler(default_pool_size=5,
                      databases={"app": DatabaseEntry(name="app", min_pool_size=2)})
    net.connect()
    for _ in range(3):
        net.open_servers()
        janitor.sweep(net.pooler)
    assert net.pool().server_count == 2 and len(net.pool().idle) == 2
