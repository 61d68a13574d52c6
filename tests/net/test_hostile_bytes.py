"""Hostile bytes from a logged-in client, over fake transports (tests/net/fakes.py), checked
with hypothesis: extended-protocol messages whose bodies are cut short, padded, or carry
counts and lengths that lie, and statement texts cut apart, in any split, with prepared
statements rewritten and the session-state look on. PostgreSQL either answers nothing or
refuses every request (RefusingServer), so the rewriting's error paths run too.

Whatever arrives, nothing but the pooler's own error handling answers it: no exception
leaves a connection's data_received (the fakes call it directly, so one would fail the
test; on uvloop it would close the connection with a traceback and no ErrorResponse),
every error the client gets carries a SQLSTATE, the pool's books stay in step after every
read (`assert_idle_in_step`), and when the client leaves, its server is either idle with
nothing owed or closed. This runs against the compiled modules when they are built: there
a bytes slice that ends before it starts raises SystemError where Python returns b"", so
the same bytes can take another path than in Python (tests/integration/test_fuzz_session.py
sends such traffic to a real PostgreSQL; this reaches more bodies per second).
PYPOOL_HOSTILE_EXAMPLES sets how many sequences one run tries (300 by default).
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pypool.core.states import ClientState, ServerState
from pypool.protocol import messages as m
from tests.net.fakes import FakePooler, errors_in, make_settings, query_texts
from tests.net.postgres_model import Backend
from tests.net.traffic import PROPERTY, copied_as_clients_copy, copy_in, message, pieces, replies

pytestmark = pytest.mark.timeout(120)

@PROPERTY
@given(st.lists(message(), min_size=1, max_size=12), st.data())
def test_hostile_messages_get_errors_never_exceptions(
        messages: list[bytes], data: st.DataObject) -> None:
    fake = FakePooler(make_settings(max_prepared_statements=20, session_state="follow"))
    try:
        _exchange(fake, messages, data)
    finally:
        fake.close()


class RefusingServer:
    """PostgreSQL refusing everything: each extended-protocol request fails and what
    follows it up to the Sync is skipped, each Query and FunctionCall fails, each Sync not
    skipped to is answered; CopyData, CopyDone and CopyFail are ignored outside a COPY, as
    PostgreSQL does. Reads the pooler's bytes as they come, whole messages only."""

    ERROR = m.error_response("refused", "42501")

    def __init__(self) -> None:
        self.pending = b""
        self.skipping = False

    def answer(self, received: bytes) -> bytes:
        self.pending += received
        out = []
        pos, data = 0, self.pending
        while len(data) - pos >= 5:
            end = pos + 1 + int.from_bytes(data[pos + 1:pos + 5], "big")
            if end > len(data):
                break
            kind = chr(data[pos])
            pos = end
            if self.skipping:
                if kind == "S":
                    self.skipping = False
                    out.append(m.ready_for_query())
            elif kind in "PBDEC":
                self.skipping = True
                out.append(self.ERROR)
            elif kind == "S":
                out.append(m.ready_for_query())
            elif kind in "QF":
                out.append(self.ERROR + m.ready_for_query())
        self.pending = data[pos:]
        return b"".join(out)


def _exchange(fake: FakePooler, messages: list[bytes], data: st.DataObject) -> None:
    client, server = fake.client_with_server()
    postgres = RefusingServer()
    answers = data.draw(st.booleans())  # PostgreSQL answers, or nothing comes back
    for piece in pieces(messages, data):
        if not client.transport.closed:
            client.send(piece)  # raises if anything escapes data_received
            fake.run_callbacks()  # a client dropped from inside a relay is, next
        for _ in range(4 if answers else 0):  # what the pooler sends in turn, answered
            reply = postgres.answer(server.take())
            if not reply or server.transport.closed:
                break
            server.send(reply)
            fake.run_callbacks()
    for error in errors_in(client.take()):
        assert error.get("C") and error.get("S") in ("ERROR", "FATAL"), error
    server.take()
    if not client.transport.closed:
        client.leave()
    assert server.transport.closed or (
        server.state is ServerState.IDLE and server.conn.client is None), \
        "a server left with something owed is closed, never kept"


# --- hostile bytes from the server ---------------------------------------------------------

ERROR_BODIES = [b"SERROR\x00VERROR\x00C42501\x00Mrefused\x00\x00",
                b"SFATAL\x00VFATAL\x00C57P01\x00Mterminating\x00\x00", b"\x00", b"",
                b"SERROR\x00C", b"C26000\x00M prepared statement \"s1\" does not exist\x00\x00"]


