"""pooler/cancel.py: a CancelRequest forwarded to the server its client holds, over fake
transports (tests/net/fakes.py) and a fake connection to PostgreSQL's cancel port."""

from __future__ import annotations

from typing import Any

import pytest

from pypool.core.states import ClientState, ServerState
from pypool.pooler import cancel
from pypool.protocol import messages as m
from tests.net.fakes import FakePooler, command, select_one

pytestmark = pytest.mark.timeout(10)


class CancelPort:
    """asyncio.open_connection to PostgreSQL, faked: records where the cancel went and what
    it said; PostgreSQL closes the connection once it has signalled the backend, or the
    connect fails with `failure`."""

    def __init__(self, failure: Exception | None = None) -> None:
        self.sent: list[tuple[str, int, bytes]] = []
        self.failure = failure

    async def open_connection(self, host: str, port: int) -> tuple[Any, Any]:
        if self.failure is not None:
            raise self.failure
        port_ = self

        class Reader:
            async def read(self) -> bytes:
                return b""

        class Writer:
            def write(self, data: bytes) -> None:
                port_.sent.append((host, port, data))

            async def drain(self) -> None:
                pass

            def close(self) -> None:
                pass

        return Reader(), Writer()


@pytest.fixture
def cancel_port(monkeypatch: pytest.MonkeyPatch) -> CancelPort:
    """PostgreSQL's side of a cancel connection (no socket is opened)."""
    port = CancelPort()
    monkeypatch.setattr(cancel.asyncio, "open_connection", port.open_connection)
    return port


def run_spawned(net: FakePooler) -> int:
    """Run the coroutines the pooler spawned (the cancels); how many there were."""
    spawned, net.spawned[:] = list(net.spawned), []
    for coro in spawned:
        net.loop.run_until_complete(coro)
    return len(spawned)


def test_a_cancel_goes_to_the_server_its_client_holds(fake_pooler: Any,
                                                     cancel_port: CancelPort) -> None:
    net = fake_pooler(default_pool_size=2)
    first, one = net.client_with_server()
    second = net.connect()
    first.send(m.query("SELECT pg_sleep(60)"))
    second.send(m.query("SELECT pg_sleep(61)"))
    (two,) = net.open_servers()
    asked = net.cancel(second.cancel_key)
    assert asked.closed and asked.take() == b"", "the cancel connection gets no reply"
    assert run_spawned(net) == 1
    assert cancel_port.sent == [("127.0.0.1", 5432, m.cancel_request(*two.backend_key))]
    assert two.backend_key != one.backend_key


def test_a_cancel_with_an_unknown_key_goes_nowhere(fake_pooler: Any,
                                                  cancel_port: CancelPort) -> None:
    net = fake_pooler()
    client, _ = net.client_with_server()
    client.send(m.query("SELECT pg_sleep(60)"))
    pid, secret = client.cancel_key
    net.cancel((pid, secret ^ 1))
    assert run_spawned(net) == 0 and cancel_port.sent == []


def test_a_cancel_from_a_client_without_a_server_goes_nowhere(fake_pooler: Any,
                                                             cancel_port: CancelPort) -> None:
    net = fake_pooler()
    client, _ = net.client_with_server()
    net.cancel(client.cancel_key)
    assert run_spawned(net) == 0 and cancel_port.sent == []


def test_a_server_is_handed_to_no_one_while_its_cancel_is_on_its_way(
        fake_pooler: Any, cancel_port: CancelPort) -> None:
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
    run_spawned(net)  # PostgreSQL took the cancel
    assert waiter.state is ClientState.ACTIVE and server.take() == m.query("SELECT 2")


def test_a_server_whose_cancel_did_not_complete_is_closed(fake_pooler: Any,
                                                         cancel_port: CancelPort) -> None:
    net = fake_pooler()
    cancel_port.failure = ConnectionRefusedError("refused")
    client, server = net.client_with_server()
    client.send(m.query("SELECT pg_sleep(60)"))
    net.cancel(client.cancel_key)
    server.send(select_one())
    assert client.state is ClientState.IDLE and net.pool().idle == []
    run_spawned(net)
    assert server.transport.closed, "never handed on: the cancel may still land"
    server.closed()
    assert net.pool().server_count == 0


def test_a_cancel_during_a_transaction_block_keeps_the_link(fake_pooler: Any,
                                                           cancel_port: CancelPort) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("BEGIN"))
    server.send(command("BEGIN", m.TX_IN_BLOCK))
    client.send(m.query("SELECT pg_sleep(60)"))
    net.cancel(client.cancel_key)
    run_spawned(net)
    assert cancel_port.sent[0][2] == m.cancel_request(*server.backend_key)
    server.send(m.error_response("canceling statement", "57014") + m.ready_for_query(m.TX_FAILED))
    assert client.state is ClientState.ACTIVE and server.state is ServerState.ACTIVE
