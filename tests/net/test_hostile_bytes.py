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

import os
import struct
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pypool.core.states import ClientState, ServerState
from pypool.pooler import janitor
from pypool.protocol import messages as m
from tests.net.fakes import FakePooler, errors_in, make_settings, query_texts
from tests.net.postgres_model import Backend

pytestmark = pytest.mark.timeout(120)

# A longer campaign: PYPOOL_HOSTILE_EXAMPLES=20000 (and pytest's --hypothesis-seed).
PROPERTY = settings(max_examples=int(os.environ.get("PYPOOL_HOSTILE_EXAMPLES", "300")),
                    deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

names = st.sampled_from([b"", b"s1", b"s2", b"PYPOOL_1", b"p", b"x" * 70])
texts = st.sampled_from([b"SELECT 1", b"SELECT $1::int", b"SET search_path = a",
                         b"PREPARE q AS SELECT 1", b"EXECUTE q", b"DEALLOCATE ALL",
                         b"DISCARD ALL", b"LISTEN ch", b"BEGIN", b"COMMIT", b"",
                         b"select pg_advisory_lock(1); prepare z as select 1",
                         b"/* c */ SET LOCAL x = 1", b"-- only a comment",
                         b"COPY t FROM STDIN", b"ROLLBACK"])
# Pieces of the statements the session-state look and the SQL-level PREPARE parser read,
# joined in any order: quotes, comments and dollar quotes left open, keywords cut apart.
TOKENS = [b"SET", b"set", b" ", b"LOCAL", b"SESSION", b"x", b"=", b"'", b'"', b"$$", b"$a$",
          b"--", b"/*", b"*/", b";", b"TO", b"DEFAULT", b"PREPARE", b"AS", b"EXECUTE", b"(",
          b")", b"DEALLOCATE", b"ALL", b"DISCARD", b"LISTEN", b"UNLISTEN", b"*", b"LOAD",
          b"RESET", b"ROLE", b"AUTHORIZATION", b"\\", b"E'", b"pg_advisory_lock",
          b"set_config", b"CREATE", b"TEMP", b"TABLE", b"DECLARE", b"CURSOR", b"WITH HOLD",
          b"CLOSE", b"BEGIN", b"COMMIT", b"SELECT", b"\n", b"1", b",", b"TRANSACTION",
          b"ON COMMIT DROP", b"LOCK", b"NOTIFY", b"DO", b"\x00"]
texts = st.one_of(texts, st.lists(st.sampled_from(TOKENS), max_size=12).map(b"".join))
int16 = st.sampled_from([-1, 0, 1, 2, 3, 32767, -32768])
int32 = st.sampled_from([-2, -1, 0, 1, 4, 100, 2**31 - 1])


def i16(value: int) -> bytes:
    return struct.pack("!h", value)


def i32(value: int) -> bytes:
    return struct.pack("!i", value)


@st.composite
def parse_body(draw: Any) -> bytes:
    count = draw(int16)
    types = b"".join(i32(draw(int32)) for _ in range(draw(st.integers(0, 3))))
    return draw(names) + b"\x00" + draw(texts) + b"\x00" + i16(count) + types


@st.composite
def bind_body(draw: Any) -> bytes:
    body = draw(names) + b"\x00" + draw(names) + b"\x00"
    body += i16(draw(int16)) + b"".join(i16(draw(int16)) for _ in range(draw(st.integers(0, 2))))
    body += i16(draw(int16))
    for _ in range(draw(st.integers(0, 3))):
        length = draw(int32)
        body += i32(length) + draw(st.binary(max_size=8))
    return body + i16(draw(int16)) + b"".join(
        i16(draw(int16)) for _ in range(draw(st.integers(0, 2))))


@st.composite
def describe_body(draw: Any) -> bytes:
    target = draw(st.sampled_from([b"S", b"P", b"Z", b""]))
    return target + draw(names) + draw(st.sampled_from([b"\x00", b""]))


@st.composite
def message(draw: Any, mutate: bool = True) -> bytes:
    kind = draw(st.sampled_from("PPBBDDCESSHQQFdcf"))
    if kind == "P":
        body = draw(parse_body())
    elif kind == "B":
        body = draw(bind_body())
    elif kind in "DC":
        body = draw(describe_body())
    elif kind == "E":
        body = draw(names) + b"\x00" + i32(draw(int32))
    elif kind == "Q":
        body = draw(texts) + draw(st.sampled_from([b"\x00", b"", b"\x00\x00"]))
    else:
        body = draw(st.binary(max_size=12)) if kind in "Fdf" else b""
    mutation = draw(st.sampled_from(["none", "none", "cut", "pad", "flip"])) if mutate else ""
    if mutation == "cut" and body:
        body = body[:draw(st.integers(0, len(body) - 1))]
    elif mutation == "pad":
        body += draw(st.binary(min_size=1, max_size=6))
    elif mutation == "flip" and body:
        at = draw(st.integers(0, len(body) - 1))
        body = body[:at] + bytes([draw(st.integers(0, 255))]) + body[at + 1:]
    return m.message(ord(kind), body)


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


def pieces(messages: list[bytes], data: st.DataObject) -> list[bytes]:
    """The messages as one stream, cut at up to four places hypothesis chooses."""
    stream = b"".join(messages)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(stream) - 1)),
                                          max_size=4))))
    out, start = [], 0
    for cut in [*cuts, len(stream)]:
        if cut > start:
            out.append(stream[start:cut])
            start = cut
    return out


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


