"""The query_wait_timeout guard: what keeps a pipelined client refusable until its transaction
has started on the server (net/pipeline.py queues it, `Guards.queue_guard` sends it).

A client queued on a busy server's line has its request on the server's socket, behind the
linked client's transaction: once there it cannot be taken back, and telling the client
`query_wait_timeout` while the server may still run it would be a lie. So the request carries
its own deadline. The follower's transaction is one extended-protocol segment (the only kind
pipelined while query_wait_timeout is set), and the guard is the first thing in it, before
the client's own messages: a Bind and Execute of the pooler's statement GUARD_NAME,

    SELECT 1 WHERE (CASE WHEN clock_timestamp() > $1
                    THEN CAST('pypool: query_wait_timeout at ' || clock_timestamp() AS int4)
                    END) IS NOT NULL

bound to the client's deadline (timestamptz, in binary). Before the deadline it returns no
row (`SELECT 0`). After it the cast fails (22P02, the text naming query_wait_timeout), and
PostgreSQL skips the rest of the segment up to the client's Sync, which it answers with
ReadyForQuery 'I': the client's transaction never started. The volatile clock_timestamp()
keeps the cast from being folded at plan time, with custom and generic plans alike; every
name is schema-qualified, so no search_path can change what it calls.

The statement is parsed on a server once, lazily, in the first segment that needs it (as an
injected Parse is: reply swallowed), under a name the Registry never hands out; it is parsed
again after DEALLOCATE ALL or DISCARD ALL, and closed first if the server may or may not
have it (after `distrust`). Every reply of the guard's is swallowed (OP_GUARD). Its deadline
error calls `Guard.on_failed`, through which the glue refuses the client; an error of any
other kind (the statement lost behind the pooler's back, a cancel that landed on it) is
forwarded to the client as the error of its transaction, which did not run either.

It never looks at a clock: the deadline is the glue's.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from ...protocol import messages as m
from .registry import PREFIX
from .requests import (
    FORWARD,
    NO_SUCH_STATEMENT,
    OP_GUARD,
    R_OP,
    R_PAYLOAD,
    R_WAIT,
    SWALLOW,
    W_BIND,
    W_CLOSE,
    W_EXECUTE,
    W_PARSE,
    Request,
    close_statement,
    parse_message,
)
from .sql import SqlNames

if TYPE_CHECKING:
    from ..pool import PoolStats
    from .registry import Registry

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

# What became of one guard.
PENDING: Final = 0  # its verdict is still to come
PASSED: Final = 1  # the deadline had not passed: the client's transaction ran after it
FAILED: Final = 2  # the deadline had passed: the server skipped the client's transaction
SKIPPED: Final = 3  # another error came first (forwarded): the transaction did not run


def guard_bind(deadline: float) -> bytes:
    """The Bind of the guard statement to `deadline` (seconds since the epoch, UTC)."""
    micros = round((deadline - _POSTGRES_EPOCH) * 1e6)
    body = _BIND_HEAD + struct.pack("!qh", micros, 0)
    return b"B" + (len(body) + 4).to_bytes(4, "big") + body


class Guard:
    """The guard of one pipelined client's transaction."""

    def __init__(self, owner: Any, due: float, deadline: float,
                 on_verdict: Callable[[Guard], None]) -> None:
        self.owner = owner  # the client it guards (the glue's connection)
        self.due = due  # its deadline on the glue's monotonic clock
        self.deadline = deadline  # the same as wall-clock time, for the server
        self.state = PENDING
        # Told query_wait_timeout before the verdict came (the janitor, at due + a margin).
        self.refused = False
        # Called once, when the state becomes FAILED (the server skipped the transaction) or
        # PASSED (it began), from inside the reading of the server's replies.
        self.on_verdict = on_verdict

    def __repr__(self) -> str:
        return f"<Guard state={self.state} refused={self.refused}>"


class Guards(SqlNames):
    """The guard statement on one server, and the guards queued there."""

    def __init__(self, registry: Registry, cap: int, stats: PoolStats | None = None) -> None:
        super().__init__(registry, cap, stats)
        self.guard_statement = GUARD_ABSENT

    def queue_guard(self, guard: Guard) -> bytes:
        """Queue `guard` at the start of the segment about to be sent (the follower's, which
        must follow at once), and return its messages. They are not counted in the open
        segment (`open_count`), so the follower's own requests are folded into its Sync as
        they would be without it."""
        queue = self.queue
        was_empty = not queue
        segment = self.segment
        out = []
        if self.guard_statement != GUARD_PARSED:
            if self.guard_statement == GUARD_UNSURE:
                queue.append((W_CLOSE, True, OP_GUARD, None, None, segment, guard))
                out.append(GUARD_CLOSE)
            queue.append((W_PARSE, True, OP_GUARD, None, None, segment, guard))
            out.append(GUARD_PARSE)
            self.guard_statement = GUARD_PARSED
        queue.append((W_BIND, True, OP_GUARD, None, None, segment, guard))
        queue.append((W_EXECUTE, True, OP_GUARD, None, None, segment, guard))
        out.append(guard_bind(guard.deadline))
        out.append(GUARD_EXECUTE)
        if was_empty:
            self._retrack()
        return b"".join(out)

    def _guard_error(self, body: bytes, request: Request) -> int:
        """An ErrorResponse for one of the guard's requests: its deadline error is swallowed
        (and the guard FAILED); any other is the follower's, forwarded."""
        wait = request[R_WAIT]
        if wait == W_EXECUTE and GUARD_SQLSTATE in body and GUARD_MARK in body:
            request[R_PAYLOAD].state = FAILED
            return SWALLOW
        if wait == W_BIND and NO_SUCH_STATEMENT in body:
            # Dropped behind the pooler's back (a function running DEALLOCATE ALL): so may
            # the others have been.
            self.distrust("the guard statement was missing")
            self.guard_statement = GUARD_ABSENT
        elif wait != W_EXECUTE:
            self.guard_statement = GUARD_UNSURE
        fields = m.parse_error_fields(body)
        log.warning("query_wait_timeout guard failed: %s %s", fields.get("C"), fields.get("M"))
        return FORWARD

    def _settled(self, request: Request, ok: bool) -> None:
        if request[R_OP] != OP_GUARD:
            super()._settled(request, ok)
            return
        guard: Guard = request[R_PAYLOAD]
        wait = request[R_WAIT]
        if wait == W_EXECUTE:
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
        elif wait == W_PARSE and not ok:
            self.guard_statement = GUARD_UNSURE

    def distrust(self, why: str) -> None:
        super().distrust(why)
        if self.guard_statement == GUARD_PARSED:
            self.guard_statement = GUARD_UNSURE

    def clear(self) -> None:
        """As `SqlNames.clear`: the guard statement is gone too, unless a Parse of it is
        still queued behind the DEALLOCATE ALL or DISCARD ALL."""
        super().clear()
        self.guard_statement = GUARD_ABSENT
        for request in self.queue:
            if request[R_OP] == OP_GUARD and request[R_WAIT] == W_PARSE:
                self.guard_statement = GUARD_PARSED

    def close(self) -> None:
        super().close()
        self.guard_statement = GUARD_ABSENT
