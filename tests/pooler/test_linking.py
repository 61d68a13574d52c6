"""pooler/linking.py: which client gets which server, and when a server comes back, over fake
transports (tests/net/fakes.py)."""

from __future__ import annotations

from typing import Any

import pytest

from pypool.core.states import ClientState, IllegalTransition, ServerState
from pypool.pooler import janitor, linking
from pypool.protocol import messages as m
from pypool.settings import DatabaseEntry
from tests.net.fakes import command, errors_in, kinds, query_texts, select_one

pytestmark = pytest.mark.timeout(10)


def test_a_query_goes_to_the_idle_server_and_its_replies_come_back(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("SELECT 1"))
    assert server.take() == m.query("SELECT 1")
    assert client.state is ClientState.ACTIVE and server.state is ServerState.ACTIVE
    server.send(select_one())
    assert client.take() == select_one()


def test_the_server_goes_back_to_the_pool_at_ready_for_query_idle(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("SELECT 1"))
    assert net.pool().idle == [] and server.conn in net.pool().active
    server.send(select_one())
    pool = net.pool()
    assert client.state is ClientState.IDLE and server.state is ServerState.IDLE
    assert pool.idle == [server.conn] and not pool.active
    assert pool.stats.xact_count == 1 and pool.stats.server_assignment_count == 1


def test_a_server_inside_a_transaction_block_stays_linked(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("BEGIN"))
    server.send(command("BEGIN", m.TX_IN_BLOCK))
    assert client.state is ClientState.ACTIVE and server.state is ServerState.ACTIVE
    assert net.pool().idle == [] and net.pool().stats.xact_count == 0
    client.send(m.query("COMMIT"))
    assert query_texts(server.take()) == ["BEGIN", "COMMIT"]
    server.send(command("COMMIT"))
    assert client.state is ClientState.IDLE and net.pool().idle == [server.conn]
    assert net.pool().stats.xact_count == 1


def test_a_second_client_waits_for_the_busy_server_and_gets_it_at_release(
        fake_pooler: Any) -> None:
    net = fake_pooler()
    first, server = net.client_with_server()
    second = net.connect()
    first.send(m.query("SELECT 1"))
    second.send(m.query("SELECT 2"))
    assert second.state is ClientState.WAITING and list(net.pool().waiting) == [second.conn]
    assert query_texts(server.take()) == ["SELECT 1"], "the waiter's query is not sent yet"
    net.clock.advance(0.5)
    server.send(select_one())
    assert first.state is ClientState.IDLE and second.state is ClientState.ACTIVE
    assert query_texts(server.take()) == ["SELECT 2"]
    assert not net.pool().waiting and net.pool().stats.wait_time_us == 500_000
    server.send(select_one())
    assert second.take() == select_one() and first.take() == select_one()


def test_a_server_handed_on_stays_active_and_is_never_linked_while_it_serves(
        fake_pooler: Any) -> None:
    net = fake_pooler()
    first, server = net.client_with_server()
    second, third = net.connect(), net.connect()
    first.send(m.query("SELECT 1"))
    second.send(m.query("SELECT 2"))
    server.send(select_one())
    # Handed straight from the first client to the second: ACTIVE throughout, listed active.
    assert server.state is ServerState.ACTIVE and server.conn.client is second.conn
    assert net.pool().idle == [] and server.conn in net.pool().active
    assert net.pool().idle_out_of_step() == []
    with pytest.raises(IllegalTransition):
        linking.link(net.pooler, third.conn, server.conn)
    assert server.conn.client is second.conn and third.conn.server is None
    server.send(select_one())
    assert second.take() == select_one()
    assert server.state is ServerState.IDLE and net.pool().idle == [server.conn]


@pytest.mark.parametrize("metrics_port", [0, 9127])
def test_the_time_histograms_are_kept_only_for_the_metrics_endpoint(
        fake_pooler: Any, metrics_port: int) -> None:
    """/metrics is their one reader: without metrics_port no transaction counts into them,
    while SHOW STATS's totals are kept either way. (The fakes start no listener.)"""
    net = fake_pooler(metrics_port=metrics_port)
    first, server = net.client_with_server()
    second = net.connect()
    first.send(m.query("SELECT 1"))
    second.send(m.query("SELECT 2"))
    net.clock.advance(0.5)
    server.send(select_one())
    server.send(select_one())
    stats = net.pool().stats
    assert stats.wait_time_us == 500_000 and stats.xact_count == 2
    assert sum(stats.wait_counts) == (1 if metrics_port else 0)
    assert sum(stats.xact_counts) == (2 if metrics_port else 0)


