"""Two clients on a pool of one server, over fake transports (tests/net/fakes.py), each
server PostgreSQL modelled (tests/net/postgres_model.py), checked with hypothesis: whatever
the first client sends (hostile bytes, COPY, transaction blocks, prepared statements, session
state), in whatever reads, whenever it leaves, cancels or times out, the second is answered
as a connection of its own would be, and neither gets anything of the other's. The first is
compared with a direct connection too where its bytes are well formed (as the one-client
referee in test_hostile_bytes.py). PYPOOL_HOSTILE_EXAMPLES sets how many sequences one run
tries (300 by default).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pypool.core.states import ServerState
from pypool.pooler import janitor
from pypool.protocol import messages as m
from tests.net.fakes import Client, FakePooler, make_settings
from tests.net.postgres_model import Backend
from tests.net.traffic import PROPERTY, copied_as_clients_copy, copy_in, message, pieces, replies

pytestmark = pytest.mark.timeout(120)


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


# Well-formed traffic from the first client: whole message bodies, COPY as clients run it.
WELL_FORMED = st.lists(st.one_of(message(mutate=False), copy_in()), min_size=1, max_size=10)
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


@contextmanager
def two_clients(data: st.DataObject, unnamed: bool = True,
                **keys: Any) -> Iterator[tuple[FakePooler, Client, Backends, SecondClient]]:
    """A pool of one server (prepared statements rewritten or not, pipelining on or off:
    drawn; `keys` besides), its server logged in and modelled, the first client welcomed
    into it, and the second (SecondClient) connected with parameters of its own or the
    first's (OTHER_PARAMS)."""
    rewriting = data.draw(st.sampled_from([0, 20]))
    depth = data.draw(st.sampled_from([0, 0, 4]))  # pipelining: a line behind the first
    fake = FakePooler(make_settings(max_prepared_statements=rewriting,
                                    session_state="follow", pipeline_depth=depth, **keys))
    try:
        first, server = fake.client_with_server()
        backends = Backends(fake)
        backends.open[server.conn] = (server, Backend())
        second = SecondClient(fake.connect(**data.draw(OTHER_PARAMS)), backends,
                              bool(rewriting), unnamed)
        yield fake, first, backends, second
    finally:
        fake.close()


def assert_answered(data: st.DataObject, first: Client, backends: Backends,
                    second: SecondClient) -> None:
    """The second's last request; then the first goes, if it has not (what it still holds
    is let go: closed, or handed on clean), and once everything is answered the second has
    had exactly what a connection of its own would have had, ReadyForQuery statuses too."""
    second.request(data)
    if not first.transport.closed:
        first.leave()
    backends.pump()
    got = replies_and_status(second.client.take())
    assert got == second.expected, got


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
    with two_clients(data) as (fake, first, backends, second):
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
        assert_answered(data, first, backends, second)


@PROPERTY
@given(WELL_FORMED, st.data())
def test_a_cancel_lands_only_on_the_server_its_client_holds(
        messages: list[bytes], data: st.DataObject) -> None:
    """The two clients of the property above; the first also sends CancelRequests with
    its key at any point, and PostgreSQL takes them (closes their connections) at any later
    point. A cancel goes out only for a server the first client holds, and when it lands
    that server serves no one else: a cancel hits only its own client's query."""
    with two_clients(data) as (fake, first, backends, second):

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
        land()
        assert_answered(data, first, backends, second)


@PROPERTY
@given(WELL_FORMED, st.data())
def test_two_clients_on_one_server_each_get_what_postgresql_would_answer(
        messages: list[bytes], data: st.DataObject) -> None:
    """The referee property above with a second client on the pool's one server: the
    first's stream in pieces and the second's requests (SecondClient, transaction blocks
    too, so the first waits with what it sent kept) in any order. The first gets what a
    direct connection gets for its stream (as above: unless the pooler refused or doubted,
    which ends it), the second what it should, and neither anything of the other's."""
    assume(copied_as_clients_copy(messages))
    direct = Backend()
    expected = replies(direct.feed(b"".join(messages)))
    unflushed = replies(direct.output)
    # No unnamed statement of the second's: the model's backend has one for both clients.
    with two_clients(data, unnamed=False) as (fake, first, backends, second):
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
    assert got_second == second.expected, got_second
    if cut_off and got[-1:] == ["E08P01"]:
        # The pooler refused what it could not read, or closed the server where its count
        # of replies was in doubt: what came before is a direct connection's.
        assert got[:-1] == expected[:len(got) - 1]
        return
    assert got[:len(expected)] == expected
    assert got[len(expected):] == unflushed[:len(got) - len(expected)]


@PROPERTY
@given(WELL_FORMED, st.data())
def test_a_server_lost_under_the_first_client_costs_the_second_nothing(
        messages: list[bytes], data: st.DataObject) -> None:
    """The two clients of the properties above; at any point the server connection breaks
    (the backend dies, the network is cut) while it is idle or held by the first client with
    no one lined up behind it, answered or with the first's requests still unanswered on
    it. The first may be dropped with the pooler's error; the second is answered as on a
    connection of its own, by a server the pool opens for it, never with anything of the
    first's, and is never left waiting."""
    with two_clients(data) as (fake, first, backends, second):

        def maybe_lose() -> None:
            if not data.draw(st.booleans()):
                return
            for conn, (server, _) in list(backends.open.items()):
                if (conn.client is None or conn.client is first.conn) and not conn.chain:
                    del backends.open[conn]
                    server.lose()

        for piece in pieces(messages, data):
            for _ in range(data.draw(st.integers(0, 2))):
                second.request(data)
            maybe_lose()
            backends.pump()
            if first.transport.closed:
                break
            first.send(piece)
            maybe_lose()  # what the first just sent unanswered, or not yet all of it sent
            backends.pump()
        assert_answered(data, first, backends, second)


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
    assume(copied_as_clients_copy(messages))
    direct = Backend()
    expected = replies(direct.feed(b"".join(messages)))
    expected += replies(direct.output)  # what a Sync or Flush the first never sent holds
    with two_clients(
        data, unnamed=False, query_wait_timeout=5.0, idle_transaction_timeout=5.0,
        query_timeout=5.0) as (fake, first, backends, second):
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
