"""net/pipeline.py: waiting clients' transactions queued on a busy server, with
pipeline_depth > 0, over fake transports (tests/net/fakes.py)."""

from __future__ import annotations

from typing import Any

import pytest

from pypool.core.states import ClientState, ServerState
from pypool.protocol import messages as m
from tests.net.fakes import (
    Client,
    FakePooler,
    Server,
    command,
    errors_in,
    kinds,
    query_texts,
    select_one,
)

pytestmark = pytest.mark.timeout(10)


def lined(net: FakePooler, followers: int) -> tuple[Client, list[Client], Server]:
    """A client running a one-statement transaction on the only server, and `followers`
    clients that send theirs meanwhile."""
    head, server = net.client_with_server()
    others = [net.connect() for _ in range(followers)]
    head.send(m.query("SELECT 0"))
    for number, other in enumerate(others, 1):
        other.send(m.query(f"SELECT {number}"))
    net.run_callbacks()  # the end of the loop's round: deferred writes go out
    return head, others, server


def reply(value: str) -> bytes:
    return (m.row_description([("x", 23)]) + m.data_row([value]) + m.command_complete("SELECT 1")
            + m.ready_for_query())


def test_a_waiting_clients_query_is_written_behind_the_running_one(fake_pooler: Any) -> None:
    net = fake_pooler(pipeline_depth=4, query_wait_timeout=0)
    head, (follower,), server = lined(net, 1)
    assert query_texts(server.take()) == ["SELECT 0", "SELECT 1"], "no round trip between"
    assert follower.state is ClientState.ACTIVE
    server.send(reply("0") + reply("1"))
    assert head.take() == reply("0") and follower.take() == reply("1"), "each its own replies"
    stats = net.pool().stats
    assert (stats.pipelined_count, stats.xact_count) == (1, 2)
    assert net.pool().idle == [server.conn]


def test_with_pipeline_depth_0_a_waiting_client_waits_for_the_release(
        fake_pooler: Any) -> None:
    net = fake_pooler(pipeline_depth=0, query_wait_timeout=0)
    head, (follower,), server = lined(net, 1)
    assert query_texts(server.take()) == ["SELECT 0"]
    assert follower.state is ClientState.WAITING
    server.send(reply("0"))
    assert query_texts(server.take()) == ["SELECT 1"]
    assert net.pool().stats.pipelined_count == 0


def test_the_requests_lined_in_one_round_leave_in_one_write(fake_pooler: Any) -> None:
    net = fake_pooler(pipeline_depth=4, query_wait_timeout=0)
    head, server = net.client_with_server()
    followers = [net.connect() for _ in range(3)]
    before = server.transport.writes
    head.send(m.query("SELECT 0"))
    for number, follower in enumerate(followers, 1):
        follower.send(m.query(f"SELECT {number}"))
    assert server.take() == b"", "deferred to the end of the loop's round"
    net.run_callbacks()
    assert query_texts(server.take()) == ["SELECT 0", "SELECT 1", "SELECT 2", "SELECT 3"]
    assert server.transport.writes == before + 1, "one write: the backend wakes once"


def test_the_line_is_no_longer_than_pipeline_depth(fake_pooler: Any) -> None:
    net = fake_pooler(pipeline_depth=2, query_wait_timeout=0)
    _, followers, server = lined(net, 3)
    assert query_texts(server.take()) == ["SELECT 0", "SELECT 1", "SELECT 2"]
    assert [f.state for f in followers] == [ClientState.ACTIVE, ClientState.ACTIVE,
                                            ClientState.WAITING]
    server.send(reply("0"))
    net.run_callbacks()
    assert query_texts(server.take()) == ["SELECT 3"], "topped up as the head leaves"
    server.send(reply("1") + reply("2") + reply("3"))
    assert [f.take() for f in followers] == [reply("1"), reply("2"), reply("3")]


def test_a_transaction_block_is_never_followed(fake_pooler: Any) -> None:
    net = fake_pooler(pipeline_depth=4, query_wait_timeout=0)
    head, server = net.client_with_server()
    other = net.connect()
    head.send(m.query("BEGIN"))
    other.send(m.query("SELECT 1"))
    net.run_callbacks()
    assert query_texts(server.take()) == ["BEGIN"] and other.state is ClientState.WAITING
    server.send(command("BEGIN", m.TX_IN_BLOCK))
    head.send(m.query("COMMIT"))
    server.send(command("COMMIT"))
    net.run_callbacks()
    assert query_texts(server.take()) == ["COMMIT", "SELECT 1"]


