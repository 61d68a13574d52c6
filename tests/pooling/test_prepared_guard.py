"""The query_wait_timeout guard's bookkeeping, sans-IO (pypool/pooling/pipeline_guard.py and
pypool/pooling/prepared/guard_statement.py):
a head's transaction and a follower's, with its guard, queued on one ServerStatements, and
the server's replies fed to it as the glue would.

What must hold: the guard goes first in the follower's segment and none of its replies reach
the follower; its verdict calls `on_verdict` once; its deadline error leaves only the
follower's ReadyForQuery; any other error is the follower's; the guard statement is parsed once per
server, again when the server lost it, and closed first when that is not known.
"""

from __future__ import annotations

from pypool.pooling.pipeline_guard import FAILED, PASSED, PENDING, SKIPPED, Guard
from pypool.pooling.prepared import ClientStatements, Registry, ServerStatements, Tracking
from pypool.pooling.prepared.guard_statement import (
    GUARD_ABSENT,
    GUARD_CLOSE,
    GUARD_EXECUTE,
    GUARD_NAME,
    GUARD_PARSE,
    GUARD_PARSED,
    GUARD_UNSURE,
    guard_bind,
)
from pypool.protocol import messages as m

from .test_prepared import (
    BIND_COMPLETE,
    CLOSE_COMPLETE,
    PARSE_COMPLETE,
    ROW,
    SYNC,
    Link,
    bind,
    complete,
    error,
    execute,
    parse,
    query,
    ready,
)

DEADLINE = 2_000_000_000.0
INSERT = b"INSERT INTO t VALUES ($1::int)"
# What PostgreSQL answers the guard's Execute once the deadline has passed.
DEADLINE_ERROR = m.error_response(
    'invalid input syntax for type integer: "pypool: query_wait_timeout at '
    '2033-05-18 03:33:20.5+00"', "22P02")


class Line:
    """A head client running a query on one server, and a follower queued behind it with a
    guard (what net/pipeline.follow does: the guard, then the follower's rewritten request)."""

    def __init__(self, server: ServerStatements | None = None,
                 registry: Registry | None = None) -> None:
        self.registry = registry if registry is not None else Registry()
        self.head = Link(registry=self.registry)
        if server is not None:
            self.head.server = server
            server.attach(self.head.client)
        self.server = self.head.server
        self.head.send(query(b"SELECT 1 FROM pg_sleep(4)"))
        self.head.take()
        self.verdicts: list[int] = []  # the states on_verdict was called with
        self.guard = Guard("follower", 0.0, DEADLINE,
                           lambda guard: self.verdicts.append(guard.state))
        self.follower = Link(registry=self.registry)
        self.follower.server = self.server
        self.guard_bytes = self.server.queue_guard(self.guard)
        self.follower.to_server = self.server.attach(self.follower.client)

    def head_done(self) -> None:
        self.head.reply(ROW, complete(b"SELECT 1"), ready())
        assert self.head.take()[1] == ROW + complete(b"SELECT 1") + ready()


def test_the_guard_opens_the_followers_segment_and_its_replies_are_swallowed():
    line = Line()
    assert line.guard_bytes == GUARD_PARSE + guard_bind(DEADLINE) + GUARD_EXECUTE
    assert line.server.guard.state == GUARD_PARSED
    line.follower.send(parse(b"", INSERT), bind(b"", params=(b"1",)), execute(), SYNC)
    assert line.follower.take()[0] == parse(b"", INSERT) + bind(b"", params=(b"1",)) \
        + execute() + SYNC
    line.head_done()
    line.follower.reply(PARSE_COMPLETE, BIND_COMPLETE, complete(b"SELECT 0"),  # the guard's
                        PARSE_COMPLETE, BIND_COMPLETE, complete(b"INSERT 0 1"), ready())
    assert line.follower.take()[1] == (PARSE_COMPLETE + BIND_COMPLETE + complete(b"INSERT 0 1")
                                       + ready())
    assert line.guard.state == PASSED and line.verdicts == [PASSED]
    requests = line.server.requests
    assert not requests.queue and requests.readies_queued == requests.readies_done
    # Parsed once per server: the next guard there is a Bind and an Execute.
    again = Guard("next", 0.0, DEADLINE + 1, lambda guard: None)
    assert line.server.queue_guard(again) == guard_bind(DEADLINE + 1) + GUARD_EXECUTE


def test_a_folded_follower_segment_streams_once_the_guard_has_passed():
    """The follower's Bind of a statement the server has (the drivers' steady state) is
    folded into its Sync behind the guard, as it would be without it."""
    registry = Registry()
    warm = Link(registry=registry)
    warm.send(parse(b"s", b"SELECT $1::int"), SYNC)
    warm.reply(PARSE_COMPLETE, ready())
    assert warm.server.detach()
    line = Line(server=warm.server, registry=registry)
    assert line.guard_bytes == GUARD_PARSE + guard_bind(DEADLINE) + GUARD_EXECUTE
    line.follower.client.names[b"s"] = warm.client.names[b"s"]
    registry.hold(warm.client.names[b"s"])
    line.follower.send(bind(b"s", params=(b"7",)), execute(), SYNC)
    assert line.follower.take()[0] == bind(b"PYPOOL_1", params=(b"7",)) + execute() + SYNC
    line.head_done()
    line.follower.reply(PARSE_COMPLETE, BIND_COMPLETE, complete(b"SELECT 0"))
    # the follower's folded segment is on the hot path
    assert line.server.requests.tracking == Tracking.HOT
    line.follower.reply(BIND_COMPLETE, ROW, complete(b"SELECT 1"), ready())
    assert line.follower.take()[1] == BIND_COMPLETE + ROW + complete(b"SELECT 1") + ready()
    assert line.guard.state == PASSED and not line.server.requests.queue


