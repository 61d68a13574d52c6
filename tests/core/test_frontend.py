"""The request reader, fed a client's byte stream after login.

It must pass every byte on in order, whole or streamed (however the stream is cut into
reads), count each request in the client's ledger, drop only what PostgreSQL would ignore,
and say where the client broke the protocol or said goodbye.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from pypool.core.frontend import RequestReader
from pypool.pooling.pool import PoolStats
from pypool.pooling.prepared import ClientStatements, ServerStatements
from pypool.pooling.prepared.registry import Registry
from pypool.protocol.errors import ClientProtocolError, PoolerError

pytestmark = pytest.mark.timeout(60)

MAX_PACKET = 1 << 20


def msg(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


Q = msg(b"Q", b"SELECT 1\x00")
P = msg(b"P", b"\x00SELECT 1\x00\x00\x00")
B = msg(b"B", b"\x00\x00\x00\x00\x00\x00\x00\x00")
D = msg(b"D", b"P\x00")
E = msg(b"E", b"\x00\x00\x00\x00\x00")
S = msg(b"S")
H = msg(b"H")
X = msg(b"X")
CD = msg(b"d", b"1\n")


def feed_all(r: RequestReader, pieces: list[bytes], linked: bool = True) -> bytes:
    return b"".join(r.feed(piece, None, linked) for piece in pieces)


def cuts(data: bytes, points: list[int]) -> list[bytes]:
    points = sorted({p for p in points if 0 < p < len(data)})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]


STREAM = Q + P + B + D + E + S + Q


@given(hs.lists(hs.integers(min_value=1, max_value=len(STREAM) - 1), max_size=12))
@settings(max_examples=200, deadline=None)
def test_every_byte_goes_on_in_order_and_each_request_is_counted(points: list[int]) -> None:
    r = RequestReader(MAX_PACKET)
    assert feed_all(r, cuts(STREAM, points)) == STREAM
    assert r.ledger.pending == 3  # two Queries and a Sync
    assert not r.ledger.unsynced
    assert r.idle()


def test_began_marks_the_read_that_starts_a_query() -> None:
    r = RequestReader(MAX_PACKET)
    r.feed(Q[:3], None, True)
    assert not r.began
    r.feed(Q[3:], None, True)
    assert r.began
    r.feed(Q, None, True)
    assert not r.began  # already owed


def test_a_large_message_in_many_reads_is_gathered_once() -> None:
    body = b"x" * 300_000 + b"\x00"
    big = msg(b"Q", body)
    r = RequestReader(MAX_PACKET)
    r.rewriting = True  # rewritten messages are read whole
    pieces = cuts(big, list(range(4096, len(big), 4096)))
    outs = [r.feed(piece, None, False) for piece in pieces]
    assert all(out == b"" for out in outs[:-1])
    assert outs[-1] == big
    assert r.ledger.pending == 1


def test_a_terminate_ends_the_read_after_what_came_before() -> None:
    r = RequestReader(MAX_PACKET)
    assert r.feed(Q + X + Q, None, True) == Q
    assert r.terminated


@pytest.mark.parametrize("bad", [b"Q\x00\x00\x00\x02", b"Q\x7f\xff\xff\xff"])
def test_a_bad_length_is_a_protocol_error_after_what_came_before(bad: bytes) -> None:
    r = RequestReader(MAX_PACKET)
    assert r.feed(Q + bad, None, True) == Q
    assert isinstance(r.error, ClientProtocolError)
    assert "invalid packet length" in r.error.message


def test_an_unknown_message_type_is_refused() -> None:
    r = RequestReader(MAX_PACKET)
    assert r.feed(msg(b"?"), None, True) == b""
    assert isinstance(r.error, ClientProtocolError)
    assert "unsupported pkt type" in r.error.message


def test_a_flush_with_nothing_owed_and_no_server_is_dropped() -> None:
    r = RequestReader(MAX_PACKET)
    assert r.feed(H, None, False) == b""
    assert r.feed(H, None, True) == H
    assert r.ledger.idle()


def test_copy_data_after_a_finished_copy_is_dropped_even_in_pieces() -> None:
    r = RequestReader(MAX_PACKET)
    stray = msg(b"d", b"z" * 1000)
    assert r.feed(stray[:10], None, True) == b""
    assert r.feed(stray[10:] + Q, None, True) == Q
    assert r.ledger.pending == 1


def test_the_admin_console_takes_simple_queries_only() -> None:
    r = RequestReader(MAX_PACKET)
    r.admin = True
    assert r.feed(Q, None, False) == Q
    r.feed(P, None, False)
    assert isinstance(r.error, PoolerError)
    assert "extended query protocol" in r.error.message


def test_a_named_parse_is_rewritten_for_the_server() -> None:
    registry = Registry()
    stats = PoolStats()
    server = ServerStatements(registry, 100, stats)
    client = ClientStatements(registry, 100)
    server.attach(client)
    r = RequestReader(MAX_PACKET)
    r.rewriting = True
    parse = msg(b"P", b"s1\x00SELECT 1\x00\x00\x00")
    out = r.feed(parse + S, server, True)
    assert b"PYPOOL_" in out and b"s1\x00" not in out
    assert out.endswith(S)
    assert r.ledger.pending == 1


def test_a_driver_segment_with_no_server_is_marked_for_the_outbox() -> None:
    r = RequestReader(MAX_PACKET)
    r.rewriting = True
    segment = B + E + S
    assert r.feed(segment, None, False) == segment
    assert r.segment_end == len(B)
    assert r.began
