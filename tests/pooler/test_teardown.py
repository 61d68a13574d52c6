"""pooler/teardown.py: what a client that goes leaves behind, over fake transports
(tests/net/fakes.py). Its server goes back only when nothing is owed on it; anything else
closes it, so no client is ever handed a backend mid-transaction or another's replies.
(The plain cases, a leave mid-transaction, mid-query and between transactions, are in
tests/net/test_client.py; a server that dies, in tests/net/test_server.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from pypool.core.states import ClientState, ServerState
from pypool.protocol import messages as m
from tests.net.fakes import command, kinds, query_texts, select_one

pytestmark = pytest.mark.timeout(10)


def parse(sql: str) -> bytes:
    return m.message(m.PARSE, b"\x00" + sql.encode() + b"\x00\x00\x00")


def bind() -> bytes:
    return m.message(m.BIND, b"\x00\x00\x00\x00\x00\x00\x00\x00")


@pytest.mark.parametrize("max_prepared_statements", [0, 200])
def test_a_client_that_leaves_with_an_unsynced_segment_takes_its_server_down(
        fake_pooler: Any, max_prepared_statements: int) -> None:
    """Parse, Bind, Execute sent and no Sync: PostgreSQL has not run or ended anything the
    pooler can see the end of, though the transaction status last said idle. (With
    statements rewritten their queue owes replies too; without, the client's ledger alone
    says so.)"""
    net = fake_pooler(max_prepared_statements=max_prepared_statements)
    client, server = net.client_with_server()
    client.send(parse("INSERT INTO t VALUES (1)") + bind() + m.execute())
    assert kinds(server.take()) == "PBE", "sent on: the linked server gets them at once"
    client.leave()
    assert server.closed() == m.terminate()
    assert net.pool().server_count == 0 and net.pool().idle == []


def test_a_client_that_leaves_while_its_set_runs_takes_its_server_down(
        fake_pooler: Any) -> None:
    """The pooler's SET for the client is answering: its replies (and ParameterStatus)
    would be read as the next client's."""
    net = fake_pooler()
    client, server = net.client_with_server(TimeZone="Europe/Paris")
    client.send(m.query("SELECT now()"))
    (sent,) = query_texts(server.take())
    assert "Europe/Paris" in sent, "the SET goes first; the query waits for its reply"
    client.leave()
    assert server.closed() == m.terminate()
    second = net.connect()
    second.send(m.query("SELECT 1"))
    (fresh,) = net.open_servers()
    assert query_texts(fresh.take()) == ["SELECT 1"] and second.state is ClientState.ACTIVE


def test_a_pinned_client_that_leaves_idle_has_its_server_discarded_for_the_next(
        fake_pooler: Any) -> None:
    """A LISTEN pinned the server (listen_mode = pin): it goes back after a DISCARD ALL,
    whose replies the next client never sees, before that client's query."""
    net = fake_pooler(listen_mode="pin")
    client, server = net.client_with_server()
    client.send(m.query("LISTEN news"))
    server.take()
    server.send(command("LISTEN"))
    client.take()
    assert net.pool().stats.session_pinned == 1
    client.leave()
    assert query_texts(server.take()) == ["DISCARD ALL"]
    assert not server.transport.closed and server.state is ServerState.IDLE
    second = net.connect()
    second.send(m.query("SELECT 1"))
    assert query_texts(server.take()) == ["SELECT 1"], "queued behind the DISCARD ALL"
    server.send(command("DISCARD ALL"))
    assert second.take() == b"", "the DISCARD ALL's replies are the pooler's"
    server.send(select_one())
    assert second.take() == select_one() and server.state is ServerState.IDLE


def test_a_client_that_loaded_a_library_takes_its_server_down(fake_pooler: Any) -> None:
    """LOAD cannot be undone by any reset: the server is not handed on."""
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("LOAD 'auto_explain'"))
    server.take()
    server.send(command("LOAD"))
    client.take()
    assert server.state is ServerState.ACTIVE, "pinned while its client stays"
    client.leave()
    assert server.closed() == m.terminate()
    assert net.pool().server_count == 0


def test_a_waiting_client_gets_a_new_server_when_the_busy_one_dies(fake_pooler: Any) -> None:
    """A server that dies under one client: that client is told, and the client queued
    behind it is served by a server the pool opens in its place."""
    net = fake_pooler()
    first, server = net.client_with_server()
    second = net.connect()
    first.send(m.query("SELECT 1"))
    second.send(m.query("SELECT 2"))
    assert second.state is ClientState.WAITING
    server.lose()
    assert first.state is ClientState.CLOSED
    (fresh,) = net.open_servers()
    assert query_texts(fresh.take()) == ["SELECT 2"] and second.state is ClientState.ACTIVE
    assert net.pooler.servers_per_db[net.pool().database] == 1, "the dead one uncounted"
