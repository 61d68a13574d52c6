"""pooler/janitor.py: the timeouts and pool sizes enforced by `sweep`, with the fake clock
moved by hand (tests/net/fakes.py)."""

from __future__ import annotations

from typing import Any

import pytest

from pypool.core.states import ClientState, ServerState
from pypool.pooler import janitor
from pypool.protocol import messages as m
from pypool.settings import DatabaseEntry, UserEntry
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


def test_query_timeout_counts_the_wait_for_a_server(fake_pooler: Any) -> None:
    """As PgBouncer: a query's time runs while it waits; refused before it ran."""
    net = fake_pooler(query_timeout=3, query_wait_timeout=0, query_wait_notify=0)
    _, waiter, server = waiting_client(net)
    net.clock.advance(3.1)
    janitor.sweep(net.pooler)
    (error,) = errors_in(waiter.take())
    assert error["M"] == "query_timeout" and waiter.state is ClientState.CLOSED
    assert m.query("SELECT 1") not in server.take(), "it never reached a server"
    assert net.pool().stats.errors["query_timeout"] == 2, "and the running query's"


@pytest.mark.parametrize(("users_value", "expired"), [(2.0, True), (0.0, False)])
def test_a_users_query_wait_timeout_wins_over_the_global_one(
        fake_pooler: Any, users_value: float, expired: bool) -> None:
    """[users] query_wait_timeout (PgBouncer 1.26) over [pgbouncer]'s; 0 turns it off for
    that user."""
    net = fake_pooler(query_wait_timeout=60, query_wait_notify=0,
                      users={"app": UserEntry(name="app", query_wait_timeout=users_value)})
    _, waiter, _ = waiting_client(net)
    net.clock.advance(2.5)
    janitor.sweep(net.pooler)
    assert (waiter.state is ClientState.CLOSED) is expired
    net.clock.advance(60)
    janitor.sweep(net.pooler)
    assert (waiter.state is ClientState.WAITING) is not expired, "0: no limit for that user"


def test_pool_idle_timeout_forgets_a_pool_nobody_uses(fake_pooler: Any) -> None:
    """PgBouncer 1.26: no client and no server for longer than pool_idle_timeout."""
    net = fake_pooler(pool_idle_timeout=30, server_idle_timeout=10)
    client, server = net.client_with_server()
    client.send(m.terminate())
    janitor.sweep(net.pooler)
    net.clock.advance(11)
    janitor.sweep(net.pooler)  # server_idle_timeout closes the server
    assert server.closed().endswith(m.terminate())
    janitor.sweep(net.pooler)  # unused from now on
    assert ("app", "app") in net.pooler.pools
    net.clock.advance(31)
    janitor.sweep(net.pooler)
    assert ("app", "app") not in net.pooler.pools
    again = net.connect()
    again.send(m.query("SELECT 1"))
    (fresh,) = net.open_servers()
    assert m.query("SELECT 1") in fresh.take() and again.state is ClientState.ACTIVE


@pytest.mark.parametrize("forced", [True, False])
def test_pool_idle_timeout_keeps_only_a_forced_users_min_pool(fake_pooler: Any,
                                                              forced: bool) -> None:
    """As PgBouncer 1.26: a pool whose servers the janitor opens without any client (a
    forced user and min_pool_size) is kept while those logins fail; any other unused pool
    goes, min_pool_size or not (its servers are kept only while a client is there)."""
    entry = DatabaseEntry(name="app", min_pool_size=2, user="app" if forced else "")
    net = fake_pooler(pool_idle_timeout=30, server_login_retry=60, databases={"app": entry})
    net.connect().leave()
    janitor.sweep(net.pooler)
    refused = m.error_response("no such user", "28000", "FATAL")
    assert net.fail_logins(refused), "min_pool_size opened servers"
    assert net.pool().unused()
    janitor.sweep(net.pooler)
    net.clock.advance(31)
    janitor.sweep(net.pooler)
    assert (("app", "app") in net.pooler.pools) is forced


def test_a_removed_databases_pool_closes_once_its_last_client_leaves(
        fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    net.pool().removed = True  # what a reload without the database does (pooler/lifecycle.py)
    janitor.sweep(net.pooler)
    assert not server.transport.closed, "its client may still need it"
    client.send(m.terminate())
    janitor.sweep(net.pooler)
    assert server.closed() == m.terminate()
    assert ("app", "app") not in net.pooler.pools


def test_a_users_query_timeout_of_zero_turns_it_off_for_that_user(fake_pooler: Any) -> None:
    net = fake_pooler(query_timeout=3, query_wait_timeout=0, query_wait_notify=0,
                      users={"app": UserEntry(name="app", query_timeout=0)})
    busy, waiter, _ = waiting_client(net)
    net.clock.advance(10)
    janitor.sweep(net.pooler)
    assert waiter.state is ClientState.WAITING and busy.state is ClientState.ACTIVE
    assert "query_timeout" not in net.pool().stats.errors