def replies(data: bytes) -> list[str]:
    """Backend messages as their type letters, an ErrorResponse with its SQLSTATE; not the
    NoticeResponses (the pooler's own say a client keeps its server), nor the
    ParameterStatus messages (the pooler's SET of a client's parameters sends some)."""
    out, pos = [], 0
    while len(data) - pos >= 5:
        end = pos + 1 + int.from_bytes(data[pos + 1:pos + 5], "big")
        kind = chr(data[pos])
        if kind == "N" or kind == "S":
            pos = end
            continue
        if kind == "E":
            fields = {chunk[:1]: chunk[1:] for chunk in data[pos + 5:end].split(b"\x00")}
            kind = "E" + fields.get(b"C", b"?").decode()
        out.append(kind)
        pos = end
    return out


@st.composite
def copy_in(draw: Any) -> bytes:
    """A simple-Query COPY FROM STDIN and what a client sends for it: CopyData, perhaps a
    Flush or Sync among them (PostgreSQL ignores those during a COPY), then CopyDone or
    CopyFail."""
    during = [m.message(ord("d"), b"1\n"), m.message(ord("H")), m.sync()]
    inside = draw(st.lists(st.sampled_from(during), max_size=4))
    end = draw(st.sampled_from([m.message(ord("c")), m.message(ord("f"), b"stop\x00")]))
    return b"".join([m.query("COPY t FROM STDIN"), *inside, end])


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
    # A COPY only as a client runs one (`copy_in`): what a client sends during one other
    # than its data, a Flush or a Sync is a protocol error the pooler answers apart (its
    # ledger doubts, and the server is closed), not as here.
    copy = m.query("COPY t FROM STDIN")
    assume(all(b"COPY" not in message or (message.startswith(copy) and message != copy)
               for message in messages))
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
    for message in messages:
        kind = message[:1]
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


# --- a second client on the same server ---------------------------------------------------


def replies_and_status(data: bytes) -> list[str]:
    """As `replies`, a ReadyForQuery with its transaction status ("ZI", "ZT", "ZE")."""
    out, pos = [], 0
    for kind in replies(data):
        if kind == "Z":
            at = data.index(b"Z\x00\x00\x00\x05", pos)
            kind, pos = "Z" + chr(data[at + 5]), at + 6
        out.append(kind)
    return out


