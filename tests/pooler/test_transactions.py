"""pooler/transactions.py: what each ReadyForQuery means for the client's server, over fake
transports (tests/net/fakes.py)."""

from __future__ import annotations

from typing import Any

import pytest

from pypool.core.states import ClientState, ServerState
from pypool.pooler import janitor
from pypool.protocol import messages as m
from tests.net.fakes import command, errors_in, kinds, query_texts, select_one, server_error

pytestmark = pytest.mark.timeout(10)


def parse(sql: str, name: bytes = b"") -> bytes:
    return m.message(m.PARSE, name + b"\x00" + sql.encode() + b"\x00\x00\x00")


def bind(statement: bytes = b"") -> bytes:
    return m.message(m.BIND, b"\x00" + statement + b"\x00\x00\x00\x00\x00\x00\x00")


def extended_select() -> bytes:
    """One extended-protocol transaction: Parse, Bind, Execute, Sync of SELECT 1."""
    return parse("SELECT 1") + bind() + m.execute() + m.sync()


def extended_replies(status: int = m.TX_IDLE) -> bytes:
    return (m.parse_complete() + m.message(ord("2")) + m.data_row(["1"])
            + m.command_complete("SELECT 1") + m.ready_for_query(status))


def test_counts_queries_and_one_transaction_for_a_block(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    for sql, reply in (("BEGIN", command("BEGIN", m.TX_IN_BLOCK)),
                       ("SELECT 1", select_one(m.TX_IN_BLOCK)),
                       ("COMMIT", command("COMMIT"))):
        client.send(m.query(sql))
        server.send(reply)
    stats = net.pool().stats
    assert (stats.query_count, stats.xact_count) == (3, 1)
    assert net.pool().idle == [server.conn]


def test_an_extended_protocol_transaction_releases_at_its_sync(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(extended_select())
    assert kinds(server.take()) == "PBES"
    server.send(extended_replies())
    assert kinds(client.take()) == "12DCZ"
    assert client.state is ClientState.IDLE and net.pool().idle == [server.conn]


def test_two_queries_sent_at_once_keep_the_server_until_the_second_reply(
        fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("SELECT 1") + m.query("SELECT 2"))
    assert query_texts(server.take()) == ["SELECT 1", "SELECT 2"]
    server.send(select_one())
    assert server.state is ServerState.ACTIVE and net.pool().idle == [], "one reply still owed"
    server.send(select_one())
    assert server.state is ServerState.IDLE and net.pool().stats.xact_count == 1


def test_a_ready_for_query_cut_in_pieces_releases_only_when_whole(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("SELECT 1"))
    reply = select_one()
    for byte in range(len(reply) - 1):
        server.send(reply[byte:byte + 1])
    assert server.state is ServerState.ACTIVE
    server.send(reply[-1:])
    assert client.take() == reply and server.state is ServerState.IDLE


def test_a_failed_transaction_block_keeps_its_server(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("BEGIN"))
    server.send(command("BEGIN", m.TX_IN_BLOCK))
    client.send(m.query("SELECT 1/0"))
    server.send(server_error("division by zero", "22012", m.TX_FAILED))
    assert errors_in(client.take())[0]["C"] == "22012"
    assert server.state is ServerState.ACTIVE and net.pool().idle == []
    client.send(m.query("ROLLBACK"))
    server.send(command("ROLLBACK"))
    assert server.state is ServerState.IDLE


def test_session_mode_keeps_the_server_between_transactions(fake_pooler: Any) -> None:
    net = fake_pooler(pool_mode="session")
    client, server = net.client_with_server()
    client.send(m.query("SELECT 1"))
    server.send(select_one())
    assert client.state is ClientState.ACTIVE and server.state is ServerState.ACTIVE
    assert net.pool().idle == [] and net.pool().stats.xact_count == 1
    other = net.connect()
    other.send(m.query("SELECT 2"))
    assert other.state is ClientState.WAITING, "the server is the first client's session's"


def test_statement_mode_refuses_a_transaction_block(fake_pooler: Any) -> None:
    net = fake_pooler(pool_mode="statement")
    client, server = net.client_with_server()
    client.send(m.query("BEGIN"))
    server.take()
    server.send(command("BEGIN", m.TX_IN_BLOCK))
    (error,) = errors_in(client.take())
    assert error["M"] == "transaction blocks not allowed in statement pooling mode"
    assert client.state is ClientState.CLOSED and client.transport.closed
    assert server.closed() == m.terminate(), "its open transaction is rolled back by closing"
    assert net.pool().idle == []


def test_a_listen_pins_the_client_to_its_server_with_a_notice(fake_pooler: Any) -> None:
    net = fake_pooler(listen_mode="pin")  # shared, the default, pins nothing
    client, server = net.client_with_server()
    client.send(m.query("LISTEN news"))
    server.send(command("LISTEN"))
    received = client.take()
    assert received.startswith(command("LISTEN")) and kinds(received) == "CZN"
    assert b"keeps its server until the session state is gone" in received
    assert server.state is ServerState.ACTIVE and net.pool().stats.session_pinned == 1
    client.send(m.query("UNLISTEN *"))
    server.send(command("UNLISTEN"))
    assert server.state is ServerState.IDLE and net.pool().idle == [server.conn]


def test_session_state_reject_refuses_a_session_statement(fake_pooler: Any) -> None:
    net = fake_pooler(session_state="reject")
    client, server = net.client_with_server()
    client.send(m.query("LISTEN news"))
    (sent,) = query_texts(server.take())
    assert "LISTEN news" not in sent and "LISTEN is not allowed" in sent, \
        "in its place, a statement that raises the refusal in its turn"
    assert net.pool().stats.session_refused == 1
    server.send(server_error("LISTEN is not allowed in transaction pooling mode", "0A000"))
    assert errors_in(client.take())[0]["C"] == "0A000"
    assert server.state is ServerState.IDLE, "nothing pins it"


def test_a_set_follows_the_client_to_its_next_server(fake_pooler: Any) -> None:
    net = fake_pooler(default_pool_size=2)
    client, server = net.client_with_server()
    client.send(m.query("SET search_path = s1"))
    assert query_texts(server.take()) == ["SET search_path = s1"]
    server.send(command("SET"))
    assert server.state is ServerState.IDLE, "a SET that follows its client does not pin"
    other = net.connect()
    other.send(m.query("BEGIN"))  # takes the server that holds the SET
    assert other.state is ClientState.ACTIVE
    assert query_texts(server.take()) == ["RESET search_path"], "undone before its BEGIN"
    server.send(command("RESET"))
    assert query_texts(server.take()) == ["BEGIN"] and other.take() == b""
    assert net.pool().stats.session_synced == 1


def test_a_copy_from_stdin_keeps_the_server_until_its_ready_for_query(fake_pooler: Any) -> None:
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query("COPY t FROM STDIN"))
    server.send(m.message(ord("G"), b"\x00\x00\x01\x00\x00"))  # CopyInResponse, one column
    copy_data = m.message(m.COPY_DATA, b"1\n") + m.message(m.COPY_DATA, b"2\n")
    client.send(copy_data, m.message(m.COPY_DONE))
    assert server.take() == m.query("COPY t FROM STDIN") + copy_data + m.message(m.COPY_DONE)
    assert server.state is ServerState.ACTIVE
    server.send(command("COPY 2"))
    assert kinds(client.take()) == "GCZ"
    assert server.state is ServerState.IDLE and net.pool().stats.xact_count == 1


def copy_failing_mid_message(net: Any) -> tuple[Any, Any, Any, bytes]:
    """A client whose simple COPY fails (ErrorResponse, ReadyForQuery) while the server has
    the start of its next CopyData and the rest is still to come; another client waits for
    the pool's one server. Returns the two clients, the server, and that rest."""
    client, server = net.client_with_server()
    other = net.connect()
    client.send(m.query("COPY t FROM STDIN"))
    server.send(m.message(ord("G"), b"\x00\x00\x00"))
    row = m.message(m.COPY_DATA, b"x" * 1000)
    client.send(row[:300])
    assert len(server.take()) == len(m.query("COPY t FROM STDIN")) + 300, "streamed"
    server.send(server_error("invalid input syntax", "22P02"))
    assert kinds(client.take()) == "GEZ"
    other.send(m.query("SELECT 1"))
    return client, other, server, row[300:]


def test_a_copy_that_fails_mid_message_keeps_its_server_until_that_message_ends(
        fake_pooler: Any) -> None:
    """PostgreSQL reads the rest of the CopyData whose start it has (and ignores it) before
    anything else: handed on at the ReadyForQuery, the next client's query would be read as
    that rest. The server stays with its client until the message is whole."""
    net = fake_pooler(default_pool_size=1)
    client, other, server, rest = copy_failing_mid_message(net)
    assert other.state is ClientState.WAITING and server.take() == b"", "not handed on yet"
    client.send(rest[:200])
    assert server.take() == rest[:200] and other.state is ClientState.WAITING
    client.send(rest[200:], m.message(m.COPY_DONE))  # the CopyDone: a stray, dropped
    assert server.take() == rest[200:] + m.query("SELECT 1"), "the rest, then the next"
    assert client.state is ClientState.IDLE and other.state is ClientState.ACTIVE
    server.send(select_one())
    assert kinds(other.take()) == "TDCZ"
    assert net.pool().stats.xact_count == 2


def test_a_client_gone_in_the_middle_of_a_message_leaves_its_server_closed(
        fake_pooler: Any) -> None:
    """The same, but the client leaves before the rest is sent: the backend would take the
    next client's bytes for it, so the server is closed, not handed on."""
    net = fake_pooler(default_pool_size=1)
    client, other, server, _ = copy_failing_mid_message(net)
    client.leave()
    assert server.closed().endswith(m.terminate())
    (fresh,) = net.open_servers()
    assert m.query("SELECT 1") in fresh.take() and other.state is ClientState.ACTIVE


def test_query_timeout_ends_a_client_that_stops_in_the_middle_of_a_message(
        fake_pooler: Any) -> None:
    """The server waits for the rest of the message; a client that never sends it is ended
    by query_timeout, as one whose query runs too long, and its server closed."""
    net = fake_pooler(default_pool_size=1, query_timeout=30)
    client, other, server, _ = copy_failing_mid_message(net)
    net.clock.advance(29)
    janitor.sweep(net.pooler)
    assert client.state is ClientState.ACTIVE and other.state is ClientState.WAITING
    net.clock.advance(2)
    janitor.sweep(net.pooler)
    assert client.state is ClientState.CLOSED and server.transport.closed
    assert errors_in(client.take())[0]["M"] == "query timeout"


def test_a_set_in_flight_counts_as_made_on_its_server_until_its_reply(
        fake_pooler: Any) -> None:
    """The server's record of the settings clients made there (ServerRecord.session_sets,
    None while it holds none) marks a SET unsure as soon as it is sent: were the link to end
    before its reply, the next client would find it undone."""
    net = fake_pooler(default_pool_size=1)
    client, server = net.client_with_server()
    assert server.conn.session_sets is None
    client.send(m.query("BEGIN"))
    server.send(command("BEGIN", m.TX_IN_BLOCK))
    client.send(m.query("SET search_path = s1"))
    assert server.conn.session_sets == {b"search_path": None}, "unsure until it is over"
    server.send(command("SET", m.TX_IN_BLOCK))
    client.send(m.query("COMMIT"))
    server.send(command("COMMIT"))
    assert server.conn.session_sets == {b"search_path": b"SET search_path = s1"}