def test_waiting_clients_are_served_first_come_first_served(fake_pooler: Any) -> None:
    net = fake_pooler()
    first, server = net.client_with_server()
    waiters = [net.connect() for _ in range(3)]
    first.send(m.query("SELECT 0"))
    for number, waiter in enumerate(waiters, 1):
        waiter.send(m.query(f"SELECT {number}"))
    served = []
    for _ in range(4):
        served += query_texts(server.take())
        server.send(select_one())
    assert served == ["SELECT 0", "SELECT 1", "SELECT 2", "SELECT 3"]
    assert all(waiter.take() == select_one() for waiter in waiters)


def test_a_client_needing_a_server_opens_one_up_to_pool_size(fake_pooler: Any) -> None:
    net = fake_pooler(default_pool_size=2)
    first, server = net.client_with_server()
    second = net.connect()
    first.send(m.query("SELECT 1"))
    second.send(m.query("SELECT 2"))
    assert second.state is ClientState.WAITING
    (opened,) = net.open_servers()  # the pool opened a second server for it
    assert second.state is ClientState.ACTIVE
    assert query_texts(opened.take()) == ["SELECT 2"]
    third = net.connect()
    third.send(m.query("SELECT 3"))
    assert third.state is ClientState.WAITING and net.opening() == [], "pool_size reached"
    assert net.pool().server_count == 2


def test_a_new_client_is_welcomed_once_the_pools_first_server_has_logged_in(
        fake_pooler: Any) -> None:
    net = fake_pooler()
    client = net.connect()
    assert client.state is ClientState.WELCOME and client.take() == b""
    net.open_servers(TimeZone="Europe/Paris")
    assert client.state is ClientState.IDLE and client.take() == b""
    assert kinds(client.welcome)[0] == "R" and kinds(client.welcome).endswith("KZ")
    assert m.parameter_status("TimeZone", "Europe/Paris") in client.welcome


def test_a_waiting_client_that_leaves_is_forgotten(fake_pooler: Any) -> None:
    net = fake_pooler()
    first, server = net.client_with_server()
    second = net.connect()
    first.send(m.query("SELECT 1"))
    second.send(m.query("SELECT 2"))
    second.leave()
    assert second.state is ClientState.CLOSED and not net.pool().waiting
    server.send(select_one())
    assert net.pool().idle == [server.conn] and server.take() == m.query("SELECT 1")


def test_server_check_query_runs_before_a_used_server_serves_again(fake_pooler: Any) -> None:
    net = fake_pooler(server_check_query="SELECT 42", server_check_delay=10)
    client, server = net.client_with_server()
    client.send(m.query("SELECT 1"))  # fresh from its login: no check
    assert query_texts(server.take()) == ["SELECT 1"]
    server.send(select_one())
    client.take()
    net.clock.advance(11)
    client.send(m.query("SELECT 2"))
    assert query_texts(server.take()) == ["SELECT 42"], "the client's query waits for the check"
    server.send(select_one())
    assert query_texts(server.take()) == ["SELECT 2"]
    assert client.take() == b"", "the check's replies are the pooler's"
    server.send(select_one())
    assert client.take() == select_one()


def test_a_failed_check_closes_the_server_and_the_client_gets_another(
        fake_pooler: Any) -> None:
    net = fake_pooler(server_check_query="SELECT 42", server_check_delay=10)
    client, server = net.client_with_server()
    client.send(m.query("SELECT 1"))
    server.send(select_one())
    client.take()
    net.clock.advance(11)
    client.send(m.query("SELECT 2"))
    server.take()
    server.send(m.error_response("boom", "XX000") + m.ready_for_query())
    assert server.closed() == m.terminate() and server.conn not in net.pool().idle
    assert client.take() == b"" and client.state is ClientState.WAITING
    (fresh,) = net.open_servers()
    assert query_texts(fresh.take()) == ["SELECT 2"]
    assert net.pool().stats.errors.get("server_check_failed") == 1


def test_a_server_past_its_lifetime_closes_at_release(fake_pooler: Any) -> None:
    net = fake_pooler(server_lifetime=60)
    client, server = net.client_with_server()
    client.send(m.query("SELECT 1"))
    server.take()
    net.clock.advance(61)
    server.send(select_one())
    assert client.take() == select_one() and client.state is ClientState.IDLE
    assert server.closed() == m.terminate()
    assert net.pool().idle == [] and net.pool().server_count == 0


