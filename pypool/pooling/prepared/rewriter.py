"""The rewriting of the linked client's Parse, Bind, Describe, Close and Sync for one
server: `ServerStatements`, the class the glue (net/client.py, net/server.py) holds per
server.

`ServerStatements.from_client` takes one client message and returns what to send instead
(or WAIT); `bind_segment` does the steady state of libpq-style drivers in one step; `_sync`
folds a segment of plain requests into its Sync, and says whether the segment is sure to end
the transaction it began (`last_neutral`, for pipelining). The layers below it are the
request queue (request_queue.py: `reply`, `pop_ready`), the per-server LRU (cache.py) and
the SQL-level names (sql.py). The theory of operation is in this package's __init__.py.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from ...protocol import errors
from ...protocol import messages as m
from ...protocol.framing import be32
from .guard import Guards
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
    OP_CLOSE,
    OP_DISTRUST,
    OP_FAIL,
    OP_NAMED,
    OP_NONE,
    OP_PARSE,
    OP_PARSE_HIT,
    OP_RENAME,
    PARSE_COMPLETE,
    PLAIN_BIND,
    PLAIN_CLOSE,
    PLAIN_DESCRIBE,
    PLAIN_EXECUTE,
    PLAIN_PARSE,
    PLAIN_QUERY,
    PLAIN_SYNC,
    W_BIND,
    W_CLOSE,
    W_DESCRIBE,
    W_PARSE,
    W_SYNC,
    W_SYNTHETIC,
    WAIT,
    Wait,
    close_statement,
    describe_statement,
    error_message,
    parse_message,
    shown,
)
from .sql import SQL_FIRST

if TYPE_CHECKING:
    from ..pool import PoolStats

log = logging.getLogger("pypool.prepared")

# What follows the Bind in a libpq-style execution of a prepared statement (PQexecPrepared:
# Describe of the unnamed portal, Execute of it with no row limit, Sync; some drivers leave
# the Describe out).
_DESCRIBE_EXECUTE_SYNC: Final = m.describe_portal() + m.execute() + m.sync()
_EXECUTE_SYNC: Final = m.execute() + m.sync()

# What a Describe or Close is of: a prepared statement, or a portal.
_STATEMENT: Final = ord("S")
_PORTAL: Final = ord("P")


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
    if data[0] != m.BIND or len(data) < 20:
        return 0
    bind_end = 1 + be32(data, 1)
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


class ServerStatements(Guards):
    """One server's prepared statements and the requests outstanding on it."""

    def __init__(self, registry: Registry, cap: int, stats: PoolStats | None = None) -> None:
        super().__init__(registry, cap, stats)
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
        return self._attach_sql(client)

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

    # --- client messages ------------------------------------------------------------------

    def from_client(self, kind: int, data: bytes, pos: int, end: int) -> bytes | Wait | None:
        """One client message at data[pos:end]: None to send it unchanged, bytes to send
        instead (b"" for nothing), or WAIT to hold it and everything after it for now.

        Only Parse, Bind, Describe and Close (and Query, for the SQL-level commands) need
        the whole message; for the others `end` may lie beyond the data."""
        if self.discarding:
            if kind != m.SYNC:
                return b""
            self.discarding = False
        if kind == m.QUERY and data[pos + 5] not in SQL_FIRST:  # the simple protocol's hot path
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
        if kind == m.EXECUTE:
            plain = PLAIN_EXECUTE
        elif kind == m.BIND:
            if data[pos + 5] or data[pos + 6]:
                return self._bind(data, pos, end)
            if not self.unnamed_neutral:
                self.open_neutral = False
                if self.unnamed_touches:
                    self._touching()
            plain = PLAIN_BIND
        elif kind == m.SYNC:
            self._sync()
            return None
        elif kind == m.PARSE:
            if data[pos + 5]:
                self.open_neutral = False
                return self._parse(data, pos, end)
            # The unnamed statement (pgbench -M extended, most ORMs' one-off queries): its
            # text says whether a Bind of it is neutral.
            neutral = self.unnamed_neutral = neutral_text(data, pos + 6)
            self.unnamed_touches = not neutral and touches_text(data, pos + 6, end)
            plain = PLAIN_PARSE
        elif kind == m.DESCRIBE:
            if data[pos + 5] != _PORTAL:
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
        if kind != m.FLUSH:
            self.open_neutral = False
        if kind == m.QUERY or kind == m.FUNCTION_CALL:
            self.last_neutral = False
        if kind == m.CLOSE:
            return self._close(data, pos, end)
        if kind == m.QUERY:
            if data[pos + 5] in SQL_FIRST:
                return self._query(data, pos, end)
            self._push(PLAIN_QUERY)
            return None
        if kind == m.FUNCTION_CALL:
            self._push(PLAIN_QUERY)
        return None  # Flush, CopyData, CopyDone, CopyFail: no reply of their own

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
            # Logged in PgBouncer's words (which closes the client here; pypool does not).
            log.info("prepared statement '%s' was already prepared", shown(name))
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
        out = self._admit(stmt)
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
        if data[pos + 5] != _STATEMENT or end - pos <= 7:  # a portal, or the unnamed one
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
        if data[pos + 5] != _STATEMENT or end - pos <= 7:  # a portal, or the unnamed one
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

    def _touching(self) -> None:
        """A Bind in the open segment runs a statement that may change the server's
        statements (Statement.touches): its Sync distrusts the cache."""
        self.open_touches = True
        self.open_fine = True  # not folded: the Sync's reply is read
