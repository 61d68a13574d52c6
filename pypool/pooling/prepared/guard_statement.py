"""The query_wait_timeout guard's statement on one server, and the guards queued there.

The guard (pooling/pipeline_guard.py tells why and what it is) is a Bind and Execute of the
pooler's own statement GUARD_NAME, sent first in a pipelined follower's segment. The
statement is parsed on a server once, lazily, in the first segment that needs it (as an
injected Parse is: reply swallowed), under a name the Registry never hands out; it is parsed
again after DEALLOCATE ALL or DISCARD ALL, and closed first if the server may or may not
have it (after ServerStatements.distrust). Every reply of the guard's is swallowed
(Op.GUARD). Its deadline error makes the Guard FAILED (the request queue then calls
`Guard.on_verdict`, through which the glue refuses the client); an error of any other kind
(the statement lost behind the pooler's back, a cancel that landed on it) is forwarded to the
client as the error of its transaction, which did not run either.

`GuardStatement` owns whether the server has the statement (`state`) and queues the guard's
requests on the server's RequestQueue. It never looks at a clock: the deadline is the glue's.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from ...protocol import messages as m
from ..pipeline_guard import FAILED, PASSED, PENDING, SKIPPED, Guard
from .registry import PREFIX
from .requests import (
    NO_SUCH_STATEMENT,
    Op,
    Request,
    Verdict,
    Wait,
    close_statement,
    parse_message,
)

if TYPE_CHECKING:
    from .request_queue import RequestQueue

log = logging.getLogger("pypool.prepared")

# The pooler's own statement: the Registry names client statements PREFIX + a number.
GUARD_NAME: Final = PREFIX + b"GUARD"
GUARD_SQL: Final = (
    b"SELECT 1 WHERE (CASE WHEN pg_catalog.clock_timestamp() OPERATOR(pg_catalog.>) $1"
    b" THEN CAST(pg_catalog.concat('pypool: query_wait_timeout at ',"
    b" pg_catalog.clock_timestamp()) AS pg_catalog.int4) END) IS NOT NULL"
)
_TIMESTAMPTZ_OID: Final = 1184
GUARD_PARSE: Final = parse_message(
    GUARD_NAME, GUARD_SQL + b"\x00" + struct.pack("!hI", 1, _TIMESTAMPTZ_OID)
)
GUARD_CLOSE: Final = close_statement(GUARD_NAME)
GUARD_EXECUTE: Final = m.execute()
# What its deadline error carries: SQLSTATE invalid_text_representation, and our text.
GUARD_SQLSTATE: Final = b"\x00C22P02\x00"
GUARD_MARK: Final = b"pypool: query_wait_timeout at "

# PostgreSQL's binary timestamptz: microseconds since 2000-01-01 00:00 UTC.
_POSTGRES_EPOCH: Final = 946684800.0
_BIND_HEAD: Final = b"\x00" + GUARD_NAME + b"\x00" + struct.pack("!hhhi", 1, 1, 1, 8)

# Whether a server has the guard statement.
GUARD_ABSENT: Final = 0
GUARD_PARSED: Final = 1
GUARD_UNSURE: Final = 2  # after distrust: it may or may not; closed before it is parsed


def guard_bind(deadline: float) -> bytes:
    """The Bind of the guard statement to `deadline` (seconds since the epoch, UTC)."""
    micros = round((deadline - _POSTGRES_EPOCH) * 1e6)
    body = _BIND_HEAD + struct.pack("!qh", micros, 0)
    return b"B" + (len(body) + 4).to_bytes(4, "big") + body


class GuardStatement:
    """The guard statement on one server, and the guards queued there."""

    def __init__(self, requests: RequestQueue) -> None:
        self.requests = requests
        self.state = GUARD_ABSENT

    def queue_guard(self, guard: Guard) -> bytes:
        """Queue `guard` at the start of the segment about to be sent (the follower's, which
        must follow at once), and return its messages. They are not counted in the open
        segment (`open_count`), so the follower's own requests are folded into its Sync as
        they would be without it."""
        requests = self.requests
        queue = requests.queue
        was_empty = not queue
        segment = requests.segment
        out = []
        if self.state != GUARD_PARSED:
            if self.state == GUARD_UNSURE:
                queue.append(Request(Wait.CLOSE, True, Op.GUARD, None, None, segment, guard))
                out.append(GUARD_CLOSE)
            queue.append(Request(Wait.PARSE, True, Op.GUARD, None, None, segment, guard))
            out.append(GUARD_PARSE)
            self.state = GUARD_PARSED
        queue.append(Request(Wait.BIND, True, Op.GUARD, None, None, segment, guard))
        queue.append(Request(Wait.EXECUTE, True, Op.GUARD, None, None, segment, guard))
        out.append(guard_bind(guard.deadline))
        out.append(GUARD_EXECUTE)
        if was_empty:
            requests.retrack()
        return b"".join(out)

    @staticmethod
    def lost(body: bytes, request: Request) -> bool:
        """Whether this ErrorResponse says the server lost the statement (a function running
        DEALLOCATE ALL behind the pooler's back: so may the others have been)."""
        return request.wait == Wait.BIND and NO_SUCH_STATEMENT in body

    def error(self, body: bytes, request: Request) -> int:
        """An ErrorResponse for one of the guard's requests: its deadline error is swallowed
        (and the guard FAILED); any other is the follower's, forwarded."""
        wait = request.wait
        if wait == Wait.EXECUTE and GUARD_SQLSTATE in body and GUARD_MARK in body:
            request.payload.state = FAILED
            return Verdict.SWALLOW
        if self.lost(body, request):
            self.state = GUARD_ABSENT
        elif wait != Wait.EXECUTE:
            self.state = GUARD_UNSURE
        fields = m.parse_error_fields(body)
        log.warning("query_wait_timeout guard failed: %s %s", fields.get("C"), fields.get("M"))
        return Verdict.FORWARD

    def settled(self, request: Request, ok: bool) -> None:
        """One of the guard's requests completed (ok) or was skipped."""
        guard: Guard = request.payload
        wait = request.wait
        if wait == Wait.EXECUTE:
            if ok:
                guard.state = PASSED
                if guard.refused:
                    # The janitor's margin did not cover how late this reply was read: the
                    # client was told query_wait_timeout and its transaction runs now.
                    log.error("a client refused at query_wait_timeout passed its guard: "
                              "replies read late, or clocks out of step")
                guard.on_verdict(guard)
            elif guard.state == PENDING:
                guard.state = SKIPPED
        elif wait == Wait.PARSE and not ok:
            self.state = GUARD_UNSURE

    def forget(self) -> None:
        """The guard's part of ServerStatements.distrust."""
        if self.state == GUARD_PARSED:
            self.state = GUARD_UNSURE

    def clear(self, queued: Iterable[Request] = ()) -> None:
        """DEALLOCATE ALL or DISCARD ALL ran (or the server is gone): the statement is gone
        too, unless a Parse of it is still `queued` behind it."""
        self.state = GUARD_ABSENT
        for request in queued:
            if request.op == Op.GUARD and request.wait == Wait.PARSE:
                self.state = GUARD_PARSED