def test_a_paused_pool_queues_clients_until_resumed(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    net.pooler.pause_all(True)
    assert server.closed() == m.terminate(), "PAUSE closes idle servers"
    client.send(m.query("SELECT 1"))
    assert client.state is ClientState.WAITING and net.opening() == []
    net.pooler.pause_all(False)
    (fresh,) = net.open_servers()
    assert client.state is ClientState.ACTIVE
    assert query_texts(fresh.take()) == ["SELECT 1"]


def test_each_database_has_its_own_pool_and_servers(fake_pooler: Any) -> None:
    net = fake_pooler(databases={"app": DatabaseEntry(name="app"),
                                 "other": DatabaseEntry(name="other", dbname="app")})
    app, app_server = net.client_with_server()
    other = net.connect(database="other")
    (other_server,) = net.open_servers()
    other.take()
    app.send(m.query("SELECT 'app'"))
    other.send(m.query("SELECT 'other'"))
    assert query_texts(app_server.take()) == ["SELECT 'app'"]
    assert query_texts(other_server.take()) == ["SELECT 'other'"]
    assert net.pool("other").server_count == 1 and net.pool().server_count == 1


def test_the_reserve_pool_opens_once_a_client_has_waited_reserve_pool_timeout(
        fake_pooler: Any) -> None:
    net = fake_pooler(reserve_pool_size=1, reserve_pool_timeout=2)
    busy, server = net.client_with_server()
    waiter = net.connect()
    busy.send(m.query("SELECT pg_sleep(60)"))
    waiter.send(m.query("SELECT 1"))
    assert net.opening() == [], "pool_size reached: no reserve yet"
    net.clock.advance(2.5)
    janitor.sweep(net.pooler)
    (reserve,) = net.open_servers()
    assert waiter.state is ClientState.ACTIVE and reserve.take() == m.query("SELECT 1")


def test_max_db_connections_evicts_another_pools_idle_server(fake_pooler: Any) -> None:
    net = fake_pooler(max_db_connections=1, default_pool_size=2)
    app, server = net.client_with_server()
    other = net.connect(user="other")
    assert other.state is ClientState.WELCOME
    assert server.closed() == m.terminate(), "the idle server of app/app makes room"
    (fresh,) = net.open_servers()
    assert other.take() == b"" and other.state is ClientState.IDLE
    assert fresh.conn.pool is net.pool(user="other")


def test_a_sigint_shutdown_lets_the_transaction_finish_then_tells_its_client(
        fake_pooler: Any) -> None:
    net = fake_pooler()
    busy, server = net.client_with_server()
    idle = net.connect()
    busy.send(m.query("BEGIN"))
    server.send(command("BEGIN", m.TX_IN_BLOCK))
    busy.take()
    server.take()
    net.pooler.shutdown("SIGINT")
    idle.send(m.query("SELECT 1"))
    (refused,) = errors_in(idle.take())
    assert (refused["C"], refused["M"]) == ("57P01", "server shutting down")
    busy.send(m.query("COMMIT"))
    assert query_texts(server.take()) == ["COMMIT"], "its transaction runs to its end"
    server.send(command("COMMIT"))
    received = busy.take()
    assert received.startswith(command("COMMIT"))
    assert errors_in(received)[0]["M"] == "server shutting down"
    assert busy.state is ClientState.CLOSED and server.transport.closed
    assert net.pooler.stopped.done()


def test_while_clients_are_passed_on_each_is_paused_at_its_release(fake_pooler: Any) -> None:
    """An online restart (pooler/takeover.py): once the old process passes its clients on, a
    busy client stops being read the moment its server is released, before its next
    transaction can arrive; not inside a transaction, and not when no restart is under way."""
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("SELECT 1"))
    server.send(select_one())
    assert client.state is ClientState.IDLE and client.transport.reading  # no restart
    net.pooler.passing_clients = True
    client.send(m.query("BEGIN"))
    server.send(command("BEGIN", m.TX_IN_BLOCK))
    assert client.state is ClientState.ACTIVE and client.transport.reading  # mid-transaction
    client.send(m.query("COMMIT"))
    server.send(command("COMMIT"))
    assert client.state is ClientState.IDLE and not client.transport.reading
    assert net.pool().idle == [server.conn]
