"""SQL-level prepared statements: recognising a simple Query that is a PREPARE, EXECUTE,
DEALLOCATE or DISCARD, and the names a server has prepared that way.

A PREPARE is one only when `(` or AS follows its name, as in PostgreSQL's grammar:
`PREPARE TRANSACTION 'gid'` (two-phase commit) prepares no statement, and taking it for one
once made the pooler run a hidden DEALLOCATE inside the next client's transaction, which
aborted it. Only the first command of a Query is looked at, and only Queries whose first byte could
start one (or whitespace or a comment) are looked at all, so the hot path of other simple
queries pays one set lookup.

`SqlNames` owns a server's SQL-level names (`sql`: name -> PREPARE text, or UNSURE). These
keep the client's own name on the server, since the SQL text refers to it: the pooler makes
a client's exist on every server it lands on (hidden PREPAREs at link time), drops another
client's of the same name first, rewrites EXECUTE and DEALLOCATE of a protocol-level
statement to its `PYPOOL_<n>` name, and watches CommandComplete tags for DEALLOCATE ALL,
DISCARD ALL and DEALLOCATEs it cannot account for.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import TYPE_CHECKING, Final

from ...protocol import messages as m
from .cache import ServerCache
from .registry import touches_text
from .requests import (
    HIDDEN_SYNC,
    OP_DISTRUST,
    OP_HIDDEN,
    OP_NAMED,
    OP_NONE,
    OP_SQL,
    PLAIN_QUERY,
    R_NAME,
    R_OP,
    R_PAYLOAD,
    R_WAIT,
    UNSURE,
    W_CLOSE,
    W_READY,
    W_SYNC,
    WAIT,
    Request,
    Wait,
    close_statement,
    query_message,
    quote_ident,
)

if TYPE_CHECKING:
    from ..pool import PoolStats
    from .registry import ClientStatements, Registry, Statement

# Only bytes that can start one of the four commands (or whitespace and comments before it)
# send a Query down the slow path.
SQL_FIRST: Final = frozenset(b"PpEeDd \t\r\n-/")
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


class SqlNames(ServerCache):
    """One server's SQL-level prepared statements, and the linked client's SQL commands."""

    def __init__(self, registry: Registry, cap: int, stats: PoolStats | None = None) -> None:
        super().__init__(registry, cap, stats)
        # SQL-level name -> its PREPARE text, or UNSURE: the server may have it (see distrust)
        self.sql: OrderedDict[bytes, bytes] = OrderedDict()

    def _attach_sql(self, client: ClientStatements) -> bytes:
        """A client is linked: the hidden queries that give this server the client's SQL-level
        statements (their replies are swallowed), and drop others' beyond the cap."""
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

    def _query(self, data: bytes, pos: int, end: int) -> bytes | Wait | None:
        command = parse_sql_command(data[pos + 5 : end - 1])
        client = self.client
        if command is None or client is None:
            if (client is not None and touches_text(data, pos + 5, end - 1)
                    and _PREPARE_TRANSACTION.fullmatch(data, pos + 5, end - 1) is None):
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
            elif self.tx_status != m.TX_FAILED:  # in a failed transaction the query fails anyway
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
        """Drop the SQL-level statement `name` from the server: a hidden DEALLOCATE where the
        server has it, or where it may not (UNSURE), a Close, which never fails, not even in
        a failed transaction block. A hidden statement that could fail must never run, since
        inside the client's transaction its error would abort the transaction. The Close is
        followed by a Sync, unless a segment of the client's is still open (an extended
        request queued last): a Sync would end it, so then the Close joins that segment, and
        an error before it skips the Close and the client's Query alike."""
        queue = self.queue
        if self.sql.get(name) != UNSURE:
            return self._hidden(b"DEALLOCATE " + quote_ident(name), name, None)
        del self.sql[name]
        segment_open = bool(queue) and queue[-1][R_WAIT] < W_SYNC
        self._push((W_CLOSE, True, OP_NONE, None, None, self.segment, None))
        if segment_open:
            return close_statement(name)
        self._push(HIDDEN_SYNC)
        self.segment += 1
        return close_statement(name) + m.sync()

    def _undo_hidden(self, request: Request) -> None:
        """A pooler-issued PREPARE or DEALLOCATE failed or was skipped: the server's names
        are as they were."""
        name = request[R_NAME]
        if name is None:
            return
        prepared, before = request[R_PAYLOAD]
        if before is None:
            self.sql.pop(name, None)
        elif self.sql.get(name) in (prepared, None):
            self.sql[name] = before

    def _sql_done(self, request: Request) -> None:
        """A client's PREPARE or DEALLOCATE query completed: apply it if it succeeded."""
        command: SqlCommand = request[R_PAYLOAD]
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

    def _command_tag(self, body: bytes) -> None:
        if body[:1] != b"D":
            return
        if body.startswith(b"DEALLOCATE ALL") or body.startswith(b"DISCARD ALL"):
            self.clear()
        elif body.startswith(b"DEALLOCATE\x00"):
            queue = self.queue
            op = queue[0][R_OP] if queue else OP_NONE
            if op != OP_SQL and op != OP_HIDDEN:
                # Not one the pooler follows (`SELECT 1; DEALLOCATE x`): which one is unknown.
                self.distrust("an untracked DEALLOCATE ran")

    def _settled(self, request: Request, ok: bool) -> None:
        op = request[R_OP]
        if op == OP_SQL:
            if ok:
                self._sql_done(request)
        elif op == OP_HIDDEN:
            if not ok:
                self._undo_hidden(request)
        else:
            super()._settled(request, ok)

    def distrust(self, why: str) -> None:
        """As `ServerCache.distrust`; the SQL-level names become UNSURE."""
        super().distrust(why)
        sql = self.sql
        for name in sql:
            sql[name] = UNSURE

    def clear(self) -> None:
        super().clear()
        self.sql.clear()
        if self.client is not None:
            self.client.sql.clear()

    def close(self) -> None:
        super().close()
        self.sql.clear()
