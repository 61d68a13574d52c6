"""One server's prepared statements: `ServerStatements`, the class the glue (net/client.py,
net/server.py) holds per server, and the rewriting of the linked client's Parse, Bind,
Describe, Close and Sync for that server.

It is composed of one part per job, each a field:
  requests  RequestQueue (request_queue.py): what is outstanding on the server, matched to
            its replies; the glue reads replies through it (`reply`, `pop_ready`, `tracking`)
  cache     ServerCache (cache.py): the LRU of the Statements prepared there
  sql       SqlNames (sql.py): the SQL-level names prepared there, and PREPARE/EXECUTE/...
  guard     GuardStatement (guard_statement.py): the query_wait_timeout guard's statement
and `client`, the linked client's ClientStatements (registry.py). The parts never call each
other back: when a request settles, the queue tells this class (`settled`, `command_tag`,
`distrust`..., the queue's `Outcomes`), and it hands the work to the part that owns it.

`from_client` takes one client message and returns what to send instead (or WAIT);
`bind_segment` does the steady state of libpq-style drivers in one step; `_sync` folds a
segment of plain requests into its Sync, and says whether the segment is sure to end the
transaction it began (`last_neutral`, for pipelining). The theory of operation is in this
package's __init__.py.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from ...protocol import errors
from ...protocol import messages as m
from ...protocol.framing import be32
from .cache import ServerCache
from .guard_statement import GuardStatement
from .registry import (
    PROBE,
    ClientStatements,
    Registry,
    Statement,
    neutral_query,
    neutral_text,
    touches_text,
)
from .request_queue import RequestQueue
from .requests import (
    CLOSE_COMPLETE,
    PARSE_COMPLETE,
    PLAIN_BIND,
    PLAIN_CLOSE,
    PLAIN_DESCRIBE,
    PLAIN_EXECUTE,
    PLAIN_PARSE,
    PLAIN_QUERY,
    PLAIN_SYNC,
    WAIT,
    Hold,
    Op,
    Request,
    Tracking,
    Wait,
    close_statement,
    describe_statement,
    error_message,
    parse_message,
    shown,
)
from .sql import SqlNames, may_be_command

if TYPE_CHECKING:
    from ..pipeline_guard import Guard
    from ..pool import PoolStats

log = logging.getLogger("pypool.prepared")

# The operations the ServerCache applies or undoes when they settle.
_CACHE_OPS: Final = frozenset((Op.PARSE, Op.PARSE_HIT, Op.INJECT, Op.EVICT, Op.CLOSE,
                               Op.STALE))

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


def _runs_unnamed_portal(data: bytes, bind_end: int) -> bool:
    """Whether all that follows the Bind ending at `bind_end` is [Describe of the unnamed
    portal,] Execute of it with no row limit, Sync."""
    tail = len(data) - bind_end
    if tail == 22:
        return data.endswith(_DESCRIBE_EXECUTE_SYNC)
    return tail == 15 and data.endswith(_EXECUTE_SYNC)


def driver_segment(data: bytes) -> int:
    """If `data` is exactly Bind, [Describe portal,] Execute, Sync of the unnamed portal (the
    steady state of libpq-style drivers), the end of the Bind; else 0."""
    if data[0] != m.BIND or len(data) < 20:
        return 0
    bind_end = 1 + be32(data, 1)
    return bind_end if _runs_unnamed_portal(data, bind_end) else 0


def _names_statement(data: bytes, pos: int, end: int) -> bool:
    """Whether the Describe or Close at data[pos:end] names a prepared statement as
    PostgreSQL reads it: type "S", then one name, not empty, ended by its NUL. Any other (a
    portal, the unnamed statement, a body PostgreSQL refuses) goes to the server as it is:
    the server's error (08P01) and its skip to the Sync are then PostgreSQL's own, where a
    name read up to the last byte would describe or close another statement."""
    return (data[pos + 5] == _STATEMENT and end - pos > 7 and data[end - 1] == 0
            and data.find(0, pos + 6, end) == end - 1)


def unnamed_segment(data: bytes) -> bool:
    """Whether `data` is exactly Parse of the unnamed statement, Bind of it to the unnamed
    portal, [Describe of the portal,] Execute, Sync: pgbench -M extended's transaction, and
    most drivers' one-off queries. Nothing in it needs rewriting (`plain_segment`)."""
    n = len(data)
    if n < 39 or data[0] != m.PARSE or data[5]:
        return False
    parse_end = 1 + be32(data, 1)
    if parse_end < 9 or parse_end + 7 > n or data[parse_end] != m.BIND or data[
            parse_end + 5] or data[parse_end + 6]:
        return False
    return _runs_unnamed_portal(data, parse_end + 1 + be32(data, parse_end + 1))


