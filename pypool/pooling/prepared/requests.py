"""The vocabulary of the request queue (see rewriter.py): what a queued request waits for,
what happens when it completes or is skipped, the verdicts on a server reply, and the few
frontend and backend messages the pooler makes up itself.

A request is a plain tuple, `(wait, swallow, op, stmt, client name, segment, payload)`, and
the common ones are shared constants. (As Python, queueing one allocates nothing; compiled,
mypyc holds tuples unboxed and boxes a new one where it is queued, so compare them with ==,
never `is`.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from ...protocol import messages as m

if TYPE_CHECKING:
    from .registry import Statement

# What completes a queued request.
W_SYNTHETIC: Final = 0  # nothing from the server: the pooler answers when it reaches the head
W_PARSE: Final = 1  # ParseComplete
W_BIND: Final = 2  # BindComplete
W_CLOSE: Final = 3  # CloseComplete
W_DESCRIBE: Final = 4  # RowDescription or NoData (after a ParameterDescription for a statement)
W_EXECUTE: Final = 5  # CommandComplete, EmptyQueryResponse or PortalSuspended
W_SYNC: Final = 6  # ReadyForQuery of a Sync; an error skip stops here
W_READY: Final = 7  # ReadyForQuery of a Query or FunctionCall; skipped after an error like the rest

# What to do when a request completes (ok) or is skipped after an error (failed).
OP_NONE: Final = 0
OP_PARSE: Final = 1  # the client's named Parse, sent: failed -> forget in server and client maps
OP_PARSE_HIT: Final = 2  # the client's named Parse, answered by the pooler: failed -> forget it
OP_INJECT: Final = 3  # the pooler's Parse before a Bind/Describe: failed -> forget in server map
OP_EVICT: Final = 4  # the pooler's Close of an LRU statement: ok -> drop ref; failed -> back in LRU
OP_CLOSE: Final = 5  # the client's Close, answered by the pooler: ok -> drop ref; failed -> restore
OP_NAMED: Final = 6  # Bind/Describe of a named statement: kept to name it in a server error
OP_SQL: Final = 7  # the client's PREPARE/DEALLOCATE query: applied when its tag confirms it
OP_HIDDEN: Final = 8  # the pooler's own SQL-level PREPARE/DEALLOCATE: failed -> forget the name
OP_FAIL: Final = 9  # a Describe of PROBE sent to make the server fail: its error is replaced
OP_RENAME: Final = 10  # a Sync standing for a whole segment of plain requests (see _sync)
OP_DISTRUST: Final = 11  # a Sync or Query that may change the server's statements unseen:
#                          done -> forget the server's cache (ServerStatements.distrust)
OP_STALE: Final = 12  # the pooler's Close of a statement the server may have lost or kept,
#                       before it is parsed again: failed -> still unsure
OP_GUARD: Final = 13  # a request of the query_wait_timeout guard before a pipelined client's
#                       transaction (guard.py): payload the Guard; its deadline error swallowed
UNDOABLE: Final = frozenset((OP_PARSE, OP_PARSE_HIT, OP_INJECT, OP_EVICT, OP_CLOSE, OP_SQL,
                             OP_HIDDEN, OP_DISTRUST, OP_STALE))

# A request: (wait, swallow, op, stmt, client name, segment, payload). `segment` counts the
# Syncs queued before it on this server; `payload` is the synthesised reply (W_SYNTHETIC) or
# the SqlCommand (OP_SQL).
Request = tuple[int, bool, int, "Statement | None", "bytes | None", int, Any]
# Its fields by name (a NamedTuple would cost a Python-level constructor per request, and
# mypyc boxes it: measured 2.5x slower to queue and read than a plain tuple).
R_WAIT: Final = 0
R_SWALLOW: Final = 1
R_OP: Final = 2
R_STMT: Final = 3
R_NAME: Final = 4
R_SEGMENT: Final = 5
R_PAYLOAD: Final = 6

PLAIN_PARSE: Final[Request] = (W_PARSE, False, OP_NONE, None, None, 0, None)
PLAIN_BIND: Final[Request] = (W_BIND, False, OP_NONE, None, None, 0, None)
PLAIN_CLOSE: Final[Request] = (W_CLOSE, False, OP_NONE, None, None, 0, None)
PLAIN_DESCRIBE: Final[Request] = (W_DESCRIBE, False, OP_NONE, None, None, 0, None)
PLAIN_EXECUTE: Final[Request] = (W_EXECUTE, False, OP_NONE, None, None, 0, None)
PLAIN_SYNC: Final[Request] = (W_SYNC, False, OP_NONE, None, None, 0, None)
HIDDEN_SYNC: Final[Request] = (W_SYNC, True, OP_NONE, None, None, 0, None)
PLAIN_QUERY: Final[Request] = (W_READY, False, OP_NONE, None, None, 0, None)

# Which reply completes which wait, indexed by the reply's type byte.
COMPLETES: Final = [-1] * 256
COMPLETES[ord("1")] = W_PARSE
COMPLETES[ord("2")] = W_BIND
COMPLETES[ord("3")] = W_CLOSE
COMPLETES[ord("T")] = W_DESCRIBE
COMPLETES[ord("n")] = W_DESCRIBE
COMPLETES[ord("C")] = W_EXECUTE
COMPLETES[ord("I")] = W_EXECUTE
COMPLETES[ord("s")] = W_EXECUTE

# Verdicts on a server reply.
FORWARD: Final = 0  # pass it to the client
SWALLOW: Final = 1  # the client must not see it
READY: Final = 2  # pass it: it is a ReadyForQuery the client is owed
REPLACE: Final = 3  # send `ServerStatements.replacement` instead

# A SQL-level name in `ServerStatements.sql` that the server may or may not have (after
# something ran there that the pooler could not follow): dropped with a Close, never fails.
UNSURE: Final = b""

# The SQLSTATE field of an ErrorResponse saying a prepared statement does not exist.
NO_SUCH_STATEMENT: Final = b"\x00C26000\x00"

PARSE_COMPLETE: Final = m.parse_complete()
CLOSE_COMPLETE: Final = m.close_complete()


class Wait:
    """Returned for a client message whose fate depends on a reply still owed."""

    def __repr__(self) -> str:
        return "WAIT"


WAIT: Final = Wait()


# --- messages the pooler makes up ---------------------------------------------------------


def quote_ident(name: bytes) -> bytes:
    return b'"' + name.replace(b'"', b'""') + b'"'


def query_message(text: bytes) -> bytes:
    return b"Q" + (len(text) + 5).to_bytes(4, "big") + text + b"\x00"


def close_statement(name: bytes) -> bytes:
    return b"C" + (len(name) + 6).to_bytes(4, "big") + b"S" + name + b"\x00"


def describe_statement(name: bytes) -> bytes:
    return b"D" + (len(name) + 6).to_bytes(4, "big") + b"S" + name + b"\x00"


def parse_message(name: bytes, key: bytes) -> bytes:
    return b"P" + (len(name) + len(key) + 5).to_bytes(4, "big") + name + b"\x00" + key


def error_message(sqlstate: str, text: str) -> bytes:
    return m.error_response(text, sqlstate, "ERROR")


def shown(name: bytes) -> str:
    return name.decode("utf-8", "replace")