class Backends:
    """PostgreSQL for every server the pool opens: each logged in as it is dialled, each a
    model backend of its own (tests/net/postgres_model.py), closed when the pooler closes it."""

    def __init__(self, fake: FakePooler) -> None:
        self.fake = fake
        self.open: dict[Any, tuple[Any, Backend]] = {}
        self.before_answers: Callable[[], None] = lambda: None  # a check, before each round

    def pump(self) -> None:
        """Answer what the pooler sends to each server, until nothing more is sent."""
        fake = self.fake
        for _ in range(16):
            fake.run_callbacks()
            self.before_answers()
            for conn in fake.opening():
                self.open[conn] = (fake.log_in(conn), Backend())
            fake.run_callbacks()
            moved = False
            for conn, (server, backend) in list(self.open.items()):
                if server.transport.closed:
                    del self.open[conn]
                    if conn.state is not ServerState.CLOSED:
                        server.closed()  # its connection_lost, as asyncio delivers it
                    moved = True
                    continue
                reply = backend.feed(server.take())
                if reply:
                    server.send(reply)
                    moved = True
            if not moved:
                return


def _execute_unnamed(statement: bytes) -> bytes:
    """Bind of `statement` to the unnamed portal, Execute, Sync."""
    bind = m.message(m.BIND, b"\x00" + statement + b"\x00\x00\x00\x00\x00\x00\x00")
    return bind + m.message(m.EXECUTE, b"\x00\x00\x00\x00\x00") + m.sync()


# The second client's startup parameters: the first's, or others, SET at each link.
OTHER_PARAMS = st.sampled_from([{}, {"application_name": "second"}, {"TimeZone": "Asia/Tokyo"}])
Step = tuple[bytes, list[str]]  # what a client sends, and what it should get for it


class SecondClient:
    """A well-behaved client beside the first: `SELECT 1` as a simple Query, or in a
    transaction block of three Queries, or, with prepared statements rewritten, through its
    named statement `s1` (parsed the first time) or an unnamed one; `expected` is what it
    should get on a connection of its own, ReadyForQuery with its status."""

    def __init__(self, client: Any, backends: Backends, rewriting: bool,
                 unnamed: bool = True) -> None:
        self.client = client
        self.backends = backends
        self.kinds = ["simple", "block"]
        if rewriting:
            self.kinds += ["named", "unnamed"] if unnamed else ["named"]
        self.parsed = False
        self.expected: list[str] = []

    def steps(self, data: st.DataObject) -> list[Step]:
        """One request, drawn, as the steps it is sent in (a block's three Queries)."""
        kind = data.draw(st.sampled_from(self.kinds))
        if kind == "simple":
            return [(m.query("SELECT 1"), ["C", "ZI"])]
        if kind == "block":
            return [(m.query("BEGIN"), ["C", "ZT"]), (m.query("SELECT 1"), ["C", "ZT"]),
                    (m.query("COMMIT"), ["C", "ZI"])]
        if kind == "named":
            if self.parsed:
                return [(_execute_unnamed(b"s1"), ["2", "C", "ZI"])]
            self.parsed = True
            parse = m.message(m.PARSE, b"s1\x00SELECT 1\x00\x00\x00")
            return [(parse + _execute_unnamed(b"s1"), ["1", "2", "C", "ZI"])]
        parse = m.message(m.PARSE, b"\x00SELECT 1\x00\x00\x00")
        return [(parse + _execute_unnamed(b""), ["1", "2", "C", "ZI"])]

    def send(self, step: Step, data: st.DataObject, lazy: bool = False) -> None:
        """Send one step, in two reads or one, each answered as far as it goes (`lazy`:
        PostgreSQL may answer later, with both clients' requests in flight)."""
        sent, expected = step
        self.expected += expected
        cut = data.draw(st.integers(0, len(sent) - 1))
        for piece in (sent[:cut], sent[cut:]):
            if piece:
                self.client.send(piece)
                if not lazy or data.draw(st.booleans()):
                    self.backends.pump()

    def request(self, data: st.DataObject) -> None:
        for step in self.steps(data):
            self.send(step, data)


@PROPERTY
@given(st.lists(st.one_of(message(), message(mutate=False), copy_in()), min_size=1,
                max_size=10),
       st.data())