def test_past_its_deadline_the_followers_transaction_is_skipped_and_it_is_refused():
    line = Line()
    line.follower.send(parse(b"ins", INSERT), bind(b"ins", params=(b"1",)), execute(), SYNC)
    assert b"ins" in line.follower.client.names
    line.head_done()
    assert line.verdicts == []
    line.follower.reply(PARSE_COMPLETE, BIND_COMPLETE, DEADLINE_ERROR)
    assert line.verdicts == [FAILED] and line.guard.state == FAILED
    # Only the follower's Sync is left: its ReadyForQuery (the glue drops it, the client
    # being gone), on the hot path.
    assert line.server.requests.tracking == Tracking.HOT and len(line.server.requests.queue) == 1
    line.follower.reply(ready())
    assert line.follower.take()[1] == ready()
    assert line.verdicts == [FAILED] and not line.server.requests.queue
    # The skipped Parse is forgotten by the server and by the client.
    assert b"ins" not in line.follower.client.names
    assert not line.server.cache.lru and len(line.registry) == 0
    # The server serves on; the guard statement is still there.
    assert line.server.guard.state == GUARD_PARSED
    assert line.server.detach()
    nxt = Link(registry=line.registry)
    nxt.move_to(line.server)
    nxt.take()
    nxt.send(parse(b"q", b"SELECT 2"), bind(b"q"), execute(), SYNC)
    nxt.reply(PARSE_COMPLETE, BIND_COMPLETE, ROW, complete(b"SELECT 1"), ready())
    assert nxt.take()[1] == PARSE_COMPLETE + BIND_COMPLETE + ROW + complete(b"SELECT 1") \
        + ready()


def test_another_error_of_the_guard_is_the_followers_own():
    """A 26000 for the guard statement (dropped behind the pooler's back): forwarded to the
    follower, whose transaction did not run; nobody is refused; the statement is parsed
    again next time, and the server's other statements are no longer trusted."""
    line = Line()
    line.follower.send(parse(b"", INSERT), bind(b"", params=(b"1",)), execute(), SYNC)
    line.head_done()
    lost = error("26000", f'prepared statement "{GUARD_NAME.decode()}" does not exist')
    line.follower.reply(PARSE_COMPLETE, lost, ready())
    assert line.follower.take()[1] == lost + ready()
    assert line.verdicts == [] and line.guard.state == SKIPPED
    assert line.server.guard.state == GUARD_ABSENT
    again = Guard("next", 0.0, DEADLINE, lambda guard: None)
    assert line.server.queue_guard(again).startswith(GUARD_PARSE)


def test_a_cancel_landing_on_the_guard_is_the_followers_error():
    line = Line()
    line.follower.send(parse(b"", INSERT), bind(b"", params=(b"1",)), execute(), SYNC)
    line.head_done()
    canceled = error("57014", "canceling statement due to user request")
    line.follower.reply(PARSE_COMPLETE, BIND_COMPLETE, canceled, ready())
    assert line.follower.take()[1] == canceled + ready()
    assert line.verdicts == [] and line.guard.state == SKIPPED
    assert line.server.guard.state == GUARD_PARSED


def test_a_guard_statement_the_server_may_have_is_closed_before_it_is_parsed_again():
    line = Line()
    line.follower.send(parse(b"", INSERT), bind(b"", params=(b"1",)), execute(), SYNC)
    line.head_done()
    line.follower.reply(PARSE_COMPLETE, BIND_COMPLETE, complete(b"SELECT 0"), PARSE_COMPLETE,
                        BIND_COMPLETE, complete(b"INSERT 0 1"), ready())
    line.server.distrust("a test")
    assert line.server.guard.state == GUARD_UNSURE
    # The next follower on this server: its guard closes the name first (never fails).
    assert line.server.detach()
    line2 = Line(server=line.server, registry=line.registry)
    assert line2.guard_bytes == GUARD_CLOSE + GUARD_PARSE + guard_bind(DEADLINE) \
        + GUARD_EXECUTE
    line2.follower.send(parse(b"", INSERT), bind(b"", params=(b"2",)), execute(), SYNC)
    line2.head_done()
    line2.follower.reply(CLOSE_COMPLETE, PARSE_COMPLETE, BIND_COMPLETE, complete(b"SELECT 0"),
                         PARSE_COMPLETE, BIND_COMPLETE, complete(b"INSERT 0 1"), ready())
    assert line2.follower.take()[1] == (PARSE_COMPLETE + BIND_COMPLETE
                                        + complete(b"INSERT 0 1") + ready())
    assert line2.server.guard.state == GUARD_PARSED


def test_deallocate_all_drops_the_guard_statement_unless_its_parse_is_queued_behind():
    st = ServerStatements(Registry(), 10)
    st.attach(ClientStatements(st.registry, 0))
    st.guard.state = GUARD_PARSED
    st.clear()
    assert st.guard.state == GUARD_ABSENT
    st.queue_guard(Guard("f", 0.0, DEADLINE, lambda guard: None))
    st.clear()  # a DEALLOCATE ALL ahead of the queued Parse: that Parse makes it again
    assert st.guard.state == GUARD_PARSED
    st.close()
    assert st.guard.state == GUARD_ABSENT


def test_the_guard_is_bound_to_its_deadline_in_postgres_binary_time():
    """timestamptz, binary: microseconds since 2000-01-01 00:00 UTC."""
    message = guard_bind(946684800.0 + 1.5)
    assert message[:1] == b"B"
    assert message.endswith((1_500_000).to_bytes(8, "big") + b"\x00\x00")
    assert GUARD_NAME + b"\x00" in message
    assert Guard("f", 1.0, 2.0, lambda guard: None).state == PENDING
