"""pooler/lifecycle.py: RECONNECT and a reload, over fake transports (tests/net/fakes.py).
Neither drops anyone: servers are replaced as they come free, never under a transaction,
and a tagged server is never handed to the next client. (PAUSE is in test_linking.py; the
signals, the ini re-read and the console's commands against real PostgreSQL in
tests/integration.)"""

from __future__ import annotations

from typing import Any

import pytest

from pypool.core.states import ClientState, ServerState
from pypool.pooler import lifecycle
from pypool.protocol import messages as m
from pypool.settings import DatabaseEntry
from tests.net.fakes import DATABASE, command, errors_in, make_settings, query_texts, select_one

pytestmark = pytest.mark.timeout(10)


def test_reconnect_closes_idle_servers_now_and_busy_ones_at_their_release(
        fake_pooler: Any) -> None:
    net = fake_pooler(default_pool_size=2)
    idle_client, idle = net.client_with_server()
    busy_client = net.connect()
    idle_client.send(m.query("BEGIN"))
    busy_client.send(m.query("SELECT 1"))
    (busy,) = net.open_servers()
    idle.send(command("BEGIN", m.TX_IN_BLOCK))
    idle_client.send(m.query("COMMIT"))
    idle.send(command("COMMIT"))  # idle again; `busy` still runs SELECT 1
    assert idle.state is ServerState.IDLE and busy.state is ServerState.ACTIVE
    assert query_texts(idle.take()) == ["BEGIN", "COMMIT"]
    assert query_texts(busy.take()) == ["SELECT 1"]
    lifecycle.tag_dirty(net.pooler, net.pool(), "database configuration changed")
    assert idle.closed() == m.terminate(), "an idle server goes at once"
    assert not busy.transport.closed, "a busy one finishes what it runs"
    waiting = net.connect()
    waiting.send(m.query("SELECT 2"))
    busy.send(select_one())
    assert busy_client.take() == select_one()
    assert busy.closed() == m.terminate(), "closed at its release, not handed on"
    fresh = net.open_servers()
    assert [query_texts(server.take()) for server in fresh] == [["SELECT 2"]]
    assert waiting.state is ClientState.ACTIVE


def test_reconnect_lets_a_transaction_finish_on_its_server(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("BEGIN"))
    server.send(command("BEGIN", m.TX_IN_BLOCK))
    lifecycle.tag_dirty(net.pooler, net.pool(), "database configuration changed")
    client.send(m.query("INSERT INTO t VALUES (1)"))
    server.send(command("INSERT 0 1", m.TX_IN_BLOCK))
    client.send(m.query("COMMIT"))
    assert query_texts(server.take()) == ["BEGIN", "INSERT INTO t VALUES (1)", "COMMIT"]
    server.send(command("COMMIT"))
    assert client.take().endswith(command("COMMIT")) and client.state is ClientState.IDLE
    assert server.closed() == m.terminate()


def test_a_reload_that_changes_where_servers_connect_replaces_them(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    moved = {DATABASE: DatabaseEntry(name=DATABASE, port=5999)}
    lifecycle.apply_settings(net.pooler, make_settings(moved))
    assert server.closed() == m.terminate()
    client.send(m.query("SELECT 1"))
    (fresh,) = net.open_servers()
    assert query_texts(fresh.take()) == ["SELECT 1"] and client.state is ClientState.ACTIVE


def test_a_reload_of_sizes_alone_keeps_the_servers(fake_pooler: Any) -> None:
    net = fake_pooler(default_pool_size=1)
    first, server = net.client_with_server()
    second = net.connect()
    first.send(m.query("SELECT 1"))
    second.send(m.query("SELECT 2"))
    assert second.state is ClientState.WAITING and net.opening() == []
    lifecycle.apply_settings(net.pooler, make_settings(default_pool_size=2))
    (added,) = net.open_servers()
    assert query_texts(added.take()) == ["SELECT 2"], "the waiting client is served at once"
    assert not server.transport.closed and query_texts(server.take()) == ["SELECT 1"]
    server.send(select_one())
    added.send(select_one())
    assert first.take() == select_one() and second.take() == select_one()
    lifecycle.apply_settings(net.pooler, make_settings(default_pool_size=1))
    closed = [s for s in (server, added) if s.transport.closed]
    assert len(closed) == 1 and closed[0].closed() == m.terminate(), \
        "pool_size lowered: the surplus idle server goes"
    assert net.pool().server_count == 1


def test_a_database_removed_by_a_reload_serves_its_clients_and_refuses_new_ones(
        fake_pooler: Any) -> None:
    net = fake_pooler(databases={"app": DatabaseEntry(name="app"),
                                 "other": DatabaseEntry(name="other", dbname="app")})
    client, server = net.client_with_server()
    lifecycle.apply_settings(net.pooler, make_settings(
        {"other": DatabaseEntry(name="other", dbname="app")}))
    client.send(m.query("SELECT 1"))
    assert query_texts(server.take()) == ["SELECT 1"]
    server.send(select_one())
    assert client.take() == select_one(), "a connected client carries on"
    late = net.connect()
    (error,) = errors_in(late.transport.take())
    assert (error["S"], error["M"]) == ("FATAL", 'no such database: app')
    assert late.state is ClientState.CLOSED and net.pool().clients == {client.conn}
