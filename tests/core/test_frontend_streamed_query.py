"""A simple Query larger than STREAM_HEAD (core/frontend.py `_streams`): classified on its start
and streamed on with bounded memory where session_state or the prepared-statement rewriting
would otherwise read it whole; where the start cannot settle what it does, the client is
pinned (pooling/session_state/streamed.py), and where the rewriting needs the whole text it is
read whole as before."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from pypool.core.frontend import STREAM_AT, STREAM_HEAD, RequestReader
from pypool.pooling import session_state as ss
from pypool.pooling.pool import PoolStats
from pypool.pooling.prepared import ClientStatements, Op, ServerStatements
from pypool.pooling.prepared.registry import Registry, neutral_query

pytestmark = pytest.mark.timeout(60)

MAX_PACKET = 64 << 20
PIN = ss.Command(ss.UNTRACKABLE, ss.LONG_STATEMENT)


def msg(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


def query(text: bytes) -> bytes:
    return msg(b"Q", text + b"\x00")


SMALL = query(b"SELECT 1")
BIG = query(b"SELECT length('" + b"x" * STREAM_AT + b"')")


def reader(watch: bool = True, rewriting: bool = True) -> RequestReader:
    r = RequestReader(MAX_PACKET)
    r.watch = watch
    r.rewriting = rewriting
    return r


def linked_statements() -> ServerStatements:
    registry = Registry()
    server = ServerStatements(registry, 100, PoolStats())
    server.attach(ClientStatements(registry, 100))
    return server


def stream(r: RequestReader, data: bytes, piece: int = 4096,
           st: ServerStatements | None = None, linked: bool = True) -> tuple[bytes, int]:
    """Feed `data` in pieces: what came out, and the most the reader held at once."""
    out = []
    held = 0
    for at in range(0, len(data), piece):
        out.append(r.feed(data[at : at + piece], st, linked))
        held = max(held, len(r.partial or b""))
    return b"".join(out), held


@pytest.mark.parametrize("watch,rewriting,linked", [
    (True, True, True), (True, True, False), (True, False, True), (False, True, True),
    (False, True, False)])
def test_a_large_select_streams_with_only_its_start_held(watch: bool, rewriting: bool,
                                                         linked: bool) -> None:
    r = reader(watch, rewriting)
    st = linked_statements() if rewriting and linked else None
    out, held = stream(r, SMALL + BIG + SMALL, st=st, linked=linked)
    assert out == SMALL + BIG + SMALL
    assert held < STREAM_HEAD + 4096
    assert r.changes == []
    assert r.ledger.pending == 3
    assert r.idle() and r.scan is None


@given(hs.lists(hs.integers(min_value=1, max_value=len(BIG) + 2 * len(SMALL) - 1),
                max_size=12))
@settings(max_examples=100, deadline=None)
def test_every_byte_goes_on_however_the_stream_is_cut(points: list[int]) -> None:
    data = SMALL + BIG + SMALL
    edges = [0, *sorted(set(points)), len(data)]
    r = reader()
    st = linked_statements()
    out = b"".join(r.feed(data[a:b], st, True) for a, b in zip(edges, edges[1:], strict=False))
    assert out == data
    assert r.changes == []
    assert r.ledger.pending == 3


def test_a_query_up_to_stream_at_is_read_whole_and_classified_exactly() -> None:
    r = reader()
    text = b"SET myapp.blob = '" + b"y" * (STREAM_AT - 100) + b"'"
    out, held = stream(r, query(text))
    assert out == query(text)
    assert held > STREAM_AT - 3 * 4096
    assert r.changes == [ss.Command(ss.SET, b"myapp.blob", text)]


def test_a_large_set_pins_its_client_and_is_never_recorded_to_replay() -> None:
    r = reader()
    data = query(b"SET myapp.blob = '" + b"y" * STREAM_AT + b"'")
    out, held = stream(r, data)
    assert out == data and held < STREAM_HEAD + 4096
    assert r.changes == [ss.Command(ss.UNTRACKABLE, b"myapp.blob"), PIN]
    assert all(c.kind != ss.SET for c in r.changes)


def test_a_statement_behind_a_comment_longer_than_the_start_pins() -> None:
    r = reader(rewriting=False)
    data = query(b"/* " + b"z" * STREAM_AT + b" */ SET work_mem = '1MB'")
    out, _ = stream(r, data)
    assert out == data
    assert r.changes == [PIN]


def test_a_set_config_in_the_start_pins_and_a_lock_there_is_taken() -> None:
    r = reader()
    data = query(b"SELECT set_config('myapp.a', 'b', false), pg_advisory_lock(1), length('"
                 + b"x" * STREAM_AT + b"')")
    out, _ = stream(r, data)
    assert out == data
    assert r.changes == [ss.Command(ss.UNTRACKABLE, b"myapp.a"), ss.Command(ss.LOCK)]


@pytest.mark.parametrize("late", [b"pg_advisory_lock(1)", b"SET_CONFIG('a.b', 'c', false)"])
def test_a_call_beyond_the_start_pins_when_it_passes(late: bytes) -> None:
    r = reader()
    data = query(b"SELECT length('" + b"x" * STREAM_AT + b"'), " + late)
    out = b""
    changed_at = -1
    for at in range(0, len(data), 4096):
        out += r.feed(data[at : at + 4096], None, True)
        if r.changes and changed_at < 0:
            changed_at = at
    assert out == data
    assert r.changes == [PIN]
    assert changed_at > STREAM_HEAD  # told while the Query is still on its way


def test_a_prepare_behind_the_first_statement_pins() -> None:
    r = reader()
    data = query(b"INSERT INTO t VALUES ('" + b"x" * STREAM_AT + b"'); PREPARE p AS SELECT 1")
    out, _ = stream(r, data)
    assert out == data
    assert r.changes == [PIN]


def test_a_word_cut_between_two_reads_is_still_seen() -> None:
    scan = ss.QueryScan((b"set_config",), b"... SELECT se")
    assert not scan.feed(b"t_con")
    assert scan.feed(b"fig(")


def test_with_reject_a_large_query_is_still_read_whole() -> None:
    r = reader(rewriting=False)
    r.reject = "transaction"
    out, held = stream(r, BIG)
    assert out == BIG
    assert held >= len(BIG) - 4096


@pytest.mark.parametrize("text,watch", [
    (b"EXECUTE p('", True), (b"  DEALLOCATE p /* '", True), (b"/* " + b"c" * 20_000, True),
    (b"PREPARE p AS SELECT length('", False)])
def test_a_sql_level_command_the_rewriting_reads_is_still_read_whole(text: bytes,
                                                                     watch: bool) -> None:
    r = reader(watch=watch)
    data = query(text + b"x" * STREAM_AT + b"')")
    out, held = stream(r, data, st=linked_statements())
    assert out == data
    assert held >= len(data) - 4096


def test_a_query_behind_whitespace_streams_and_its_server_is_distrusted() -> None:
    r = reader()
    st = linked_statements()
    data = query(b"\n  INSERT INTO t VALUES ('" + b"x" * STREAM_AT + b"')")
    out, held = stream(r, data, st=st)
    assert out == data and held < STREAM_HEAD + 4096
    assert [request.op for request in st.requests.queue] == [Op.DISTRUST]
    assert r.changes == []


def test_a_large_prepare_streams_pinned_and_is_not_recorded() -> None:
    registry = Registry()
    st = ServerStatements(registry, 100, PoolStats())
    client = ClientStatements(registry, 100)
    st.attach(client)
    r = reader()
    data = query(b"PREPARE p AS SELECT length('" + b"x" * STREAM_AT + b"')")
    out, held = stream(r, data, st=st)
    assert out == data and held < STREAM_HEAD + 4096
    assert ss.Command(ss.UNTRACKABLE, b"prepare") in r.changes
    assert [request.op for request in st.requests.queue] == [Op.DISTRUST]
    assert not client.has_sql(b"p")


def test_a_streamed_query_is_never_neutral() -> None:
    text = b"SELECT 1"
    assert neutral_query(text, 0, len(text))
    assert not neutral_query(text, 0, len(text) + 100)
