"""SQL-level prepared statements: recognising a simple Query that is a PREPARE, EXECUTE,
DEALLOCATE or DISCARD, and the names a server has prepared that way.

A PREPARE is one only when `(` or AS follows its name, as in PostgreSQL's grammar:
`PREPARE TRANSACTION 'gid'` (two-phase commit) prepares no statement, and taking it for one
once made the pooler run a hidden DEALLOCATE inside the next client's transaction, which
aborted it. Only the first command of a Query is looked at, and only Queries whose first byte could
start one (or whitespace or a comment) are looked at all, so the hot path of other simple
queries pays one set lookup.

`SqlNames` owns a server's SQL-level names (`names`: name -> PREPARE text, or UNSURE). These
keep the client's own name on the server, since the SQL text refers to it: the pooler makes
a client's exist on every server it lands on (hidden PREPAREs at link time), drops another
client's of the same name first, and rewrites EXECUTE and DEALLOCATE of a protocol-level
statement to its `PYPOOL_<n>` name (sending its Parse first through the server's
ServerCache). It queues its requests on the server's RequestQueue; the CommandComplete tags
for DEALLOCATE ALL, DISCARD ALL and DEALLOCATEs it cannot account for are watched by
ServerStatements.command_tag (rewriter.py).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import TYPE_CHECKING, Final

from ...protocol import messages as m
from .registry import touches_text
from .requests import (
    HIDDEN_SYNC,
    PLAIN_QUERY,
    UNSURE,
    WAIT,
    Hold,
    Op,
    Request,
    Wait,
    close_statement,
    query_message,
    quote_ident,
)

if TYPE_CHECKING:
    from .cache import ServerCache
    from .registry import ClientStatements, Statement
    from .request_queue import RequestQueue

# Only bytes that can start one of the four commands (or whitespace and comments before it)
# send a Query down the slow path: SQL_FIRST[byte] is 1 for them. A table indexed by the
# byte, not a set: compiled, indexing bytes is a load, a set's `in` a generic call.
SQL_FIRST: Final = bytes(byte in b"PpEeDd \t\r\n-/" for byte in range(256))


def may_be_command(data: bytes, pos: int, end: int) -> bool:
    """Whether the Query at data[pos:end] may be one of the four commands: its text (more
    than its NUL: an empty Query is answered by PostgreSQL) starts with a byte SQL_FIRST marks."""
    return end - pos >= 7 and SQL_FIRST[data[pos + 5]] != 0


_SQL_COMMAND: Final = re.compile(
    rb"(?:\s|--[^\n]*(?:\n|$)|/\*.*?\*/)*(prepare|execute|deallocate|discard)\b", re.I | re.S
)
_SQL_NAME: Final = re.compile(
    rb'(?:\s|--[^\n]*(?:\n|$)|/\*.*?\*/)+("(?:[^"]|"")+"|[A-Za-z_\x80-\xff][A-Za-z0-9_$\x80-\xff]*)',
    re.S,
)
# What follows a PREPARE's name: its parameter types or AS. Anything else is not a prepared
# statement: `PREPARE TRANSACTION 'gid'` (two-phase commit) names no statement at all.
_PREPARE_BODY: Final = re.compile(rb"(?:\s|--[^\n]*(?:\n|$)|/\*.*?\*/)*(?:\(|as\b)", re.I | re.S)
# A Query that is one PREPARE TRANSACTION and nothing else: it changes no statement, so it
# needs no distrust (a longer text that merely contains it still gets one).
_PREPARE_TRANSACTION: Final = re.compile(
    rb"\s*prepare\s+transaction\s+'(?:[^']|'')*'\s*;?\s*", re.I)


class SqlCommand:
    """A simple Query that starts with PREPARE, EXECUTE, DEALLOCATE or DISCARD."""

    __slots__ = ("verb", "name", "start", "end", "text", "stmt", "tags", "failed")

    def __init__(self, verb: bytes, name: bytes, start: int, end: int, text: bytes) -> None:
        self.verb = verb  # b"prepare", b"execute", b"deallocate" or b"discard"
        self.name = name  # folded statement name; b"" for ALL
        self.start = start  # where the name is in `text`, to rewrite it
        self.end = end
        self.text = text
        self.stmt: Statement | None = None  # DEALLOCATE of a protocol-level statement
        self.tags = 0  # CommandComplete messages seen
        self.failed = False


def parse_sql_command(text: bytes) -> SqlCommand | None:
    """The command and statement name of a Query text, if it is one the pooler tracks."""
    match = _SQL_COMMAND.match(text)
    if match is None:
        return None
    verb = match.group(1).lower()
    pos = match.end()
    if verb == b"discard":
        return SqlCommand(verb, b"", pos, pos, text)
    name_match = _SQL_NAME.match(text, pos)
    if name_match is None:
        return None
    raw = name_match.group(1)
    if verb == b"prepare" and _PREPARE_BODY.match(text, name_match.end()) is None:
        return None  # PREPARE TRANSACTION, or not a statement PostgreSQL would accept
    if verb == b"deallocate" and raw.lower() == b"prepare":
        following = _SQL_NAME.match(text, name_match.end())
        if following is not None:
            name_match = following
            raw = following.group(1)
    if raw.startswith(b'"'):
        name = raw[1:-1].replace(b'""', b'"')
    else:
        name = raw.lower()
        if verb == b"deallocate" and name == b"all":
            name = b""
    return SqlCommand(verb, name, name_match.start(1), name_match.end(1), text)


class SqlNames:
    """One server's SQL-level prepared statements, and the linked client's SQL commands."""

    def __init__(self, requests: RequestQueue, cache: ServerCache) -> None:
        self.requests = requests
        self.cache = cache
        # SQL-level name -> its PREPARE text, or UNSURE: the server may have it (see forget)
        self.names: OrderedDict[bytes, bytes] = OrderedDict()

    def attach(self, client: ClientStatements) -> bytes:
        """A client is linked: the hidden queries that give this server the client's SQL-level
        statements (their replies are swallowed), and drop others' beyond the cap."""
        sql = client.sql
        if not sql:
            return b""
        names = self.names
        out = []
        for name, text in sql.items():
            have = names.get(name)
            if have == text:
                names.move_to_end(name)
                continue
            if have is not None:
                out.append(self._drop(name))
            out.append(self._hidden(text, name, text))
        while len(names) > max(self.cache.cap, len(sql)):
            name = next(iter(names))
            if name in sql:
                names.move_to_end(name)
                continue
            out.append(self._drop(name))
        return b"".join(out)

    def query(self, client: ClientStatements | None, data: bytes, pos: int,
              end: int) -> bytes | Hold | None:
        """A simple Query at data[pos:end] whose first byte could start a PREPARE, EXECUTE,
        DEALLOCATE or DISCARD: what to send instead (as ServerStatements.from_client)."""
        requests = self.requests
        if end > len(data):
            return self.streamed(client, data, pos)
        command = parse_sql_command(data[pos + 5 : end - 1])
        if command is None or client is None:
            if (client is not None and touches_text(data, pos + 5, end - 1)
                    and _PREPARE_TRANSACTION.fullmatch(data, pos + 5, end - 1) is None):
                # A DO block or the like that may change the server's statements unseen.
                if requests.undoable and requests.must_wait():
                    return WAIT
                requests.push(Request(Wait.READY, False, Op.DISTRUST, None, None,
                                      requests.segment))
                requests.segment += 1  # like a Sync: an error in it skips nothing after it
                return None
            requests.push(PLAIN_QUERY)
            return None
        if requests.undoable and requests.must_wait():
            return WAIT
        name = command.name
        out = b""
        message: bytes | None = None
        request = PLAIN_QUERY
        if command.verb == b"prepare":
            if not client.has_sql(name) and name in self.names:
                out = self._drop(name)
            request = Request(Wait.READY, False, Op.SQL, None, name, requests.segment, command)
        elif command.verb == b"discard" or not name:
            pass  # DISCARD ..., DEALLOCATE ALL: the CommandComplete tag tells what happened
        elif client.has_sql(name):
            if command.verb == b"deallocate":
                request = Request(Wait.READY, False, Op.SQL, None, name, requests.segment,
                                  command)
        elif name in client.names:
            # SQL EXECUTE/DEALLOCATE of a protocol-level statement: use the server's name.
            stmt = client.names[name]
            if stmt in self.cache.lru:
                self.cache.ensure(stmt)  # a hit: sends nothing
            elif requests.readies_queued != requests.readies_done:
                requests.blocked = True  # a Parse would fail if the transaction fails first
                return WAIT
            elif requests.tx_status != m.TX_FAILED:  # in a failed transaction it fails anyway
                # A failed Parse would make the server skip the Query too, and the client
                # would wait for its ReadyForQuery forever: end the Parse with a Sync.
                out = self.cache.inject(stmt) + m.sync()
                requests.push(HIDDEN_SYNC)
                requests.segment += 1
                requests.open_fine = False
            text = command.text
            message = query_message(text[: command.start] + quote_ident(stmt.name)
                                     + text[command.end :])
            if command.verb == b"deallocate":
                command.stmt = stmt
                request = Request(Wait.READY, False, Op.SQL, stmt, name, requests.segment,
                                  command)
            else:
                request = Request(Wait.READY, False, Op.NAMED, stmt, name, requests.segment)
        elif name in self.names:
            # Another client's statement of that name: drop it so the client's query fails
            # (or succeeds) as it would on a connection of its own.
            out = self._drop(name)
        requests.push(request)
        if message is None:
            return out + data[pos:end] if out else None
        return out + message

    def streamed(self, client: ClientStatements | None, data: bytes,
                 pos: int) -> bytes | Hold | None:
        """A Query streamed to the server (core/frontend.py), of which only data[pos:], its
        start, is here: never an EXECUTE, DEALLOCATE or DISCARD, which are read whole. What
        its whole text could do is assumed: it may change the server's statements unseen
        (distrusted, as a DO block is). A PREPARE is not recorded, since its text is not all
        here to prepare it again elsewhere: its client is pinned to this server instead
        (session_state), and another client's statement of that name is dropped first, as
        for any PREPARE."""
        requests = self.requests
        if client is None:
            requests.push(PLAIN_QUERY)
            return None
        if requests.undoable and requests.must_wait():
            return WAIT
        command = parse_sql_command(data[pos + 5 :])
        out = b""
        if command is not None and command.verb == b"prepare":
            name = command.name
            if not client.has_sql(name) and name in self.names:
                out = self._drop(name)
        requests.push(Request(Wait.READY, False, Op.DISTRUST, None, None, requests.segment))
        requests.segment += 1
        return out + data[pos:] if out else None

    def _hidden(self, text: bytes, name: bytes, prepared: bytes | None) -> bytes:
        """Queue a pooler-issued SQL-level PREPARE (`prepared` is its text) or DEALLOCATE."""
        before = self.names.get(name)
        if prepared is None:
            self.names.pop(name, None)
        else:
            self.names[name] = prepared
        self.requests.push(Request(Wait.READY, True, Op.HIDDEN, None, name,
                                   self.requests.segment, (prepared, before)))
        return query_message(text)

    def _drop(self, name: bytes) -> bytes:
        """Drop the SQL-level statement `name` from the server: a hidden DEALLOCATE where the
        server has it, or where it may not (UNSURE), a Close, which never fails, not even in
        a failed transaction block. A hidden statement that could fail must never run, since
        inside the client's transaction its error would abort the transaction. The Close is
        followed by a Sync, unless a segment of the client's is still open (an extended
        request queued last): a Sync would end it, so then the Close joins that segment, and
        an error before it skips the Close and the client's Query alike."""
        requests = self.requests
        queue = requests.queue
        if self.names.get(name) != UNSURE:
            return self._hidden(b"DEALLOCATE " + quote_ident(name), name, None)
        del self.names[name]
        segment_open = bool(queue) and queue[-1].wait < Wait.SYNC
        requests.push(Request(Wait.CLOSE, True, Op.NONE, None, None, requests.segment))
        if segment_open:
            return close_statement(name)
        requests.push(HIDDEN_SYNC)
        requests.segment += 1
        return close_statement(name) + m.sync()

    def forget_name(self, client: ClientStatements, name: bytes) -> bool:
        """The client's Close of a statement by `name`: whether it is one of its SQL-level
        ones (then forgotten here and in the client's map, and the Close sent on)."""
        if not client.has_sql(name):
            return False
        client.drop_sql(name)
        self.names.pop(name, None)
        return True

    def undo_hidden(self, request: Request) -> None:
        """A pooler-issued PREPARE or DEALLOCATE failed or was skipped: the server's names
        are as they were."""
        name = request.name
        if name is None:
            return
        prepared, before = request.payload
        if before is None:
            self.names.pop(name, None)
        elif self.names.get(name) in (prepared, None):
            self.names[name] = before

    def done(self, request: Request, client: ClientStatements | None) -> bool:
        """A client's PREPARE or DEALLOCATE query completed: apply it if it succeeded.
        Returns whether the server's statements can no longer be trusted (the caller then
        distrusts them)."""
        command: SqlCommand = request.payload
        if not command.tags or client is None:
            return False  # the command itself failed: nothing changed
        name = command.name
        if command.failed or command.tags != 1:
            # Several statements in one query: not ours to replay, and what the others did
            # is not known. A PREPARE that ran stays on the server (a later error does not
            # undo it), under a text that is not the query's.
            if command.verb == b"prepare":
                self.names[name] = UNSURE
            return True
        if command.verb == b"prepare":
            client.add_sql(name, command.text)
            self.names[name] = command.text
        elif command.stmt is not None:  # DEALLOCATE of a protocol-level statement
            self.cache.forget_client(client, name, command.stmt)
            self.cache.forget_statement(command.stmt)
        else:
            client.drop_sql(name)
            self.names.pop(name, None)
        return False

    def forget(self) -> None:
        """The SQL-level part of ServerStatements.distrust: every name becomes UNSURE."""
        names = self.names
        for name in names:
            names[name] = UNSURE

    def clear(self, client: ClientStatements | None) -> None:
        """DEALLOCATE ALL or DISCARD ALL ran: no SQL-level name is left, here or the
        client's."""
        self.names.clear()
        if client is not None:
            client.sql = None