class ServerStatements:
    """One server's prepared statements and the requests outstanding on it."""

    def __init__(self, registry: Registry, cap: int, stats: PoolStats | None = None) -> None:
        self.registry = registry
        self.stats = stats
        self.client: ClientStatements | None = None  # the linked client's statements
        self.requests = RequestQueue(self)
        self.cache = ServerCache(registry, cap, self.requests, stats)
        self.sql = SqlNames(self.requests, self.cache)
        self.guard = GuardStatement(self.requests)
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
        self.requests.attach()  # counts the link: the cache's epoch
        self.open_neutral = True
        self.last_neutral = False
        self.unnamed_neutral = False
        self.unnamed_touches = False
        self.open_touches = False
        # Most clients have no SQL-level statement: the server's names are not looked at.
        return self.sql.attach(client) if client.sql else b""

    def detach(self) -> bool:
        """The client leaves. False if requests are still queued (a bug: close the server)."""
        self.client = None
        self.requests.detach()
        if self.requests.queue:
            self.close()
            return False
        return True

    def close(self) -> None:
        """The server is gone: give back every reference it held."""
        self.cache.close(self.requests.close())
        self.sql.names.clear()
        self.guard.clear()

    def queue_guard(self, guard: Guard) -> bytes:
        """Queue a pipelined follower's query_wait_timeout guard (guard_statement.py)."""
        return self.guard.queue_guard(guard)

    # --- what settled requests mean (the request queue's Outcomes) --------------------------

    def settled(self, request: Request, ok: bool) -> None:
        """A request completed (ok) or was skipped: the part that owns its operation applies
        or undoes it."""
        op = request.op
        if op in _CACHE_OPS:
            self.cache.settled(request, ok, self.client)
        elif op == Op.SQL:
            if ok and self.sql.done(request, self.client):
                self.distrust("a multi-statement query that prepares or deallocates ran")
        elif op == Op.HIDDEN:
            if not ok:
                self.sql.undo_hidden(request)
        elif op == Op.GUARD:
            self.guard.settled(request, ok)
        elif op == Op.DISTRUST:
            if ok:
                self.distrust("a query that may deallocate ran")
        elif op == Op.NAMED:
            if ok and request.wait == Wait.PARSE and request.stmt is not None:
                # A duplicate Parse, sent under the name of a statement the server should
                # have, succeeded: the server had lost it, and now has another text under
                # its name. Close that before it is parsed here again.
                self.distrust("a duplicate Parse found it missing")
                self.cache.stale.add(request.stmt)

    def hidden_failed(self, request: Request) -> None:
        self.sql.undo_hidden(request)

    def guard_error(self, body: bytes, request: Request) -> int:
        if self.guard.lost(body, request):
            self.distrust("the guard statement was missing")
        return self.guard.error(body, request)

    def command_tag(self, body: bytes) -> None:
        """A CommandComplete (the glue calls this on the hot path for tags with "D"): DISCARD
        ALL and DEALLOCATE ALL drop every statement, and a DEALLOCATE the pooler did not
        follow leaves it not knowing which."""
        if body[:1] != b"D":
            return
        if body.startswith(b"DEALLOCATE ALL") or body.startswith(b"DISCARD ALL"):
            self.clear()
        elif body.startswith(b"DEALLOCATE\x00"):
            queue = self.requests.queue
            op = queue[0].op if queue else Op.NONE
            if op != Op.SQL and op != Op.HIDDEN:
                # Not one the pooler follows (`SELECT 1; DEALLOCATE x`): which one is unknown.
                self.distrust("an untracked DEALLOCATE ran")

    def distrust(self, why: str) -> None:
        """Something ran on the server that the pooler could not follow and that may have
        dropped prepared statements (a DO block running DEALLOCATE ALL, a function, a
        DEALLOCATE in a multi-statement query), or a Bind found one missing (26000). The
        cache cannot be trusted: forget it (ServerCache.forget); the SQL-level names and the
        guard statement become unsure."""
        self.cache.forget(why)
        self.sql.forget()
        self.guard.forget()

    def clear(self) -> None:
        """The server dropped every prepared statement (DEALLOCATE ALL, DISCARD ALL): so did
        the linked client. Parses still queued behind it will exist again."""
        queued = self.requests.queue
        self.cache.clear(self.client, queued)
        self.sql.clear(self.client)
        self.guard.clear(queued)

    # --- client messages ------------------------------------------------------------------

    def from_client(self, kind: int, data: bytes, pos: int, end: int) -> bytes | Hold | None:
        """One client message at data[pos:end]: None to send it unchanged, bytes to send
        instead (b"" for nothing), or WAIT to hold it and everything after it for now.

        Only Parse, Bind, Describe and Close (and Query, for the SQL-level commands) need
        the whole message; for the others `end` may lie beyond the data."""
        requests = self.requests
        if requests.discarding:
            if kind != m.SYNC:
                if kind == m.QUERY or kind == m.FUNCTION_CALL:
                    requests.skipped += 1  # PostgreSQL would skip it: no ReadyForQuery
                return b""
            requests.discarding = False
        # The simple protocol's hot path.
        if kind == m.QUERY and not may_be_command(data, pos, end):
            self.open_neutral = False
            # Looked at only if the pooler asks (`neutral_tail`): most Queries never are.
            self.last_neutral = None
            self._last_query = (data, pos + 5, end - 1)
            requests.append(PLAIN_QUERY)  # `push`, inlined; at the head it needs no
            requests.readies_queued += 1        # tracking
            requests.open_count += 1
            requests.open_fine = True
            return None
        # The unnamed statement and portals, Execute: queued as they are (`push`, inlined:
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
        queue = requests.queue
        requests.append(plain)
        requests.open_count += 1
        if len(queue) == 1:
            requests.tracking = Tracking.EACH  # what retrack would say of these at the head
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
        requests = self.requests
        if requests.discarding or requests.blocked or requests.undoable or requests.open_count:
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
        if stmt is None or stmt not in self.cache.lru or stmt.touches:
            return None
        self.cache.ensure(stmt)  # a hit: sends nothing
        if self.stats is not None:
            self.stats.bind_count += 1
        queue = requests.queue
        requests.append(Request(Wait.SYNC, False, Op.RENAME, None, None, requests.segment,
                                [(stmt, name)]))
        if len(queue) == 1:
            requests.tracking = Tracking.HOT  # retrack of a folded segment; else unchanged
        requests.readies_queued += 1
        requests.segment += 1
        self.last_neutral = stmt.neutral
        return _renamed_bind(data, 0, portal_end, name_end, bind_end, stmt) + data[bind_end:]

    def plain_segment(self, data: bytes) -> bool:
        """If `data` is an `unnamed_segment`, queue it as `from_client` message by message
        ends up doing (its requests folded into one PLAIN_SYNC), in one step, and True. False,
        queueing nothing, when it is not one or that is not sure (a segment already open, the
        skip after an error, or a text that may change the server's statements: message by
        message then)."""
        requests = self.requests
        if (requests.discarding or requests.open_count or requests.open_fine
                or not unnamed_segment(data)):
            return False
        neutral = neutral_text(data, 6)
        if not neutral and touches_text(data, 6, 1 + be32(data, 1)):
            return False
        self.unnamed_neutral = neutral
        self.unnamed_touches = False
        queue = requests.queue
        # `close_segment`, inlined (calling it measured ~200 ns more per transaction in
        # bench/path_cpu.py): nothing of the segment is open, so only these change.
        requests.append(PLAIN_SYNC)
        if len(queue) == 1:
            requests.tracking = Tracking.HOT
        requests.readies_queued += 1
        requests.segment += 1
        self.last_neutral = self.open_neutral and neutral
        self.open_neutral = True
        return True

    def _other(self, kind: int, data: bytes, pos: int, end: int) -> bytes | Hold | None:
        if kind != m.FLUSH:
            self.open_neutral = False
        if kind == m.QUERY or kind == m.FUNCTION_CALL:
            self.last_neutral = False
        if kind == m.CLOSE:
            return self._close(data, pos, end)
        if kind == m.QUERY:  # one that `may_be_command` (the others stay in from_client)
            return self.sql.query(self.client, data, pos, end)
        if kind == m.FUNCTION_CALL:
            self.requests.push(PLAIN_QUERY)
        return None  # Flush, CopyData, CopyDone, CopyFail: no reply of their own

    def _sync(self) -> None:
        """The client's Sync: it closes the open segment, folded into it where it can be
        (RequestQueue.fold)."""
        requests = self.requests
        request: Request | None = PLAIN_SYNC
        neutral = self.open_neutral and not requests.open_fine
        if self.open_touches:
            # A statement in it may drop the server's statements: forget them at its end,
            # and look no name up for later segments until then (undoable).
            self.open_touches = False
            segment = requests.segment
            request = Request(Wait.SYNC, False, Op.DISTRUST, None, None, segment)
            requests.may_undo(segment)
        else:
            request = requests.fold()
            if request is None:  # not folded: one statement under two names
                request = PLAIN_SYNC
                neutral = False
        requests.close_segment(request)
        self.last_neutral = neutral
        self.open_neutral = True

    def _fail(self, sqlstate: str, text: str) -> bytes:
        """Answer the client's message with an error, as PostgreSQL would. The server is made
        to fail in its place (a Describe of a statement it does not have), so it skips to the
        Sync and aborts a transaction block just as it would have; its error is replaced."""
        self.requests.push(Request(Wait.DESCRIBE, False, Op.FAIL, None, None,
                                   self.requests.segment, error_message(sqlstate, text)))
        return describe_statement(PROBE)

    def _parse(self, data: bytes, pos: int, end: int) -> bytes | Hold | None:
        requests = self.requests
        name_end = data.index(0, pos + 5, end)
        if name_end == pos + 5:
            requests.push(PLAIN_PARSE)
            return None
        if requests.undoable and requests.must_wait():
            return WAIT
        name = data[pos + 5 : name_end]
        client = self.client
        assert client is not None
        key = data[name_end + 1 : end]
        if self.stats is not None:
            self.stats.client_parse_count += 1
        existing = client.names.get(name)
        if existing is not None:
            return self._duplicate_parse(name, key, existing)
        if client.has_sql(name):
            requests.push(PLAIN_PARSE)  # the server has it under this name: 42P05 there
            return None
        if client.cap and len(client) >= client.cap:
            return self._fail(
                errors.PROGRAM_LIMIT_EXCEEDED,
                f"too many prepared statements for this client "
                f"(max_client_prepared_statements = {client.cap})",
            )
        stmt = self.registry.acquire(key)
        client.names[name] = stmt
        segment = requests.segment
        lru = self.cache.lru
        if stmt in lru:
            lru.move_to_end(stmt)
            lru[stmt] = self.cache.epoch
            if self.stats is not None:
                self.stats.prepared_hits += 1
            if requests.status_known():
                requests.push(Request(Wait.SYNTHETIC, False, Op.PARSE_HIT, stmt, name, segment,
                                      PARSE_COMPLETE))
                return b""
            # The server might be in a failed transaction by then (25P02): let it parse the
            # body under a throwaway name and say.
            requests.push(Request(Wait.PARSE, False, Op.PARSE_HIT, stmt, name, segment))
            requests.push(Request(Wait.CLOSE, True, Op.NONE, None, None, segment))
            return parse_message(PROBE, key) + close_statement(PROBE)
        out = self.cache.admit(stmt)
        requests.push(Request(Wait.PARSE, False, Op.PARSE, stmt, name, segment))
        return out + stmt.parse_message()

    def _duplicate_parse(self, name: bytes, key: bytes, existing: Statement) -> bytes:
        """A Parse of a name the client has already prepared. Parsed under the name of a
        statement the server has, it fails there as it would here: a syntax error first,
        25P02 in a failed transaction, else 42P05, with the name in the message changed
        back to the client's. Logged in PgBouncer's words (which closes the client here;
        pypool does not)."""
        log.info("prepared statement '%s' was already prepared", shown(name))
        lru = self.cache.lru
        if existing in lru or not lru:
            target = existing
            out = self.cache.ensure(existing)
        else:
            target = next(reversed(lru))
            out = b""
        requests = self.requests
        requests.push(Request(Wait.PARSE, False, Op.NAMED, target, name, requests.segment))
        requests.open_fine = True  # not folded: a ParseComplete would say the server lost it
        return out + parse_message(target.name, key)

    def _bind(self, data: bytes, pos: int, end: int) -> bytes | Hold | None:
        requests = self.requests
        portal_end = data.index(0, pos + 5, end)
        name_end = data.index(0, portal_end + 1, end)
        if name_end == portal_end + 1:
            requests.push(PLAIN_BIND)
            return None
        if requests.undoable and requests.must_wait():
            return WAIT
        name = data[portal_end + 1 : name_end]
        client = self.client
        assert client is not None
        stmt = client.names.get(name)
        if stmt is None:
            self.open_neutral = False
            if client.has_sql(name):
                requests.push(PLAIN_BIND)
                return None
            return self._fail(errors.INVALID_SQL_STATEMENT_NAME,
                              f'prepared statement "{shown(name)}" does not exist')
        if not stmt.neutral:
            self.open_neutral = False
            if stmt.touches:
                self._touching()
        out = self.cache.ensure(stmt)
        if self.stats is not None:
            self.stats.bind_count += 1
        queue = requests.queue
        queue.append(Request(Wait.BIND, False, Op.NAMED, stmt, name))  # push, inlined
        requests.open_count += 1
        requests.rename(stmt, name)
        if len(queue) == 1:
            requests.tracking = Tracking.EACH
        return out + _renamed_bind(data, pos, portal_end, name_end, end, stmt)

    def _describe(self, data: bytes, pos: int, end: int) -> bytes | Hold | None:
        requests = self.requests
        if not _names_statement(data, pos, end):
            requests.push(PLAIN_DESCRIBE)
            return None
        if requests.undoable and requests.must_wait():
            return WAIT
        name = data[pos + 6 : end - 1]
        client = self.client
        assert client is not None
        stmt = client.names.get(name)
        if stmt is None:
            if client.has_sql(name):
                requests.push(PLAIN_DESCRIBE)
                return None
            return self._fail(errors.INVALID_SQL_STATEMENT_NAME,
                              f'prepared statement "{shown(name)}" does not exist')
        out = self.cache.ensure(stmt)
        requests.push(Request(Wait.DESCRIBE, False, Op.NAMED, stmt, name))
        return out + describe_statement(stmt.name)

    def _close(self, data: bytes, pos: int, end: int) -> bytes | Hold | None:
        requests = self.requests
        if not _names_statement(data, pos, end):
            requests.push(PLAIN_CLOSE)
            return None
        if requests.undoable and requests.must_wait():
            return WAIT
        name = data[pos + 6 : end - 1]
        client = self.client
        assert client is not None
        stmt = client.names.pop(name, None)
        if stmt is not None:
            # The server keeps the plan for whoever parses the same body next; the queue
            # entry holds the client's reference until the CloseComplete goes out.
            requests.push(Request(Wait.SYNTHETIC, False, Op.CLOSE, stmt, name,
                                  requests.segment, CLOSE_COMPLETE))
            return b""
        if self.sql.forget_name(client, name):
            requests.push(PLAIN_CLOSE)
            return None
        # Closing a statement that does not exist is no error in PostgreSQL either.
        requests.push(Request(Wait.SYNTHETIC, False, Op.NONE, None, None, requests.segment,
                              CLOSE_COMPLETE))
        return b""

    def _touching(self) -> None:
        """A Bind in the open segment runs a statement that may change the server's
        statements (Statement.touches): its Sync distrusts the cache."""
        self.open_touches = True
        self.requests.open_fine = True  # not folded: the Sync's reply is read