def test_a_second_client_never_sees_the_first_ones_session(
        messages: list[bytes], data: st.DataObject) -> None:
    """Two clients on a pool of one server. The first sends anything (hostile bytes, COPY,
    transaction blocks, prepared statements, session state), in pieces, and may leave after
    any piece; the second sends `SELECT 1` (SecondClient) at any point between. Each of the
    second's requests is answered as on a connection of its own, ending in ReadyForQuery
    'I': never run inside the first's transaction or with its statements, never read as the
    rest of one of its messages, never answered with its replies; and once the first has
    gone, all of them are answered."""
    rewriting = data.draw(st.sampled_from([0, 20]))
    depth = data.draw(st.sampled_from([0, 0, 4]))  # pipelining: a line behind the first
    fake = FakePooler(make_settings(max_prepared_statements=rewriting,
                                    session_state="follow", pipeline_depth=depth))
    try:
        first, server = fake.client_with_server()
        backends = Backends(fake)
        backends.open[server.conn] = (server, Backend())
        second = SecondClient(fake.connect(**data.draw(OTHER_PARAMS)), backends,
                              bool(rewriting))
        parts = pieces(messages, data)
        leave_after = data.draw(st.integers(0, len(parts)))
        for at, piece in enumerate(parts):
            for _ in range(data.draw(st.integers(0, 2))):
                second.request(data)
            if first.transport.closed:
                break
            first.send(piece)
            backends.pump()
            if at + 1 == leave_after and not first.transport.closed:
                first.leave()
                backends.pump()
        second.request(data)
        if not first.transport.closed:
            first.leave()  # what it still holds is let go (closed or handed on clean)
        backends.pump()
        got = replies_and_status(second.client.take())
    finally:
        fake.close()
    assert got == second.expected, got


@PROPERTY
@given(st.lists(st.one_of(message(mutate=False), copy_in()), min_size=1, max_size=10),
       st.data())
def test_a_cancel_lands_only_on_the_server_its_client_holds(
        messages: list[bytes], data: st.DataObject) -> None:
    """The two clients of the property above; the first also sends CancelRequests with
    its key at any point, and PostgreSQL takes them (closes their connections) at any later
    point. A cancel goes out only for a server the first client holds, and when it lands
    that server serves no one else: a cancel hits only its own client's query."""
    rewriting = data.draw(st.sampled_from([0, 20]))
    depth = data.draw(st.sampled_from([0, 0, 4]))
    fake = FakePooler(make_settings(max_prepared_statements=rewriting,
                                    session_state="follow", pipeline_depth=depth))
    try:
        first, server = fake.client_with_server()
        backends = Backends(fake)
        backends.open[server.conn] = (server, Backend())
        second = SecondClient(fake.connect(**data.draw(OTHER_PARAMS)), backends,
                              bool(rewriting))

        def cancel() -> None:
            holder = first.conn.server
            before = len(fake.cancels)
            fake.cancel(first.cancel_key)
            for sent in fake.cancels[before:]:
                assert holder is not None and holder.client is first.conn, \
                    "a cancel sent for a client that holds no server"
                assert sent.request == m.cancel_request(holder.backend_pid,
                                                        holder.backend_secret)

        def no_other_client_under_a_cancel() -> None:
            targets = {bytes(c.request) for c in fake.cancels if not c.answered}
            for conn in backends.open:
                if m.cancel_request(conn.backend_pid, conn.backend_secret) in targets:
                    assert conn.client is None or conn.client is first.conn, \
                        "a server given to another client while a cancel may still land"

        def land() -> None:
            fake.answer_cancels()
            backends.pump()

        backends.before_answers = no_other_client_under_a_cancel

        for piece in pieces(messages, data):
            for _ in range(data.draw(st.integers(0, 2))):
                second.request(data)
            if data.draw(st.booleans()) and not first.transport.closed:
                cancel()
            if data.draw(st.booleans()):
                land()
            if first.transport.closed:
                break
            first.send(piece)
            backends.pump()
        second.request(data)
        land()
        if not first.transport.closed:
            first.leave()
        backends.pump()
        got = replies_and_status(second.client.take())
    finally:
        fake.close()
    assert got == second.expected, got


@PROPERTY
@given(st.lists(st.one_of(message(mutate=False), copy_in()), min_size=1, max_size=10),
       st.data())
