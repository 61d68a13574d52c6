"""The request reader's look at session state (core/frontend.py, pooling/session_state/):
what a client's Queries and Parses change is found however the stream is cut, and with
reject the statement is replaced by one that fails in its place."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from pypool.core.frontend import RequestReader
from pypool.pooling import session_state as ss

pytestmark = pytest.mark.timeout(60)

MAX_PACKET = 1 << 20


def msg(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


LISTEN = msg(b"Q", b"LISTEN chan\x00")
SET = msg(b"P", b"stmt\x00SET work_mem = 1\x00\x00\x00")
SELECT = msg(b"Q", b"SELECT 1\x00")
STREAM = SELECT + LISTEN + SET + msg(b"S") + SELECT


def cuts(data: bytes, points: list[int]) -> list[bytes]:
    points = sorted({p for p in points if 0 < p < len(data)})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]


@given(hs.lists(hs.integers(min_value=1, max_value=len(STREAM) - 1), max_size=12))
@settings(max_examples=200, deadline=None)
def test_changes_are_found_however_the_stream_is_cut(points: list[int]) -> None:
    r = RequestReader(MAX_PACKET)
    r.watch = True
    out = b"".join(r.feed(piece, None, True) for piece in cuts(STREAM, points))
    assert out == STREAM
    assert r.changes == [ss.Command(ss.LISTEN, b"chan"),
                         ss.Command(ss.SET, b"work_mem", b"SET work_mem = 1")]
    assert r.ledger.pending == 4  # three Queries and a Sync


def test_nothing_is_looked_at_when_off() -> None:
    r = RequestReader(MAX_PACKET)
    assert r.feed(STREAM, None, True) == STREAM
    assert r.changes == []


def test_reject_replaces_the_statement_with_one_that_fails_in_its_place() -> None:
    r = RequestReader(MAX_PACKET)
    r.watch = True
    r.reject = "transaction"
    out = r.feed(STREAM, None, True)
    assert r.changes == []
    assert [c.kind for c in r.refused] == [ss.LISTEN, ss.SET]
    assert out.startswith(SELECT) and out.endswith(msg(b"S") + SELECT)
    assert b"LISTEN is not allowed in transaction pooling mode" in out
    assert b"ERRCODE = '0A000'" in out
    assert b"LISTEN chan" not in out and b"SET work_mem" not in out
    # the Parse keeps its name and its (empty) parameter types
    refused_parse = msg(b"P", b"stmt\x00" + ss.refusal(r.refused[1], "transaction")
                        + b"\x00\x00\x00")
    assert refused_parse in out
    assert r.ledger.pending == 4  # counted as the messages they replace


def test_a_malformed_parse_is_left_to_the_server() -> None:
    bad = msg(b"P", b"no terminator")
    r = RequestReader(MAX_PACKET)
    r.watch = True
    assert r.feed(bad + msg(b"S"), None, True) == bad + msg(b"S")
    assert r.changes == []


def test_a_repeated_parse_is_judged_by_its_bytes() -> None:
    """A Parse identical to the last one that changed nothing is not looked at again (the
    unnamed statement of a repeated query); any other Parse still is, and one that changes
    state is found every time it comes."""
    plain = msg(b"P", b"\x00SELECT abalance FROM t WHERE aid = $1\x00\x00\x00")
    advisory = msg(b"P", b"\x00SELECT pg_advisory_lock($1)\x00\x00\x00")
    r = RequestReader(MAX_PACKET)
    r.watch = True
    stream = plain + plain + SET + advisory + plain + SET + msg(b"S")
    assert r.feed(stream, None, True) == stream
    assert r.last_plain_parse == plain
    assert [c.kind for c in r.changes] == [ss.SET, ss.LOCK, ss.SET]
