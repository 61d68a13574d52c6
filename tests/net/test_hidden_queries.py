"""net/hidden_queries.py: the pooler's own queries on a server (the SET of a client's
parameters, the reset query, connect_query), whose replies no client sees, over fake
transports (tests/net/fakes.py)."""

from __future__ import annotations

from typing import Any

import pytest

from pypool.core.states import ClientState, ServerState
from pypool.protocol import messages as m
from pypool.settings import DatabaseEntry
from tests.net.fakes import command, errors_in, query_texts, select_one

pytestmark = pytest.mark.timeout(10)


def set_reply(name: str, value: str) -> bytes:
    """PostgreSQL's answer to a SET that changed a reported parameter."""
    return m.command_complete("SET") + m.parameter_status(name, value) + m.ready_for_query()


def test_a_clients_parameters_are_set_before_its_query(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server(TimeZone="Europe/Paris")
    assert m.parameter_status("TimeZone", "Europe/Paris") in client.welcome
    client.send(m.query("SELECT now()"))
    (sent,) = query_texts(server.take())
    assert "timezone" in sent.lower() and "Europe/Paris" in sent
    server.send(set_reply("TimeZone", "Europe/Paris"))
    assert query_texts(server.take()) == ["SELECT now()"], "the query goes once the SET is in"
    assert client.take() == b"", "the SET's replies are the pooler's"
    server.send(select_one())
    assert client.take() == select_one()


def test_a_server_already_set_so_gets_no_second_set(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server(TimeZone="Europe/Paris")
    client.send(m.query("SELECT 1"))
    server.take()
    server.send(set_reply("TimeZone", "Europe/Paris"))
    server.take()
    server.send(select_one())
    client.send(m.query("SELECT 2"))
    assert query_texts(server.take()) == ["SELECT 2"]


def test_a_failed_set_drops_the_client_with_the_servers_reason(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server(TimeZone="Nowhere/Atlantis")
    client.send(m.query("SELECT now()"))
    server.take()
    server.send(m.error_response('invalid value for parameter "TimeZone"', "22023")
                + m.ready_for_query())
    (error,) = errors_in(client.take())
    assert error["C"] == "22023" and error["S"] == "FATAL"
    assert error["M"] == ('could not set session parameters on the server: '
                          'invalid value for parameter "TimeZone"')
    assert client.state is ClientState.CLOSED
    assert server.closed() == m.terminate(), "the query never ran, the server goes"
    assert net.pool().server_count == 0


def test_the_reset_query_always_runs_after_each_transaction(fake_pooler: Any) -> None:
    net = fake_pooler(server_reset_query_always=True)
    client, server = net.client_with_server()
    client.send(m.query("SELECT 1"))
    server.take()
    server.send(select_one())
    assert query_texts(server.take()) == ["DISCARD ALL"]
    assert client.take() == select_one()
    client.send(m.query("SELECT 2"))
    assert query_texts(server.take()) == ["SELECT 2"]
    server.send(command("DISCARD ALL") + select_one())
    assert client.take() == select_one(), "the reset's replies are dropped"


def test_in_session_mode_a_clean_leave_resets_the_server_for_the_next(
        fake_pooler: Any) -> None:
    net = fake_pooler(pool_mode="session")
    client, server = net.client_with_server()
    client.send(m.query("SELECT 1"))
    server.take()
    server.send(select_one())
    client.send(m.terminate())
    assert query_texts(server.take()) == ["DISCARD ALL"]
    assert server.state is ServerState.IDLE and net.pool().idle == [server.conn]
    later = net.connect()
    later.send(m.query("SELECT 2"))
    assert query_texts(server.take()) == ["SELECT 2"], "queued behind the reset, on the wire"
    server.send(command("DISCARD ALL") + select_one())
    assert later.take() == select_one(), "the reset's replies are dropped"


def test_connect_query_runs_before_the_first_client(fake_pooler: Any) -> None:
    net = fake_pooler(databases={"app": DatabaseEntry(name="app",
                                                      connect_query="SET jit = off")})
    client = net.connect()
    (server,) = net.open_servers()
    client.take()
    assert query_texts(server.take()) == ["SET jit = off"]
    client.send(m.query("SELECT 1"))
    server.send(command("SET"))
    assert query_texts(server.take()) == ["SELECT 1"]
    server.send(select_one())
    assert client.take() == select_one()