def test_two_clients_on_one_server_each_get_what_postgresql_would_answer(
        messages: list[bytes], data: st.DataObject) -> None:
    """The referee property above with a second client on the pool's one server: the
    first's stream in pieces and the second's requests (SecondClient, transaction blocks
    too, so the first waits with what it sent kept) in any order. The first gets what a
    direct connection gets for its stream (as above: unless the pooler refused or doubted,
    which ends it), the second what it should, and neither anything of the other's."""
    copy = m.query("COPY t FROM STDIN")
    assume(all(b"COPY" not in message or (message.startswith(copy) and message != copy)
               for message in messages))
    direct = Backend()
    expected = replies(direct.feed(b"".join(messages)))
    unflushed = replies(direct.output)
    rewriting = data.draw(st.sampled_from([0, 20]))
    depth = data.draw(st.sampled_from([0, 0, 4]))
    fake = FakePooler(make_settings(max_prepared_statements=rewriting,
                                    session_state="follow", pipeline_depth=depth))
    try:
        first, server = fake.client_with_server()
        backends = Backends(fake)
        backends.open[server.conn] = (server, Backend())
        # No unnamed statement of its own: the model's backend has one for both clients.
        second = SecondClient(fake.connect(**data.draw(OTHER_PARAMS)), backends,
                              bool(rewriting), unnamed=False)
        theirs: list[Step] = []
        for _ in range(data.draw(st.integers(1, 4))):
            theirs += second.steps(data)
        ours = pieces(messages, data)
        order = data.draw(st.permutations([True] * len(ours) + [False] * len(theirs)))
        # PostgreSQL answers after each read, or later: then both clients' requests are in
        # flight at once (queued, in a pipeline's line, held behind a SET).
        lazy = data.draw(st.booleans())
        for first_turn in order:
            if first_turn:
                piece = ours.pop(0)
                if not first.transport.closed:
                    first.send(piece)
                    if not lazy or data.draw(st.booleans()):
                        backends.pump()
            else:
                second.send(theirs.pop(0), data, lazy)
        backends.pump()
        got = replies(first.take())
        cut_off = first.transport.closed
        if not cut_off:
            first.leave()  # a transaction it left open, a pin: the second waits for these
        backends.pump()
        got_second = replies_and_status(second.client.take())
    finally:
        fake.close()
    assert got_second == second.expected, got_second
    if cut_off and got[-1:] == ["E08P01"]:
        # The pooler refused what it could not read, or closed the server where its count
        # of replies was in doubt: what came before is a direct connection's.
        assert got[:-1] == expected[:len(got) - 1]
        return
    assert got[:len(expected)] == expected
    assert got[len(expected):] == unflushed[:len(got) - len(expected)]


def _as_far_as_it_went(got: list[str], expected: list[str], ended: bool) -> None:
    """What a client got is what it should get, or, when the pooler ended it, a prefix of
    that and then the pooler's error (08P01)."""
    if ended and got[-1:] == ["E08P01"]:
        assert got[:-1] == expected[:len(got) - 1], (got, expected)
    else:
        assert got == expected, (got, expected)


@PROPERTY
@given(st.lists(st.one_of(message(mutate=False), copy_in()), min_size=1, max_size=8),
       st.data())
