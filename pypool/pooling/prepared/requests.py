"""The vocabulary of the request queue (request_queue.py): a queued `Request`, what it waits
for (`Wait`), what happens when it completes or is skipped (`Op`), how replies are read
(`Tracking`), the verdicts on a server reply (`Verdict`), and the few frontend and backend
messages the pooler makes up itself.

The code sets are classes of Final ints, not Enums: they are read on every message, and
compiled, a Final int is a constant (as ClientEvent in core/states.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from ...protocol import messages as m

if TYPE_CHECKING:
    from .registry import Statement


class Wait:
    """What completes a queued request."""

    SYNTHETIC: Final = 0  # nothing from the server: the pooler answers when it is at the head
    PARSE: Final = 1  # ParseComplete
    BIND: Final = 2  # BindComplete
    CLOSE: Final = 3  # CloseComplete
    DESCRIBE: Final = 4  # RowDescription or NoData (after a ParameterDescription for a statement)
    EXECUTE: Final = 5  # CommandComplete, EmptyQueryResponse or PortalSuspended
    SYNC: Final = 6  # ReadyForQuery of a Sync; an error skip stops here
    READY: Final = 7  # ReadyForQuery of a Query or FunctionCall; an error skips it like the rest


class Op:
    """What to do when a request completes (ok) or is skipped after an error (failed)."""

    NONE: Final = 0
    PARSE: Final = 1  # the client's named Parse, sent: failed -> forget in server and client maps
    PARSE_HIT: Final = 2  # the client's named Parse, answered by the pooler: failed -> forget it
    INJECT: Final = 3  # the pooler's Parse before a Bind/Describe: failed -> forget in server map
    EVICT: Final = 4  # the pooler's Close of an LRU statement: ok -> drop ref; failed -> to LRU
    CLOSE: Final = 5  # the client's Close, answered by the pooler: ok -> drop ref; failed -> back
    NAMED: Final = 6  # Bind/Describe of a named statement: kept to name it in a server error
    SQL: Final = 7  # the client's PREPARE/DEALLOCATE query: applied when its tag confirms it
    HIDDEN: Final = 8  # the pooler's own SQL-level PREPARE/DEALLOCATE: failed -> forget the name
    FAIL: Final = 9  # a Describe of PROBE sent to make the server fail: its error is replaced
    RENAME: Final = 10  # a Sync standing for a whole segment of plain requests (see `fold`)
    DISTRUST: Final = 11  # a Sync or Query that may change the server's statements unseen:
    #                       done -> forget the server's cache (ServerStatements.distrust)
    STALE: Final = 12  # the pooler's Close of a statement the server may have lost or kept,
    #                    before it is parsed again: failed -> still unsure
    GUARD: Final = 13  # a request of the query_wait_timeout guard before a pipelined client's
    #                    transaction (guard_statement.py): payload the Guard; its deadline
    #                    error swallowed


# Operations an error may undo (see RequestQueue.undoable).
UNDOABLE: Final = frozenset((Op.PARSE, Op.PARSE_HIT, Op.INJECT, Op.EVICT, Op.CLOSE, Op.SQL,
                             Op.HIDDEN, Op.DISTRUST, Op.STALE))


class Tracking:
    """How the server's replies must be read (RequestQueue.tracking)."""

    HOT: Final = 0  # the hot path: the queue is empty or its head is a plain Sync or Query (or
    #                 a folded segment), done at the next ReadyForQuery
    EACH: Final = 1  # one message at a time, matched to the request at the queue's head
    SYNTHETIC: Final = 2  # as EACH, but a reply the pooler makes is at the head: it goes to the
    #                       client before the next server message


class Verdict:
    """What the glue does with a server reply read while tracking (RequestQueue.reply)."""

    FORWARD: Final = 0  # pass it to the client
    SWALLOW: Final = 1  # the client must not see it
    READY: Final = 2  # pass it: it is a ReadyForQuery the client is owed
    REPLACE: Final = 3  # send `RequestQueue.replacement` instead


# The verdicts under their old names, which the glue and tests use.
FORWARD: Final = Verdict.FORWARD
SWALLOW: Final = Verdict.SWALLOW
READY: Final = Verdict.READY
REPLACE: Final = Verdict.REPLACE


class Request:
    """One request sent to the server on the client's behalf (or answered by the pooler).

    The common ones are shared constants (PLAIN_*): never change a Request's fields after it
    is made. Compiled, this is a native class: making one is one allocation and reading a
    field one load, no dearer than the plain tuple it replaced."""

    __slots__ = ("wait", "swallow", "op", "stmt", "name", "segment", "payload")

    def __init__(self, wait: int, swallow: bool = False, op: int = Op.NONE,
                 stmt: Statement | None = None, name: bytes | None = None, segment: int = 0,
                 payload: Any = None) -> None:
        self.wait = wait  # Wait: the reply that completes it
        self.swallow = swallow  # whether that reply is kept from the client
        self.op = op  # Op: what its completion or skip does
        self.stmt = stmt  # the Statement it is about, if any
        self.name = name  # the client's name for it (or a SQL-level name)
        self.segment = segment  # the Syncs queued before it on this server
        # The synthesised reply (Wait.SYNTHETIC), the replacement error (Op.FAIL), the
        # SqlCommand (Op.SQL), (text, before) (Op.HIDDEN), the folded names (Op.RENAME), or
        # the Guard (Op.GUARD).
        self.payload = payload

    def __repr__(self) -> str:
        return (f"<Request wait={self.wait} op={self.op} swallow={self.swallow} "
                f"name={self.name!r} segment={self.segment}>")


PLAIN_PARSE: Final = Request(Wait.PARSE)
PLAIN_BIND: Final = Request(Wait.BIND)
PLAIN_CLOSE: Final = Request(Wait.CLOSE)
PLAIN_DESCRIBE: Final = Request(Wait.DESCRIBE)
PLAIN_EXECUTE: Final = Request(Wait.EXECUTE)
PLAIN_SYNC: Final = Request(Wait.SYNC)
HIDDEN_SYNC: Final = Request(Wait.SYNC, True)
PLAIN_QUERY: Final = Request(Wait.READY)

# Which reply completes which wait, indexed by the reply's type byte.
COMPLETES: Final = [-1] * 256
COMPLETES[ord("1")] = Wait.PARSE
COMPLETES[ord("2")] = Wait.BIND
COMPLETES[ord("3")] = Wait.CLOSE
COMPLETES[ord("T")] = Wait.DESCRIBE
COMPLETES[ord("n")] = Wait.DESCRIBE
COMPLETES[ord("C")] = Wait.EXECUTE
COMPLETES[ord("I")] = Wait.EXECUTE
COMPLETES[ord("s")] = Wait.EXECUTE

# A SQL-level name in `ServerStatements.sql` that the server may or may not have (after
# something ran there that the pooler could not follow): dropped with a Close, never fails.
UNSURE: Final = b""

# The SQLSTATE field of an ErrorResponse saying a prepared statement does not exist.
NO_SUCH_STATEMENT: Final = b"\x00C26000\x00"

PARSE_COMPLETE: Final = m.parse_complete()
CLOSE_COMPLETE: Final = m.close_complete()


class Hold:
    """The type of WAIT: returned for a client message whose fate depends on a reply still
    owed (the glue holds it, and what follows it, until the queue moves on)."""

    def __repr__(self) -> str:
        return "WAIT"


WAIT: Final = Hold()


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