def test_a_follower_that_leaves_has_its_replies_dropped_and_the_line_moves_on(
        fake_pooler: Any) -> None:
    net = fake_pooler(pipeline_depth=4, query_wait_timeout=0)
    head, (gone, last), server = lined(net, 2)
    server.take()
    gone.leave()
    assert server.state is ServerState.ACTIVE and not server.transport.closed
    server.send(reply("0") + reply("1") + reply("2"))
    assert head.take() == reply("0") and last.take() == reply("2")
    assert net.pool().idle == [server.conn]


def test_a_cancel_from_a_client_queued_behind_another_is_dropped(fake_pooler: Any) -> None:
    net = fake_pooler(pipeline_depth=4, query_wait_timeout=0)
    head, (follower,), server = lined(net, 1)
    net.cancel(follower.cancel_key)
    assert net.cancels == [], "it would cancel the query ahead"
    net.cancel(head.cancel_key)
    assert net.cancels == [], "it could land on the query behind"
    server.send(reply("0") + reply("1"))
    assert follower.take() == reply("1")


def test_a_head_left_inside_a_block_after_all_closes_the_server(fake_pooler: Any) -> None:
    net = fake_pooler(pipeline_depth=4, query_wait_timeout=0)
    head, (follower,), server = lined(net, 1)
    server.take()
    # The head's statement left a transaction open (a function that ran BEGIN, say): the
    # follower's query behind it would run inside it.
    server.send(select_one(m.TX_IN_BLOCK))
    assert head.take() == select_one(m.TX_IN_BLOCK)
    assert server.closed() == m.terminate(), "closing rolls the transaction back"
    assert errors_in(follower.take())[0]["M"] == "server conn crashed?"
    assert follower.state is ClientState.CLOSED and net.pool().idle == []


# --- with query_wait_timeout: only extended-protocol segments, each behind a guard ---------


def parse_bind_execute_sync() -> bytes:
    parse = m.message(m.PARSE, b"\x00SELECT 1\x00\x00\x00")
    bind = m.message(m.BIND, b"\x00\x00" + b"\x00\x00" * 3)
    return parse + bind + m.execute() + m.sync()


def extended_reply(status: int = m.TX_IDLE) -> bytes:
    return (m.parse_complete() + m.message(ord("2")) + m.data_row(["1"])
            + m.command_complete("SELECT 1") + m.ready_for_query(status))


def guarded_line(net: FakePooler) -> tuple[Client, Client, Server]:
    head, server = net.client_with_server()
    follower = net.connect()
    head.send(parse_bind_execute_sync())
    follower.send(parse_bind_execute_sync())
    net.run_callbacks()
    return head, follower, server


def test_with_query_wait_timeout_a_simple_query_is_not_lined(fake_pooler: Any) -> None:
    net = fake_pooler(pipeline_depth=4, query_wait_timeout=30)
    head, (follower,), server = lined(net, 1)
    assert query_texts(server.take()) == ["SELECT 0"]
    assert follower.state is ClientState.WAITING, "no guard can share a simple Query"


def test_a_lined_extended_segment_goes_behind_a_guard_whose_replies_are_hidden(
        fake_pooler: Any) -> None:
    net = fake_pooler(pipeline_depth=4, query_wait_timeout=30)
    head, follower, server = guarded_line(net)
    assert follower.state is ClientState.ACTIVE
    assert kinds(server.take()) == "PBES" + "PBE" + "PBES", "the guard opens its segment"
    guard_replies = m.parse_complete() + m.message(ord("2")) + m.command_complete("SELECT 0")
    server.send(extended_reply() + guard_replies + extended_reply())
    assert head.take() == extended_reply() and follower.take() == extended_reply()
    assert net.pool().stats.pipelined_count == 1


def test_a_guard_past_its_deadline_refuses_the_client_with_query_wait_timeout(
        fake_pooler: Any) -> None:
    net = fake_pooler(pipeline_depth=4, query_wait_timeout=30)
    head, follower, server = guarded_line(net)
    server.take()
    deadline_error = m.error_response(
        "pypool: query_wait_timeout at 2026-12-02 16:00:00+00", "22P02")
    server.send(extended_reply() + m.parse_complete() + m.message(ord("2")) + deadline_error
                + m.ready_for_query())
    assert head.take() == extended_reply()
    (error,) = errors_in(follower.take())
    assert (error["S"], error["M"]) == ("FATAL", "query_wait_timeout")
    assert follower.state is ClientState.CLOSED
    assert net.pool().idle == [server.conn], "its transaction never started: the server serves on"
    assert net.pool().stats.errors["query_wait_timeout"] == 1