@st.composite
def server_message(draw: Any) -> bytes:
    """A backend message of any type, its body typical or not, its length true or lying."""
    kind = draw(st.sampled_from(b"123CDEINTZnstSKAGHWcdV"))
    if kind == ord("Z"):
        body = draw(st.sampled_from([b"I", b"T", b"E", b"X", b"", b"II"]))
    elif kind in b"EN":
        body = draw(st.sampled_from(ERROR_BODIES))
    elif kind == ord("C"):
        body = draw(st.sampled_from([b"SELECT 1\x00", b"DISCARD ALL\x00", b"D", b""]))
    elif kind == ord("S"):
        body = draw(st.sampled_from([b"TimeZone\x00UTC\x00", b"x\x00", b""]))
    else:
        body = draw(st.binary(max_size=12))
    length = len(body) + 4
    lie = draw(st.sampled_from(["none", "none", "none", "short", "long"]))
    if lie == "short":
        length = draw(st.integers(0, length - 1))
    elif lie == "long":
        length += draw(st.integers(1, 8))
    return bytes([kind]) + struct.pack("!I", length) + body


@PROPERTY
@given(st.sampled_from([m.query("SELECT 1"), m.query("BEGIN"),
                        m.message(m.PARSE, b"s1\x00SELECT 1\x00\x00\x00")
                        + m.message(m.BIND, b"\x00s1\x00\x00\x00\x00\x00\x00\x00")
                        + m.execute() + m.sync(),
                        m.message(m.CLOSE, b"Ss1\x00") + m.sync()]),
       st.lists(server_message(), min_size=1, max_size=10), st.sampled_from([0, 20]),
       st.data())
def test_hostile_server_bytes_never_escape(sent: bytes, messages: list[bytes],
                                           rewriting: int, data: st.DataObject) -> None:
    """Whatever a server sends a linked client's pooler, in any split: no exception leaves
    data_received, and a server left with something owed is closed, never kept."""
    fake = FakePooler(make_settings(max_prepared_statements=rewriting,
                                    session_state="follow"))
    try:
        client, server = fake.client_with_server()
        client.send(sent)
        server.take()
        for piece in pieces(messages, data):
            if not server.transport.closed:
                server.send(piece)  # raises if anything escapes data_received
                fake.run_callbacks()
        client.take()
        if not client.transport.closed:
            client.leave()
        fake.run_callbacks()
        assert server.transport.closed or (
            server.state is ServerState.IDLE and server.conn.client is None), \
            "a server left with something owed is closed, never kept"
    finally:
        fake.close()


# --- what the property found, kept as plain cases ------------------------------------------


def test_a_query_with_no_text_before_a_parse_goes_to_postgresql(fake_pooler: Any) -> None:
    """A Query of four bytes (no text, no NUL) is PostgreSQL's to refuse ("invalid string
    in message"); compiled, reading the text of the Parse after it as a SQL-level command
    once raised SystemError."""
    net = fake_pooler(max_prepared_statements=20)
    client, server = net.client_with_server()
    empty_query = m.message(m.QUERY, b"")
    parse = m.message(m.PARSE, b"\x00SELECT 1\x00\x00\x00")
    client.send(empty_query + parse + m.sync())
    assert server.take() == empty_query + parse + m.sync()
    server.send(m.error_response("invalid string in message", "08P01") + m.ready_for_query()
                + m.parse_complete() + m.ready_for_query())
    received = client.take()
    assert [e["C"] for e in errors_in(received)] == ["08P01"] and received.endswith(
        m.parse_complete() + m.ready_for_query())


def test_a_set_of_a_lone_quote_goes_to_postgresql(fake_pooler: Any) -> None:
    """SET followed by an unclosed quoted name: the session-state look reads no setting
    (compiled, it once raised SystemError on the one-byte name)."""
    net = fake_pooler()
    client, server = net.client_with_server()
    client.send(m.query('SET "'))
    assert server.take() == m.query('SET "')
    server.send(m.error_response("unterminated quoted identifier", "42601")
                + m.ready_for_query())
    assert [e["C"] for e in errors_in(client.take())] == ["42601"]
    assert server.state is ServerState.IDLE


