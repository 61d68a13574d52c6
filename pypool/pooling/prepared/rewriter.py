"""One server's prepared statements, the rewriting of the linked client's messages for it,
and the queue that matches each of the server's replies to its request.

`ServerStatements.from_client` takes one client message and returns what to send instead;
`reply` takes one server message while `tracking` says replies must be read one by one and
returns a verdict; `pop_ready` is the hot path's ReadyForQuery. The theory of operation is
in this package's __init__.py.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Final

from ...protocol import errors
from ...protocol import messages as m
from .registry import (
    PROBE,
    ClientStatements,
    Registry,
    Statement,
    neutral_query,
    neutral_text,
    touches_text,
)
from .requests import (
    CLOSE_COMPLETE,
    COMPLETES,
    FORWARD,
    HIDDEN_SYNC,
    NO_SUCH_STATEMENT,
    OP_CLOSE,
    OP_DISTRUST,
    OP_EVICT,
    OP_FAIL,
    OP_HIDDEN,
    OP_INJECT,
    OP_NAMED,
    OP_NONE,
    OP_PARSE,
    OP_PARSE_HIT,
    OP_RENAME,
    OP_SQL,
    OP_STALE,
    PARSE_COMPLETE,
    PLAIN_BIND,
    PLAIN_CLOSE,
    PLAIN_DESCRIBE,
    PLAIN_EXECUTE,
    PLAIN_PARSE,
    PLAIN_QUERY,
    PLAIN_SYNC,
    READY,
    REPLACE,
    SWALLOW,
    UNDOABLE,
    UNSURE,
    W_BIND,
    W_CLOSE,
    W_DESCRIBE,
    W_PARSE,
    W_READY,
    W_SYNC,
    W_SYNTHETIC,
    WAIT,
    Request,
    Wait,
    close_statement,
    describe_statement,
    error_message,
    parse_message,
    query_message,
    quote_ident,
    shown,
)
from .sql import SQL_FIRST, SqlCommand, parse_sql_command

if TYPE_CHECKING:
    from ..pool import PoolStats

log = logging.getLogger("pypool.prepared")

# What follows the Bind in a libpq-style execution of a prepared statement (PQexecPrepared:
# Describe of the unnamed portal, Execute of it with no row limit, Sync; some drivers leave
# the Describe out).
_DESCRIBE_EXECUTE_SYNC: Final = m.describe_portal() + m.execute() + m.sync()
_EXECUTE_SYNC: Final = m.execute() + m.sync()


def _renamed_bind(data: bytes, pos: int, portal_end: int, name_end: int, end: int,
                  stmt: Statement) -> bytes:
    """The Bind at data[pos:end], whose statement name ends at `name_end`, naming `stmt`'s
    server-side name instead."""
    server_name = stmt.name
    size = end - pos - 1 - (name_end - portal_end - 1) + len(server_name)
    return b"".join((b"B", size.to_bytes(4, "big"), data[pos + 5 : portal_end + 1], server_name,
                     data[name_end:end]))


def driver_segment(data: bytes) -> int:
    """If `data` is exactly Bind, [Describe portal,] Execute, Sync of the unnamed portal (the
    steady state of libpq-style drivers), the end of the Bind; else 0."""
    if data[0] != 66 or len(data) < 20:  # B
        return 0
    bind_end = 1 + int.from_bytes(data[1:5], "big")
    tail = len(data) - bind_end
    if tail == 22:
        return bind_end if data.endswith(_DESCRIBE_EXECUTE_SYNC) else 0
    if tail == 15:
        return bind_end if data.endswith(_EXECUTE_SYNC) else 0
    return 0


def _ambiguous(renames: list[tuple[Statement, bytes]]) -> bool:
    """Whether one statement goes by two client names in these."""
    seen: dict[int, bytes] = {}
    return any(seen.setdefault(id(stmt), name) != name for stmt, name in renames)


class ServerStatements:
    """One server's prepared statements and the requests outstanding on it."""

    def __init__(self, registry: Registry, cap: int, stats: PoolStats | None = None) -> None:
        self.registry = registry
        self.cap = cap  # max_prepared_statements
        self.stats = stats
        self.lru: OrderedDict[Statement, int] = OrderedDict()  # -> epoch of last use
        # SQL-level name -> its PREPARE text, or UNSURE: the server may have it (see distrust)
        self.sql: OrderedDict[bytes, bytes] = OrderedDict()
        # Statements the server may or may not still have, since something ran there that
        # the pooler could not follow (`distrust`): closed first when parsed there again.
        self.stale: set[Statement] = set()
        self.queue: deque[Request] = deque()
        # How the server's replies must be read: 0 on the hot path (the queue is empty or
        # its head is a plain Sync or Query, done at the next ReadyForQuery), 1 one message
        # at a time against the queue, 2 the same but a synthesised reply is at the head and
        # must go to the client before the next server message.
        self.tracking = 0
        self.client: ClientStatements | None = None
        self.epoch = 0  # bumped at each link: statements used in this link are not evicted
        self.segment = 0  # Syncs queued so far
        # The transaction status of the last ReadyForQuery, and the requests queued and done
        # that end with one: while they differ, the status further on is not known yet.
        self.tx_status = 73  # "I"
        self.readies_queued = 0
        self.readies_done = 0
        # A server error came before the client's Sync: the server skips the client's
        # messages up to it, so they are dropped here (and not queued) until then.
        self.discarding = False
        # Whether the segment still open (no Sync yet) has requests whose replies need more
        # than forwarding; if not, its Sync stands in for all of them (`_sync`).
        self.open_fine = False
        self.open_count = 0  # requests queued since the last Sync
        self.open_renames: list[tuple[Statement, bytes]] = []  # their statement names
        # Whether the open segment, and the last one a Sync closed, can only end with the
        # server idle when they began with it idle: nothing in them but Binds of neutral
        # statements (Statement.neutral), Describe and Execute of portals, folded into one
        # Sync. The pooler may queue another client's transaction behind such a segment.
        self.open_neutral = True
        self.last_neutral: bool | None = False  # None: a simple Query, not looked at yet
        self._last_query = (b"", 0, 0)
        self.unnamed_neutral = False  # the last unnamed Parse sent here holds a neutral text
        self.unnamed_touches = False  # ... or one that may change the server's statements
        # The open segment runs a statement that may (Statement.touches): its Sync distrusts.
        self.open_touches = False
        self.blocked = False  # a WAIT was returned; the client waits for the queue to move
        # Requests whose effect an error may still undo, by segment: while an earlier
        # segment has some, a statement name is not looked up (WAIT), since its answer may
        # change. (Within one segment an error skips the rest anyway.)
        self.undoable: dict[int, int] = {}
        self.to_client: list[bytes] = []  # synthesised replies ready to go out
        self.replacement = b""  # the message to send for a REPLACE verdict

    # --- link and release -----------------------------------------------------------------

    def attach(self, client: ClientStatements) -> bytes:
        """A client is linked: returns the hidden queries that give this server the client's
        SQL-level statements (their replies are swallowed)."""
        self.client = client
        self.epoch += 1
        self.open_fine = False
        self.open_count = 0
        self.open_renames.clear()
        self.open_neutral = True
        self.last_neutral = False
        self.unnamed_neutral = False
        self.unnamed_touches = False
        self.open_touches = False
        if not client.sql:
            return b""
        out = []
        for name, text in client.sql.items():
            have = self.sql.get(name)
            if have == text:
                self.sql.move_to_end(name)
                continue
            if have is not None:
                out.append(self._drop_sql(name))
            out.append(self._hidden(text, name, text))
        while len(self.sql) > max(self.cap, len(client.sql)):
            name = next(iter(self.sql))
            if name in client.sql:
                self.sql.move_to_end(name)
                continue
            out.append(self._drop_sql(name))
        return b"".join(out)

    def detach(self) -> bool:
        """The client leaves. False if requests are still queued (a bug: close the server)."""
        self.client = None
        self.discarding = False
        self.blocked = False
        self.readies_queued = self.readies_done = 0
        self.undoable.clear()
        self.to_client.clear()
        if self.queue:
            self.close()
            return False
        return True

    def close(self) -> None:
        """The server is gone: give back every reference it held."""
        release = self.registry.release
        for stmt in self.lru:
            release(stmt)
        self.lru.clear()
        for request in self.queue:
            if request[2] in (OP_EVICT, OP_CLOSE) and request[3] is not None:
                release(request[3])
        self.queue.clear()
        self.readies_queued = self.readies_done = 0
        self.tracking = 0
        self.sql.clear()
        self.stale.clear()

    # --- client messages ------------------------------------------------------------------

    def from_client(self, kind: int, data: bytes, pos: int, end: int) -> bytes | Wait | None:
        """One client message at data[pos:end]: None to send it unchanged, bytes to send
        instead (b"" for nothing), or WAIT to hold it and everything after it for now.

        Only Parse, Bind, Describe and Close (and Query, for the SQL-level commands) need
        the whole message; for the others `end` may lie beyond the data."""
        if self.discarding:
            if kind != 83:  # S
                return b""
            self.discarding = False
        if kind == 81 and data[pos + 5] not in SQL_FIRST:  # Q: the simple protocol's hot path
            self.open_neutral = False
            # Looked at only if the pooler asks (`neutral_tail`): most Queries never are.
            self.last_neutral = None
            self._last_query = (data, pos + 5, end - 1)
            queue = self.queue
            queue.append(PLAIN_QUERY)  # `_push`, inlined; at the head it needs no tracking
            self.readies_queued += 1
            self.open_count += 1
            self.open_fine = True
            return None
        # The unnamed statement and portals, Execute: queued as they are (`_push`, inlined:
        # the hot path of every driver).
        if kind == 69:  # E
            plain = PLAIN_EXECUTE
        elif kind == 66:  # B
            if data[pos + 5] or data[pos + 6]:
                return self._bind(data, pos, end)
            if not self.unnamed_neutral:
                self.open_neutral = False
                if self.unnamed_touches:
                    self._touching()
            plain = PLAIN_BIND
        elif kind == 83:  # S
            self._sync()
            return None
        elif kind == 80:  # P
            if data[pos + 5]:
                self.open_neutral = False
                return self._parse(data, pos, end)
            # The unnamed statement (pgbench -M extended, most ORMs' one-off queries): its
            # text says whether a Bind of it is neutral.
            neutral = self.unnamed_neutral = neutral_text(data, pos + 6)
            self.unnamed_touches = not neutral and touches_text(data, pos + 6, end)
            plain = PLAIN_PARSE
        elif kind == 68:  # D
            if data[pos + 5] != 80:  # "P"
                return self._describe(data, pos, end)
            plain = PLAIN_DESCRIBE
        else:
            return self._other(kind, data, pos, end)
        queue = self.queue
        queue.append(plain)
        self.open_count += 1
        if len(queue) == 1:
            self.tracking = 1  # what _retrack would say of these at the head
        return None

    def neutral_tail(self) -> bool:
        """Whether the last segment (or simple Query) queued here is sure to end the
        transaction it began, if it began idle (see `last_neutral`)."""
        neutral = self.last_neutral
        if neutral is None:
            neutral = self.last_neutral = neutral_query(*self._last_query)
            self._last_query = (b"", 0, 0)
        return neutral

    def bind_segment(self, data: bytes, bind_end: int) -> bytes | None:
        """The steady state of libpq-style drivers in one call: `data` is exactly a Bind of
        a named statement (data[:bind_end]), then Describe and Execute of the unnamed portal
        (or Execute alone) and a Sync (see `driver_segment`). When the statement is on this
        server and nothing earlier is pending a decision, the segment is rewritten and queued
        as `from_client` message by message would end up doing (Bind renamed, the requests
        folded into the Sync); else None, and the caller goes message by message (which
        also reports a malformed Bind)."""
        if self.discarding or self.blocked or self.undoable or self.open_count:
            return None
        try:
            portal_end = data.index(0, 5, bind_end)
            name_end = data.index(0, portal_end + 1, bind_end)
        except ValueError:
            return None
        client = self.client
        if name_end == portal_end + 1 or client is None:
            return None
        name = data[portal_end + 1 : name_end]
        stmt = client.names.get(name)
        if stmt is None or stmt not in self.lru or stmt.touches:
            return None
        self._ensure(stmt)  # a hit: sends nothing
        if self.stats is not None:
            self.stats.bind_count += 1
        queue = self.queue
        queue.append((W_SYNC, False, OP_RENAME, None, None, self.segment, [(stmt, name)]))
        if len(queue) == 1:
            self.tracking = 0  # `_retrack` of a folded segment at the head; else unchanged
        self.readies_queued += 1
        self.segment += 1
        self.last_neutral = stmt.neutral
        return _renamed_bind(data, 0, portal_end, name_end, bind_end, stmt) + data[bind_end:]

    def _other(self, kind: int, data: bytes, pos: int, end: int) -> bytes | Wait | None:
        if kind != 72:  # anything but Flush
            self.open_neutral = False
        if kind == 81 or kind == 70:  # Q, F
            self.last_neutral = False
        if kind == 67:  # C
            return self._close(data, pos, end)
        if kind == 81:  # Q
            if data[pos + 5] in SQL_FIRST:
                return self._query(data, pos, end)
            self._push(PLAIN_QUERY)
            return None
        if kind == 70:  # F
            self._push(PLAIN_QUERY)
        return None  # Flush, CopyData, CopyDone, CopyFail: no reply of their own

    def _push(self, request: Request) -> None:
        queue = self.queue
        queue.append(request)
        self.open_count += 1
        wait = request[0]
        if wait >= W_SYNC:
            self.readies_queued += 1
        op = request[2]
        if op:
            if op in UNDOABLE:
                segment = request[5]
                self.undoable[segment] = self.undoable.get(segment, 0) + 1
            if op != OP_NAMED:
                self.open_fine = True
            elif wait < W_SYNC:
                stmt, name = request[3], request[4]
                assert stmt is not None and name is not None
                self.open_renames.append((stmt, name))
        if request[1] or wait == W_SYNTHETIC or wait >= W_SYNC:
            self.open_fine = True
        if len(queue) == 1:
            self._retrack()

    def _sync(self) -> None:
        """The client's Sync. When nothing in the segment it closes needs its reply read
        (plain requests, Binds of statements the server has: the steady state of every
        driver), the segment's requests are folded into the Sync: the hot path forwards
        their replies and is done at the ReadyForQuery. Only the statement names are kept,
        to name the client's in an error."""
        queue = self.queue
        request = PLAIN_SYNC
        neutral = self.open_neutral and not self.open_fine
        if self.open_touches:
            # A statement in it may drop the server's statements: forget them at its end,
            # and look no name up for later segments until then (undoable).
            self.open_touches = False
            request = (W_SYNC, False, OP_DISTRUST, None, None, self.segment, None)
            self.undoable[self.segment] = self.undoable.get(self.segment, 0) + 1
        elif not self.open_fine and self.open_count:
            # The segment's requests are the last ones queued (those already answered, if
            # any, were taken from the front).
            count = min(self.open_count, len(queue))
            renames = self.open_renames
            if len(renames) > 1 and _ambiguous(renames):
                count = 0  # two names for one statement: which failed? Keep them apart.
                neutral = False
            if count:
                for _ in range(count):
                    queue.pop()
                if renames:
                    request = (W_SYNC, False, OP_RENAME, None, None, self.segment, renames)
                    self.open_renames = []
        queue.append(request)
        self.readies_queued += 1
        self.segment += 1
        self.open_fine = False
        self.open_count = 0
        self.open_renames.clear()
        self.last_neutral = neutral
        self.open_neutral = True
        self._retrack()

    def _must_wait(self) -> bool:
        """Whether a request in an earlier segment may still be undone (see `undoable`)."""
        undoable = self.undoable
        if undoable and min(undoable) < self.segment:
            self.blocked = True
            return True
        return False

    def _status_known(self) -> bool:
        """Whether the server will not be in a failed transaction when it reaches what is
        queued next: no ReadyForQuery is owed before it and the last one was not "E". (An
        error in between makes the server skip it altogether.)"""
        return self.readies_queued == self.readies_done and self.tx_status != 69

    def _retrack(self) -> None:
        queue = self.queue
        if not queue:
            self.tracking = 0
            return
        head = queue[0]
        if head == PLAIN_QUERY or head == PLAIN_SYNC or head[2] == OP_RENAME:
            self.tracking = 0
        elif head[0] == W_SYNTHETIC:
            self.tracking = 2
        else:
            self.tracking = 1

    def _fail(self, sqlstate: str, text: str) -> bytes:
        """Answer the client's message with an error, as PostgreSQL would. The server is made
        to fail in its place (a Describe of a statement it does not have), so it skips to the
        Sync and aborts a transaction block just as it would have; its error is replaced."""
        self._push((W_DESCRIBE, False, OP_FAIL, None, None, self.segment,
                    error_message(sqlstate, text)))
        return describe_statement(PROBE)

    def _parse(self, data: bytes, pos: int, end: int) -> bytes | Wait | None:
        name_end = data.index(0, pos + 5, end)
        if name_end == pos + 5:
            self._push(PLAIN_PARSE)
            return None
        if self.undoable and self._must_wait():
            return WAIT
        name = data[pos + 5 : name_end]
        client = self.client
        assert client is not None
        segment = self.segment
        key = data[name_end + 1 : end]
        stats = self.stats
        if stats is not None:
            stats.client_parse_count += 1
        existing = client.names.get(name)
        if existing is not None:
            # A duplicate. Parsed under the name of a statement the server has, it fails
            # there as it would here: a syntax error first, 25P02 in a failed transaction,
            # else 42P05, with the name in the message changed back to the client's.
            lru = self.lru
            if existing in lru or not lru:
                target = existing
                out = self._ensure(existing)
            else:
                target = next(reversed(lru))
                out = b""
            self._push((W_PARSE, False, OP_NAMED, target, name, segment, None))
            self.open_fine = True  # not folded: a ParseComplete would say the server lost it
            return out + parse_message(target.name, key)
        if name in client.sql:
            self._push(PLAIN_PARSE)  # the server has it under this name: 42P05 there
            return None
        if client.cap and len(client) >= client.cap:
            return self._fail(
                errors.PROGRAM_LIMIT_EXCEEDED,
                f"too many prepared statements for this client "
                f"(max_client_prepared_statements = {client.cap})",
            )
        registry = self.registry
        stmt = registry.acquire(key)
        client.names[name] = stmt
        lru = self.lru
        if stmt in lru:
            lru.move_to_end(stmt)
            lru[stmt] = self.epoch
            if stats is not None:
                stats.prepared_hits += 1
            if self._status_known():
                self._push((W_SYNTHETIC, False, OP_PARSE_HIT, stmt, name, segment,
                            PARSE_COMPLETE))
                return b""
            # The server might be in a failed transaction by then (25P02): let it parse the
            # body under a throwaway name and say.
            self._push((W_PARSE, False, OP_PARSE_HIT, stmt, name, segment, None))
            self._push((W_CLOSE, True, OP_NONE, None, None, segment, None))
            return parse_message(PROBE, key) + close_statement(PROBE)
        if stats is not None:
            stats.prepared_misses += 1
            stats.server_parse_count += 1
        out = self._make_room()
        if self.stale and stmt in self.stale:
            out += self._close_stale(stmt)
        registry.hold(stmt)
        lru[stmt] = self.epoch
        self._push((W_PARSE, False, OP_PARSE, stmt, name, segment, None))
        return out + stmt.parse_message()

    def _bind(self, data: bytes, pos: int, end: int) -> bytes | Wait | None:
        portal_end = data.index(0, pos + 5, end)
        name_end = data.index(0, portal_end + 1, end)
        if name_end == portal_end + 1:
            self._push(PLAIN_BIND)
            return None
        if self.undoable and self._must_wait():
            return WAIT
        name = data[portal_end + 1 : name_end]
        client = self.client
        assert client is not None
        stmt = client.names.get(name)
        if stmt is None:
            self.open_neutral = False
            if name in client.sql:
                self._push(PLAIN_BIND)
                return None
            return self._fail(errors.INVALID_SQL_STATEMENT_NAME,
                              f'prepared statement "{shown(name)}" does not exist')
        if not stmt.neutral:
            self.open_neutral = False
            if stmt.touches:
                self._touching()
        out = self._ensure(stmt)
        if self.stats is not None:
            self.stats.bind_count += 1
        queue = self.queue
        queue.append((W_BIND, False, OP_NAMED, stmt, name, 0, None))  # _push, inlined
        self.open_count += 1
        self.open_renames.append((stmt, name))
        if len(queue) == 1:
            self.tracking = 1
        return out + _renamed_bind(data, pos, portal_end, name_end, end, stmt)

    def _describe(self, data: bytes, pos: int, end: int) -> bytes | Wait | None:
        if data[pos + 5] != 83 or end - pos <= 7:  # a portal, or the unnamed statement
            self._push(PLAIN_DESCRIBE)
            return None
        if self.undoable and self._must_wait():
            return WAIT
        name = data[pos + 6 : end - 1]
        client = self.client
        assert client is not None
        stmt = client.names.get(name)
        if stmt is None:
            if name in client.sql:
                self._push(PLAIN_DESCRIBE)
                return None
            return self._fail(errors.INVALID_SQL_STATEMENT_NAME,
                              f'prepared statement "{shown(name)}" does not exist')
        out = self._ensure(stmt)
        self._push((W_DESCRIBE, False, OP_NAMED, stmt, name, 0, None))
        server_name = stmt.name
        return out + b"D" + (len(server_name) + 6).to_bytes(4, "big") + b"S" + server_name + b"\0"

    def _close(self, data: bytes, pos: int, end: int) -> bytes | Wait | None:
        if data[pos + 5] != 83 or end - pos <= 7:  # a portal, or the unnamed statement
            self._push(PLAIN_CLOSE)
            return None
        if self.undoable and self._must_wait():
            return WAIT
        name = data[pos + 6 : end - 1]
        client = self.client
        assert client is not None
        stmt = client.names.pop(name, None)
        if stmt is not None:
            # The server keeps the plan for whoever parses the same body next; the queue
            # entry holds the client's reference until the CloseComplete goes out.
            self._push((W_SYNTHETIC, False, OP_CLOSE, stmt, name, self.segment, CLOSE_COMPLETE))
            return b""
        if name in client.sql:
            del client.sql[name]
            self.sql.pop(name, None)
            self._push(PLAIN_CLOSE)
            return None
        # Closing a statement that does not exist is no error in PostgreSQL either.
        self._push((W_SYNTHETIC, False, OP_NONE, None, None, self.segment, CLOSE_COMPLETE))
        return b""

    def _query(self, data: bytes, pos: int, end: int) -> bytes | Wait | None:
        command = parse_sql_command(data[pos + 5 : end - 1])
        client = self.client
        if command is None or client is None:
            if client is not None and touches_text(data, pos + 5, end - 1):
                # A DO block or the like that may change the server's statements unseen.
                if self.undoable and self._must_wait():
                    return WAIT
                self._push((W_READY, False, OP_DISTRUST, None, None, self.segment, None))
                self.segment += 1  # like a Sync: an error in it skips nothing after it
                return None
            self._push(PLAIN_QUERY)
            return None
        if self.undoable and self._must_wait():
            return WAIT
        name = command.name
        out = b""
        message: bytes | None = None
        request = PLAIN_QUERY
        if command.verb == b"prepare":
            if name not in client.sql and name in self.sql:
                out = self._drop_sql(name)
            request = (W_READY, False, OP_SQL, None, name, self.segment, command)
        elif command.verb == b"discard" or not name:
            pass  # DISCARD ..., DEALLOCATE ALL: the CommandComplete tag tells what happened
        elif name in client.sql:
            if command.verb == b"deallocate":
                request = (W_READY, False, OP_SQL, None, name, self.segment, command)
        elif name in client.names:
            # SQL EXECUTE/DEALLOCATE of a protocol-level statement: use the server's name.
            stmt = client.names[name]
            if stmt in self.lru:
                self._ensure(stmt)  # a hit: sends nothing
            elif self.readies_queued != self.readies_done:
                self.blocked = True  # a Parse would fail if the transaction fails first
                return WAIT
            elif self.tx_status != 69:  # in a failed transaction the query fails anyway
                # A failed Parse would make the server skip the Query too, and the client
                # would wait for its ReadyForQuery forever: end the Parse with a Sync.
                out = self._inject(stmt) + m.sync()
                self._push(HIDDEN_SYNC)
                self.segment += 1
                self.open_fine = False
            text = command.text
            message = query_message(text[: command.start] + quote_ident(stmt.name)
                                     + text[command.end :])
            if command.verb == b"deallocate":
                command.stmt = stmt
                request = (W_READY, False, OP_SQL, stmt, name, self.segment, command)
            else:
                request = (W_READY, False, OP_NAMED, stmt, name, self.segment, None)
        elif name in self.sql:
            # Another client's statement of that name: drop it so the client's query fails
            # (or succeeds) as it would on a connection of its own.
            out = self._drop_sql(name)
        self._push(request)
        if message is None:
            return out + data[pos:end] if out else None
        return out + message

    def _hidden(self, text: bytes, name: bytes, prepared: bytes | None) -> bytes:
        """Queue a pooler-issued SQL-level PREPARE (`prepared` is its text) or DEALLOCATE."""
        before = self.sql.get(name)
        if prepared is None:
            self.sql.pop(name, None)
        else:
            self.sql[name] = prepared
        self._push((W_READY, True, OP_HIDDEN, None, name, self.segment, (prepared, before)))
        return query_message(text)

    def _drop_sql(self, name: bytes) -> bytes:
        """Drop the SQL-level statement `name` from the server: a hidden DEALLOCATE, or where
        the server may not have it (UNSURE), a Close and Sync, which never fail (not even in
        a failed transaction block). The Sync would end a segment of the client's still
        open (an extended request queued last), so then the DEALLOCATE, whose error is
        swallowed."""
        queue = self.queue
        if self.sql.get(name) != UNSURE or (queue and queue[-1][0] < W_SYNC):
            return self._hidden(b"DEALLOCATE " + quote_ident(name), name, None)
        del self.sql[name]
        self._push((W_CLOSE, True, OP_NONE, None, None, self.segment, None))
        self._push(HIDDEN_SYNC)
        self.segment += 1
        return close_statement(name) + m.sync()

    def _touching(self) -> None:
        """A Bind in the open segment runs a statement that may change the server's
        statements (Statement.touches): its Sync distrusts the cache."""
        self.open_touches = True
        self.open_fine = True  # not folded: the Sync's reply is read

    def _ensure(self, stmt: Statement) -> bytes:
        """What to send first so the server has `stmt` (b"" if it has it already)."""
        lru = self.lru
        if stmt in lru:
            lru.move_to_end(stmt)
            lru[stmt] = self.epoch
            if self.stats is not None:
                self.stats.prepared_hits += 1
            return b""
        return self._inject(stmt)

    def _inject(self, stmt: Statement) -> bytes:
        stats = self.stats
        if stats is not None:
            stats.prepared_misses += 1
            stats.server_parse_count += 1
        out = self._make_room()
        if self.stale and stmt in self.stale:
            out += self._close_stale(stmt)
        self.registry.hold(stmt)
        self.lru[stmt] = self.epoch
        self._push((W_PARSE, True, OP_INJECT, stmt, None, self.segment, None))
        return out + stmt.parse_message()

    def _close_stale(self, stmt: Statement) -> bytes:
        """The server may still have `stmt` (see `stale`): close it before parsing it again,
        so that the Parse cannot fail with 42P05."""
        self.stale.discard(stmt)
        self._push((W_CLOSE, True, OP_STALE, stmt, None, self.segment, None))
        return close_statement(stmt.name)

    def distrust(self, why: str) -> None:
        """Something ran on the server that the pooler could not follow and that may have
        dropped prepared statements (a DO block running DEALLOCATE ALL, a function, a
        DEALLOCATE in a multi-statement query), or a Bind found one missing (26000). The
        cache cannot be trusted: forget it. Each statement is parsed again where it is next
        used, closed first in case it survived (`stale`); SQL-level names become UNSURE."""
        log.debug("server's prepared statements forgotten: %s", why)
        lru = self.lru
        stale = self.stale
        if stale:  # keep it to statements still in use, which may be parsed here again
            for stmt in [s for s in stale if s.refs <= 0]:
                stale.discard(stmt)
        if lru:
            release = self.registry.release
            for stmt in lru:
                stale.add(stmt)
                release(stmt)
            lru.clear()
        sql = self.sql
        for name in sql:
            sql[name] = UNSURE

    def _make_room(self) -> bytes:
        """Close least recently used statements until one more fits."""
        lru = self.lru
        out = b""
        while len(lru) >= self.cap > 0:
            stmt, used = next(iter(lru.items()))
            if used == self.epoch:
                break  # all used by this link's transaction: exceed the cap until the next
            del lru[stmt]
            if self.stats is not None:
                self.stats.prepared_evictions += 1
            # The queue entry owns the LRU's reference until the CloseComplete arrives.
            self._push((W_CLOSE, True, OP_EVICT, stmt, None, self.segment, None))
            out += close_statement(stmt.name)
        return out

    # --- server replies -------------------------------------------------------------------

    def reply(self, kind: int, body: bytes) -> int:
        """A whole server message while `tracking`; `body` is given for CommandComplete,
        ErrorResponse and ReadyForQuery. Returns the verdict; synthesised replies that must
        follow it are left in `to_client`."""
        queue = self.queue
        if not queue:
            return READY if kind == 90 else FORWARD
        head = queue[0]
        wait = head[0]
        if wait >= W_SYNC:
            if kind == 90:  # Z
                queue.popleft()
                self.readies_done += 1
                self.tx_status = body[0]
                if head[2]:
                    self._settle(head, True)
                self._advance()
                return SWALLOW if head[1] else READY
            if kind == 67:  # C
                if head[2] == OP_SQL:
                    head[6].tags += 1
                self._command_tag(body)
            elif kind == 69:  # E
                if head[2] == OP_SQL or head[2] == OP_NAMED:
                    if head[2] == OP_SQL:
                        head[6].failed = True
                    if head[3] is not None:
                        return self._rename_error(body, head)
                elif head[2] == OP_HIDDEN:
                    # Undone now; settled (done with) at its ReadyForQuery, like the rest.
                    self._undo_hidden(head)
                    fields = m.parse_error_fields(body)
                    log.warning("pooler-issued statement failed: %s %s", fields.get("C"),
                                fields.get("M"))
            return SWALLOW if head[1] else FORWARD
        assert wait != W_SYNTHETIC, "emit_synthetic() comes first while tracking == 2"
        if kind == 69:  # E: the head failed, the server skips to the next Sync
            verdict = FORWARD
            if head[2] == OP_NAMED:
                verdict = self._rename_error(body, head)
            elif head[2] == OP_FAIL:
                self.replacement = head[6]
                verdict = REPLACE
            self._skip_to_sync()
            return verdict
        if COMPLETES[kind] == wait:
            queue.popleft()
            if head[2]:
                self._settle(head, True)
            if kind == 67:
                self._command_tag(body)
            self._advance()
            return SWALLOW if head[1] else FORWARD
        return FORWARD  # DataRow, ParameterDescription, NoticeResponse, Copy*, ...

    def pop_ready(self, status: int) -> None:
        """A ReadyForQuery went by on the hot path: its request (a plain Sync or Query at the
        head) is done."""
        queue = self.queue
        queue.popleft()
        self.readies_done += 1
        self.tx_status = status
        if queue:
            self._advance()

    def emit_synthetic(self) -> bytes:
        """Answer the requests at the head that the pooler answers itself."""
        queue = self.queue
        out = []
        while queue and queue[0][0] == W_SYNTHETIC:
            request = queue.popleft()
            out.append(request[6])
            if request[2]:
                self._settle(request, True)
        self._retrack()
        return b"".join(out)

    def renamed_error(self, body: bytes) -> bytes | None:
        """An ErrorResponse on the hot path while a folded segment is at the head (see
        `_sync`): the message with the client's statement name, or None if unchanged."""
        queue = self.queue
        if not queue or queue[0][2] != OP_RENAME:
            return None
        for stmt, name in queue[0][6]:
            ours = b'"' + stmt.name + b'"'
            if ours in body:
                if NO_SUCH_STATEMENT in body:
                    self.distrust("a Bind found it missing")
                renamed = body.replace(ours, b'"' + name + b'"')
                break
        else:
            return None
        return b"E" + (len(renamed) + 4).to_bytes(4, "big") + renamed

    def command_tag(self, body: bytes) -> None:
        """A CommandComplete seen on the hot path (the glue calls this for tags with 'D')."""
        self._command_tag(body)

    def _advance(self) -> None:
        queue = self.queue
        if queue and queue[0][0] == W_SYNTHETIC:
            self.to_client.append(self.emit_synthetic())
        else:
            self._retrack()

    def _skip_to_sync(self) -> None:
        queue = self.queue
        skipped = []
        while queue and queue[0][0] != W_SYNC:
            request = queue.popleft()
            if request[0] >= W_SYNC:
                self.readies_done += 1  # a Query after the error: skipped, no ReadyForQuery
            skipped.append(request)
        if not queue:
            self.discarding = True  # the client's Sync is still to come
        for request in reversed(skipped):
            if request[2]:
                self._settle(request, False)
        self._retrack()

    def _rename_error(self, body: bytes, request: Request) -> int:
        """A Bind or Describe failed naming our statement: name the client's instead."""
        stmt, name = request[3], request[4]
        assert stmt is not None and name is not None
        ours = b'"' + stmt.name + b'"'
        if ours not in body:
            return FORWARD
        if NO_SUCH_STATEMENT in body:
            # The server lost a statement the pooler prepared there. This request fails (its
            # reply was the error); later ones find the statement parsed again.
            self.distrust("a Bind or Describe found it missing")
        body = body.replace(ours, b'"' + name + b'"')
        self.replacement = b"E" + (len(body) + 4).to_bytes(4, "big") + body
        return REPLACE

    def _settle(self, request: Request, ok: bool) -> None:
        op = request[2]
        stmt = request[3]
        name = request[4]
        if op in UNDOABLE:
            segment = request[5]
            left = self.undoable[segment] - 1
            if left:
                self.undoable[segment] = left
            else:
                del self.undoable[segment]
        if op == OP_PARSE or op == OP_INJECT or op == OP_PARSE_HIT:
            assert stmt is not None
            if ok:
                if op != OP_PARSE_HIT and stmt not in self.lru:
                    # Forgotten meanwhile (an earlier Parse of it failed): it exists now.
                    self.registry.hold(stmt)
                    self.lru[stmt] = self.epoch
                return
            if op != OP_PARSE_HIT:
                self._forget_server(stmt)
            if name is not None:
                self._forget_client(name, stmt)
        elif op == OP_EVICT:
            assert stmt is not None
            if ok or stmt in self.lru:
                self.registry.release(stmt)
            else:
                self.lru[stmt] = 0
                self.lru.move_to_end(stmt, last=False)
        elif op == OP_CLOSE:
            assert stmt is not None and name is not None
            client = self.client
            if ok or client is None or name in client.names:
                self.registry.release(stmt)
            else:
                client.names[name] = stmt
        elif op == OP_SQL:
            if ok:
                self._sql_done(request)
        elif op == OP_DISTRUST:
            if ok:
                self.distrust("a query that may deallocate ran")
        elif op == OP_STALE:
            if not ok:
                assert stmt is not None
                self.stale.add(stmt)  # skipped: the server may still have it
        elif op == OP_NAMED:
            if ok and request[0] == W_PARSE and stmt is not None:
                # A duplicate Parse, sent under the name of a statement the server should
                # have, succeeded: the server had lost it, and now has another text under
                # its name. Close that before it is parsed here again.
                self.distrust("a duplicate Parse found it missing")
                self.stale.add(stmt)
        elif op == OP_HIDDEN:
            if not ok:
                self._undo_hidden(request)

    def _undo_hidden(self, request: Request) -> None:
        """A pooler-issued PREPARE or DEALLOCATE failed or was skipped: the server's names
        are as they were."""
        name = request[4]
        if name is None:
            return
        prepared, before = request[6]
        if before is None:
            self.sql.pop(name, None)
        elif self.sql.get(name) in (prepared, None):
            self.sql[name] = before

    def _sql_done(self, request: Request) -> None:
        """A client's PREPARE or DEALLOCATE query completed: apply it if it succeeded."""
        command: SqlCommand = request[6]
        client = self.client
        if not command.tags or client is None:
            return  # the command itself failed: nothing changed
        name = command.name
        if command.failed or command.tags != 1:
            # Several statements in one query: not ours to replay, and what the others did
            # is not known. A PREPARE that ran stays on the server (a later error does not
            # undo it), under a text that is not the query's.
            self.distrust("a multi-statement query that prepares or deallocates ran")
            if command.verb == b"prepare":
                self.sql[name] = UNSURE
            return
        if command.verb == b"prepare":
            client.sql[name] = command.text
            self.sql[name] = command.text
        elif command.stmt is not None:  # DEALLOCATE of a protocol-level statement
            self._forget_client(name, command.stmt)
            self._forget_server(command.stmt)
        else:
            client.sql.pop(name, None)
            self.sql.pop(name, None)

    def _forget_server(self, stmt: Statement) -> None:
        if stmt in self.lru:
            del self.lru[stmt]
            self.registry.release(stmt)

    def _forget_client(self, name: bytes, stmt: Statement) -> None:
        client = self.client
        if client is not None and client.names.get(name) is stmt:
            del client.names[name]
            self.registry.release(stmt)

    def _command_tag(self, body: bytes) -> None:
        if body[:1] != b"D":
            return
        if body.startswith(b"DEALLOCATE ALL") or body.startswith(b"DISCARD ALL"):
            self.clear()
        elif body.startswith(b"DEALLOCATE\x00"):
            queue = self.queue
            op = queue[0][2] if queue else OP_NONE
            if op != OP_SQL and op != OP_HIDDEN:
                # Not one the pooler follows (`SELECT 1; DEALLOCATE x`): which one is unknown.
                self.distrust("an untracked DEALLOCATE ran")

    def clear(self) -> None:
        """The server dropped every prepared statement (DEALLOCATE ALL, DISCARD ALL): so did
        the linked client. Parses still queued behind it will exist again."""
        release = self.registry.release
        for stmt in self.lru:
            release(stmt)
        self.lru.clear()
        self.sql.clear()
        self.stale.clear()
        client = self.client
        if client is not None:
            for stmt in client.names.values():
                release(stmt)
            client.names.clear()
            client.sql.clear()
        for request in self.queue:
            op, queued, name = request[2], request[3], request[4]
            if queued is None or op not in (OP_PARSE, OP_PARSE_HIT, OP_INJECT):
                continue
            if op != OP_PARSE_HIT and queued not in self.lru:
                self.registry.hold(queued)
                self.lru[queued] = self.epoch
            if client is not None and name is not None and name not in client.names:
                self.registry.hold(queued)
                client.names[name] = queued