def test_two_clients_under_timeouts_get_answers_or_the_pooler_s_error(
        messages: list[bytes], data: st.DataObject) -> None:
    """The two clients of the property above, with query_wait_timeout,
    idle_transaction_timeout and query_timeout set and the clock moved past them at any
    point (the janitor's sweep): each client gets what it would get directly, or a prefix
    of that and the pooler's error that ends it; a timeout never ends the other client,
    nor hands it a server with the first one's replies to come."""
    copy = m.query("COPY t FROM STDIN")
    assume(all(b"COPY" not in message or (message.startswith(copy) and message != copy)
               for message in messages))
    direct = Backend()
    expected = replies(direct.feed(b"".join(messages)))
    expected += replies(direct.output)  # what a Sync or Flush the first never sent holds
    rewriting = data.draw(st.sampled_from([0, 20]))
    depth = data.draw(st.sampled_from([0, 0, 4]))
    fake = FakePooler(make_settings(
        max_prepared_statements=rewriting, session_state="follow", pipeline_depth=depth,
        query_wait_timeout=5.0, idle_transaction_timeout=5.0, query_timeout=5.0))
    try:
        first, server = fake.client_with_server()
        backends = Backends(fake)
        backends.open[server.conn] = (server, Backend())
        second = SecondClient(fake.connect(**data.draw(OTHER_PARAMS)), backends,
                              bool(rewriting), unnamed=False)
        theirs: list[Step] = []
        for _ in range(data.draw(st.integers(1, 3))):
            theirs += second.steps(data)
        ours = pieces(messages, data)
        order = data.draw(st.permutations([True] * len(ours) + [False] * len(theirs)))
        for first_turn in order:
            if first_turn:
                piece = ours.pop(0)
                if not first.transport.closed:
                    first.send(piece)
                    backends.pump()
            else:
                step = theirs.pop(0)
                if not second.client.transport.closed:
                    second.send(step, data)
            if data.draw(st.booleans()):
                fake.clock.advance(6.0)
                janitor.sweep(fake.pooler)
                backends.pump()
        got = replies(first.take())
        if not first.transport.closed:
            first.leave()
        backends.pump()
        got_second = replies_and_status(second.client.take())
        second_ended = second.client.transport.closed
    finally:
        fake.close()
    _as_far_as_it_went(got_second, second.expected, second_ended)
    if got[-1:] == ["E08P01"]:
        assert got[:-1] == expected[:len(got) - 1], (got, expected)
    else:
        assert got == expected[:len(got)], (got, expected)


def test_a_malformed_set_does_not_drop_the_next_client(fake_pooler: Any) -> None:
    """A Query of `SET`, a NUL and another NUL: PostgreSQL refuses it whole (08P01). The
    pooler recorded it as a SET of a parameter named NUL, and undid it for the next client
    on that server with `RESET "\\0"`, a Query PostgreSQL refuses too: that client was
    dropped ("could not set session parameters"). Found by the property above."""
    net = fake_pooler(session_state="follow")
    first, server = net.client_with_server()
    second = net.connect()
    backends = Backends(net)
    backends.open[server.conn] = (server, Backend())
    first.send(m.message(m.QUERY, b"SET\x00\x00"))
    backends.pump()
    assert replies_and_status(first.take()) == ["E08P01", "ZI"]
    first.leave()
    second.send(m.query("SELECT 1"))
    backends.pump()
    assert b"RESET" not in server.transport.written, "nothing to undo"
    assert replies_and_status(second.take()) == ["C", "ZI"]


def test_a_waiting_client_s_statements_follow_it_past_a_pinned_client_s_discard_all(
        fake_pooler: Any) -> None:
    """A client pinned to the pool's one server (an advisory lock) leaves: the pooler sends
    DISCARD ALL and hands the server to the client waiting for it at once. That client's
    Bind of its statement, rewritten then, ran after the DISCARD ALL: it was sent as a hit
    on the server's cache, and PostgreSQL answered 26000 (prepared statement does not
    exist). Then, at the DISCARD ALL's reply, the pooler forgot that client's other
    statements too. Found by the property above."""
    net = fake_pooler(max_prepared_statements=20, session_state="follow")
    first, server = net.client_with_server()
    backends = Backends(net)
    backends.open[server.conn] = (server, Backend())
    second = net.connect()
    parse = m.message(m.PARSE, b"s1\x00SELECT 1\x00\x00\x00")
    other = m.message(m.PARSE, b"s2\x00SELECT 2\x00\x00\x00")
    second.send(parse + other + _execute_unnamed(b"s1"))
    backends.pump()
    assert replies_and_status(second.take()) == ["1", "1", "2", "C", "ZI"]
    first.send(m.query("SELECT pg_advisory_lock(1)"))
    backends.pump()
    assert replies_and_status(first.take()) == ["C", "ZI"]  # pinned: keeps the server
    second.send(_execute_unnamed(b"s1"))
    backends.pump()
    assert second.take() == b"", "waits for the pinned client's server"
    first.leave()
    backends.pump()
    assert replies_and_status(second.take()) == ["2", "C", "ZI"]
    second.send(_execute_unnamed(b"s2"))  # its other statement, after that reply
    backends.pump()
    assert replies_and_status(second.take()) == ["2", "C", "ZI"]