def test_a_malformed_message_held_behind_a_set_drops_only_its_client(fake_pooler: Any) -> None:
    """What a client sends while the pooler's SET for it runs waits; a malformed message
    in it is found when the SET's reply lets it go, inside the server's read. The client
    gets the error and goes; the server, its query sent, closes (it never reached the
    server's data_received as an exception)."""
    net = fake_pooler()
    client, server = net.client_with_server(TimeZone="Europe/Paris")
    client.send(m.query("SELECT 1"))
    assert "Europe/Paris" in query_texts(server.take())[0]
    client.send(m.message(m.PARSE, b""))  # no name, no text: malformed
    server.send(m.command_complete("SET") + m.ready_for_query())
    net.run_callbacks()
    (error,) = errors_in(client.take())
    assert (error["S"], error["C"]) == ("FATAL", "08P01") and "malformed" in error["M"]
    assert client.state is ClientState.CLOSED
    assert server.closed().endswith(m.terminate()), "its query's replies are still owed"


# --- the same bytes, directly and through the pooler --------------------------------------


@PROPERTY
@given(st.lists(st.one_of(message(mutate=False), copy_in()), min_size=1, max_size=12),
       st.data())
def test_through_the_pooler_a_client_gets_what_postgresql_would_answer(
        messages: list[bytes], data: st.DataObject) -> None:
    """One client and one server (PostgreSQL modelled: tests/net/postgres_model.py): its
    replies, by type and SQLSTATE, are those a direct connection gets for the same bytes,
    prepared statements renamed or not (a reply the pooler makes may come before the
    Sync or Flush that would have sent it), unless the pooler itself refused a message it
    could not read (then the client has its FATAL error and nothing more is compared)."""
    stream = b"".join(messages)
    assume(copied_as_clients_copy(messages))
    direct = Backend()
    expected = replies(direct.feed(stream))
    # Answered but not flushed yet (no Sync or Flush after it): a reply the pooler makes
    # itself (a CloseComplete) may come early, in its turn; nothing else may.
    unflushed = replies(direct.output)
    rewriting = data.draw(st.sampled_from([0, 20]))
    fake = FakePooler(make_settings(max_prepared_statements=rewriting, session_state="follow"))
    try:
        client, server = fake.client_with_server()
        backend = Backend()
        # In pieces, each answered before the next is sent: a client that sends its
        # CopyData after the CopyInResponse came, as drivers do, or all at once.
        for piece in pieces(messages, data):
            if client.transport.closed or server.transport.closed:
                break
            client.send(piece)
            for _ in range(8):  # what the pooler sends, answered, until nothing more is sent
                fake.run_callbacks()
                reply = backend.feed(server.take())
                if not reply or server.transport.closed:
                    break
                server.send(reply)
        doubted = server.transport.closed
        if doubted:
            server.closed()  # its connection_lost, as asyncio delivers it
        fake.run_callbacks()
        got = replies(client.take())
        cut_off = client.transport.closed
        # Given back, or closed where the ledger could not be sure (core/ledger.py: a Sync
        # sent during a COPY that then failed): never kept by a client owed nothing.
        released = client.state is ClientState.IDLE and (
            server.state is ServerState.IDLE or server.transport.closed)
        session = client.conn.session
        pinned = session is not None and bool(session.pins or session.shared_listen)
    finally:
        fake.close()
    if doubted:
        # The pooler closed the server where its count of replies was in doubt
        # (core/ledger.py: a Sync sent during a COPY that then failed): the client had
        # the replies before it, in order, then the error that ends it.
        assert cut_off and got[-1:] == ["E08P01"], got
        assert got[:-1] == expected[:len(got) - 1]
        return
    if got and got[-1] == "E08P01" and cut_off:
        return  # the pooler refused what it could not read (ClientProtocolError)
    assert got[:len(expected)] == expected
    assert got[len(expected):] == unflushed[:len(got) - len(expected)]
    # Owed nothing (its last message a Sync, answered, the transaction over, its session
    # state keeping no server): the server went back. Without rewriting, a Query an error
    # skipped inside a segment stays owed (docs/prepared-statements.md).
    if (messages[-1][:1] == b"S" and expected[-1:] == ["Z"] and direct.status == m.TX_IDLE
            and not direct.output and not pinned
            and (rewriting or not _query_inside_segment(messages))):
        assert released, "owed nothing, the client still holds its server"


