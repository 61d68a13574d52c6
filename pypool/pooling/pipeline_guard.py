"""The query_wait_timeout guard of a pipelined client: what keeps it refusable until its
transaction has started on the server (net/pipeline.py makes one per follower; the server's
ServerStatements queues its messages, pooling/prepared/guard_statement.py).

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

A `Guard` is the one guard's fate, as the request queue learns it from the server's replies:
PENDING, then PASSED (the transaction began), FAILED (its deadline had passed: the server
skipped it) or SKIPPED (another error came first, forwarded to the client). `on_verdict` is
called once, at PASSED or FAILED; the glue then sends on or refuses the client.

It owns no statement and no clock: the deadline is the glue's, the statement the server's
(guard_statement.py). It never imports asyncio.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

# What became of one guard.
PENDING: Final = 0  # its verdict is still to come
PASSED: Final = 1  # the deadline had not passed: the client's transaction ran after it
FAILED: Final = 2  # the deadline had passed: the server skipped the client's transaction
SKIPPED: Final = 3  # another error came first (forwarded): the transaction did not run


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