def _query_inside_segment(messages: list[bytes]) -> bool:
    """Whether a Query or FunctionCall was sent after an extended-protocol message and
    before its Sync."""
    open_segment = False
    for sent in messages:
        kind = sent[:1]
        if kind in (b"P", b"B", b"D", b"E", b"C"):
            open_segment = True
        elif kind == b"S":
            open_segment = False
        elif kind in (b"Q", b"F") and open_segment:
            return True
    return False


@pytest.mark.parametrize("pipeline_depth", [0, 4])
def test_a_close_and_flush_sent_without_a_server_get_their_close_complete(
        fake_pooler: Any, pipeline_depth: int) -> None:
    """A Close of a statement only the pooler knows (answered by the pooler) and a Flush,
    from a client between transactions: the server answers the Flush with nothing, so the
    CloseComplete goes out once they are sent, not with the server's next reply, which
    never comes (the property above found the client waiting forever). With pipelining on
    too, where the kept messages go out as the head of a line (net/pipeline.py)."""
    net = fake_pooler(max_prepared_statements=20, pipeline_depth=pipeline_depth)
    client, server = net.client_with_server()
    backend = Backend()
    client.send(m.query("SELECT 1"))  # a transaction that ends at its Sync: a line may form
    net.run_callbacks()  # a line's writes go out on the loop's next turn
    server.send(backend.feed(server.take()))
    assert replies(client.take()) == ["C", "Z"]
    close = m.message(m.CLOSE, b"Ss1\x00")
    client.send(close + m.message(m.FLUSH))
    net.run_callbacks()
    assert server.take() == m.message(m.FLUSH), "the Close is the pooler's to answer"
    assert client.take() == m.message(ord("3"))


def test_a_query_inside_a_segment_that_failed_before_it_owes_nothing(
        fake_pooler: Any) -> None:
    """PostgreSQL skips everything up to the Sync after an extended-protocol error, a Query
    in between too: no ReadyForQuery answers it. The client is owed nothing after the
    Sync's, and its server goes back. (Found by the referee property: the ledger still
    owed the Query's ReadyForQuery, so the server stayed with the client until it left.)"""
    net = fake_pooler(max_prepared_statements=20)
    client, server = net.client_with_server()
    backend = Backend()
    bad_parse = m.message(m.PARSE, b"\x00SELECT 1\x00\xff\xff\x00\x00\x00\x00")
    client.send(bad_parse + m.query("SELECT 2") + m.sync())
    for _ in range(3):
        reply = backend.feed(server.take())
        if reply:
            server.send(reply)
    assert replies(client.take()) == ["E08P01", "Z"]
    assert server.state is ServerState.IDLE and client.state is ClientState.IDLE


def test_a_query_sent_after_the_error_came_owes_nothing(fake_pooler: Any) -> None:
    """The same when the error is already back: a Flush brings it before the client sends
    its Query and Sync. The pooler drops the Query (PostgreSQL would skip it) and the
    ledger must not count it."""
    net = fake_pooler(max_prepared_statements=20)
    client, server = net.client_with_server()
    backend = Backend()
    bad_parse = m.message(m.PARSE, b"\x00SELECT 1\x00\xff\xff\x00\x00\x00\x00")
    client.send(bad_parse + m.message(m.FLUSH, b""))
    server.send(backend.feed(server.take()))
    assert replies(client.take()) == ["E08P01"]
    client.send(m.query("SELECT 2") + m.sync())
    server.send(backend.feed(server.take()))
    assert replies(client.take()) == ["Z"]
    assert server.state is ServerState.IDLE and client.state is ClientState.IDLE


def test_a_describe_whose_name_lacks_its_nul_goes_to_postgresql_as_it_is(
        fake_pooler: Any) -> None:
    """Describe "s1" without its NUL: PostgreSQL refuses it (08P01) and skips to the Sync.
    Read up to its last byte, it named "s", another statement of the client's, which the
    pooler then described (found by the property above, comparing with a direct
    connection)."""
    net = fake_pooler(max_prepared_statements=20)
    client, server = net.client_with_server()
    backend = Backend()
    client.send(m.message(m.PARSE, b"s\x00SELECT 1\x00\x00\x00") + m.sync())
    server.send(backend.feed(server.take()))
    assert replies(client.take()) == ["1", "Z"]
    describe = m.message(m.DESCRIBE, b"Ss1")
    client.send(describe + m.sync())
    sent = server.take()
    assert describe in sent, "as the client sent it"
    server.send(backend.feed(sent))
    assert replies(client.take()) == ["E08P01", "Z"]
