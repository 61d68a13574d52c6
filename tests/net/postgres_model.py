"""A small model of PostgreSQL's side of the frontend/backend protocol, for the fakes: enough
to answer what a client (or the pooler for it) sends after the login, as a backend would.

It keeps named and unnamed prepared statements and portals, the transaction status, and the
skip to Sync after an error in the extended protocol, and reads simple Queries by their
first word (BEGIN, COMMIT, ROLLBACK, PREPARE, EXECUTE, DEALLOCATE, DISCARD ALL, COPY ...
FROM STDIN); every statement succeeds unless the protocol says otherwise. Replies are
messages.py's. It never runs SQL: it is the referee for what a direct connection would have
answered (tests/net/test_hostile_bytes.py sends the same bytes to one model directly and,
through the pooler, to another, and compares; tests/net/test_two_clients.py gives each server
the pool opens a model of its own).
"""

from __future__ import annotations

import re
import struct

from pypool.protocol import messages as m

_WORD = re.compile(rb"\s*([A-Za-z_]+)")
# The pooler's SET of a client's parameters (pooling/params.py `set_statements`).
_SET_CONFIG = re.compile(rb"set_config\(E?'([^']*)', E?'([^']*)', false\)")
# Parameters PostgreSQL reports with a ParameterStatus when they change (GUC_REPORT).
_REPORTED = frozenset({b"application_name", b"client_encoding", b"DateStyle", b"IntervalStyle",
                       b"TimeZone", b"standard_conforming_strings"})
_NAME = re.compile(rb"\s*([A-Za-z_][A-Za-z0-9_]*|\"(?:[^\"]|\"\")+\")")


class Malformed(Exception):
    """A message body PostgreSQL could not read: 08P01."""


class Body:
    """Reads a message body as PostgreSQL's pq_getmsg* do."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def string(self) -> bytes:
        end = self.data.find(b"\x00", self.pos)
        if end < 0:
            raise Malformed("invalid string in message")
        value = self.data[self.pos:end]
        self.pos = end + 1
        return value

    def int(self, size: int) -> int:
        if self.pos + size > len(self.data):
            raise Malformed("insufficient data left in message")
        value = int.from_bytes(self.data[self.pos:self.pos + size], "big", signed=True)
        self.pos += size
        return value

    def skip(self, size: int) -> None:
        if size < 0 or self.pos + size > len(self.data):
            raise Malformed("insufficient data left in message")
        self.pos += size

    def end(self) -> None:
        if self.pos != len(self.data):
            raise Malformed("invalid message format")


class Backend:
    """One backend's state after its login."""

    def __init__(self) -> None:
        self.buffer = b""
        self.output = b""  # answered, not yet flushed
        self.flush_now = False  # an ErrorResponse was sent: flushed at once
        self.statements: dict[bytes, bytes] = {}  # name -> text; b"" is the unnamed one
        self.portals: dict[bytes, bytes] = {}  # name -> its statement's text
        self.status = m.TX_IDLE
        self.skipping = False  # an extended-protocol error: everything up to Sync ignored
        self.copying = False  # COPY FROM STDIN: CopyData until CopyDone or CopyFail

    def feed(self, data: bytes) -> bytes:
        """Whole messages of `data` (and what was kept) answered; a partial one kept. What
        is answered is sent as PostgreSQL sends it: at a ReadyForQuery, a Flush, a
        CopyInResponse or an ErrorResponse (elog.c flushes each), when its output buffer
        is flushed; until then it waits."""
        self.buffer += data
        pos, buf = 0, self.buffer
        sent = b""
        while len(buf) - pos >= 5:
            end = pos + 1 + int.from_bytes(buf[pos + 1:pos + 5], "big")
            if end > len(buf):
                break
            kind = buf[pos]
            self.output += self.message(kind, buf[pos + 5:end])
            pos = end
            if (kind == ord("H") or self.copying or self.flush_now
                    or self.output[-6:-5] == b"Z"):
                self.flush_now = False
                sent, self.output = sent + self.output, b""
        self.buffer = buf[pos:]
        return sent

    def message(self, kind: int, body: bytes) -> bytes:
        letter = chr(kind)
        if self.copying:
            if letter in "dHS":
                # CopyData; a Flush or Sync PostgreSQL ignores during COPY FROM STDIN, for
                # clients that send one without noticing the command was a COPY.
                return b""
            self.copying = False
            if letter == "c":
                return m.command_complete("COPY 0") + m.ready_for_query(self.status)
            if letter == "f":
                return self._error("COPY from stdin failed", "57014", True)
            # PostgreSQL 13 and before, which read the message first; 14 and later end the
            # connection here (FATAL: protocol synchronization was lost), which the pooler
            # meets as a server that died. The pooler must be right for both.
            return self._error("unexpected message type during COPY from stdin", "08P01",
                                True)
        if self.skipping and letter != "S":
            return b""
        try:
            if letter == "Q":
                return self._query(body)
            if letter == "S":
                self.skipping = False
                self.portals.pop(b"", None)
                if self.status == m.TX_IDLE:
                    self.portals.clear()
                return m.ready_for_query(self.status)
            if letter == "H" or letter in "dcf":
                return b""  # a Flush; copy messages outside a COPY are ignored
            if letter == "P":
                return self._parse(Body(body))
            if letter == "B":
                return self._bind(Body(body))
            if letter == "D":
                return self._describe(Body(body))
            if letter == "E":
                return self._execute(Body(body))
            if letter == "C":
                return self._close(Body(body))
            if letter == "F":
                return self._error("function calls are not modelled", "0A000", True)
            return self._error(f"invalid frontend message type {kind}", "08P01", True)
        except Malformed as bad:
            return self._error(str(bad), "08P01", letter in "QF")

    def _error(self, text: str, sqlstate: str, ready: bool) -> bytes:
        """An ERROR: a transaction block fails; then ReadyForQuery (a Query's) or the skip
        to the Sync (an extended-protocol message's)."""
        if self.status == m.TX_IN_BLOCK:
            self.status = m.TX_FAILED
        error = m.error_response(text, sqlstate)
        self.flush_now = True
        if ready:
            return error + m.ready_for_query(self.status)
        self.skipping = True
        return error

    def _failed_block(self) -> bool:
        return self.status == m.TX_FAILED

    def _query(self, body: bytes) -> bytes:
        reader = Body(body)
        text = reader.string()
        reader.end()
        word = _WORD.match(text)
        verb = word.group(1).lower() if word else b""
        if not text.strip():
            return m.message(ord("I")) + m.ready_for_query(self.status)  # EmptyQueryResponse
        if self._failed_block() and verb not in (b"rollback", b"abort", b"commit", b"end"):
            return self._error("current transaction is aborted", "25P02", True)
        tag = verb.upper().decode() or "SELECT 1"
        if verb == b"begin":
            self.status = m.TX_IN_BLOCK
        elif verb in (b"commit", b"rollback", b"abort", b"end"):
            tag = "ROLLBACK" if self._failed_block() else tag
            self.status = m.TX_IDLE
            self.portals.clear()
        elif verb == b"prepare" and word is not None:
            name = _NAME.match(text, word.end())
            if name is None:
                return self._error("syntax error", "42601", True)
            key = name.group(1).lower()
            if key in self.statements:
                return self._error("prepared statement already exists", "42P05", True)
            self.statements[key] = text
        elif verb == b"execute" and word is not None:
            name = _NAME.match(text, word.end())
            if name is None or name.group(1).lower() not in self.statements:
                return self._error("prepared statement does not exist", "26000", True)
            tag = "SELECT 1"
        elif verb == b"deallocate" and word is not None:
            name = _NAME.match(text, word.end())
            key = name.group(1).lower() if name else b""
            if key in (b"all", b"prepare"):
                self.statements = {k: v for k, v in self.statements.items() if k == b""}
                tag = "DEALLOCATE ALL"  # PostgreSQL's tag
            elif key not in self.statements:
                return self._error("prepared statement does not exist", "26000", True)
            else:
                del self.statements[key]
        elif verb == b"discard" and text.split()[1:2] in ([b"all"], [b"ALL"]):
            if self.status != m.TX_IDLE:
                return self._error("DISCARD ALL cannot run inside a transaction block",
                                   "25001", True)
            self.statements = {k: v for k, v in self.statements.items() if k == b""}
            self.portals.clear()
            tag = "DISCARD ALL"
        elif verb == b"copy" and b"stdin" in text.lower():
            self.copying = True
            return m.message(ord("G"), b"\x00\x00\x00")  # CopyInResponse, text, no columns
        if self.status == m.TX_IDLE:
            self.portals.clear()
        # A reported parameter set: its ParameterStatus comes before the ReadyForQuery.
        reported = b"".join(m.parameter_status(name.decode(), value.decode())
                            for name, value in _SET_CONFIG.findall(text) if name in _REPORTED)
        return m.command_complete(tag) + reported + m.ready_for_query(self.status)

    def _parse(self, body: Body) -> bytes:
        name = body.string()
        text = body.string()
        for _ in range(max(0, body.int(2))):
            body.int(4)
        body.end()
        if self._failed_block():
            return self._error("current transaction is aborted", "25P02", False)
        if name and name in self.statements:
            return self._error(f"prepared statement \"{name.decode('latin-1')}\" already "
                               "exists", "42P05", False)
        self.statements[name] = text
        return m.parse_complete()

    def _bind(self, body: Body) -> bytes:
        portal = body.string()
        statement = body.string()
        if statement not in self.statements:  # looked up before the rest is read
            return self._error("prepared statement does not exist", "26000", False)
        formats = body.int(2)
        for _ in range(max(0, formats)):
            body.int(2)
        for _ in range(max(0, body.int(2))):
            size = body.int(4)
            if size > 0:
                body.skip(size)
        for _ in range(max(0, body.int(2))):
            body.int(2)
        body.end()
        if self._failed_block():
            return self._error("current transaction is aborted", "25P02", False)
        if portal and portal in self.portals:
            return self._error("cursor already exists", "42P03", False)
        self.portals[portal] = self.statements[statement]
        return m.message(ord("2"))  # BindComplete

    def _describe(self, body: Body) -> bytes:
        target = body.int(1)
        name = body.string()
        body.end()
        # As exec_describe_*_message: the statement or portal is looked up first, then an
        # aborted transaction refuses the Describe.
        if target == ord("S"):
            if name not in self.statements:
                return self._error("prepared statement does not exist", "26000", False)
            if self._failed_block():
                return self._error("current transaction is aborted", "25P02", False)
            return m.message(ord("t"), struct.pack("!h", 0)) + m.message(ord("n"))
        if target == ord("P"):
            if name not in self.portals:
                return self._error("portal does not exist", "34000", False)
            if self._failed_block():
                return self._error("current transaction is aborted", "25P02", False)
            return m.message(ord("n"))  # NoData
        raise Malformed("invalid DESCRIBE message subtype")

    def _execute(self, body: Body) -> bytes:
        portal = body.string()
        body.int(4)
        body.end()
        if portal not in self.portals:
            return self._error("portal does not exist", "34000", False)
        if self._failed_block():
            return self._error("current transaction is aborted", "25P02", False)
        text = self.portals[portal]
        word = _WORD.match(text)
        verb = word.group(1).lower() if word else b""
        if verb == b"begin":
            self.status = m.TX_IN_BLOCK
        elif verb in (b"commit", b"rollback"):
            self.status = m.TX_IDLE
        elif not text.strip():
            return m.message(ord("I"))  # EmptyQueryResponse
        return m.command_complete(verb.upper().decode() or "SELECT 1")

    def _close(self, body: Body) -> bytes:
        target = body.int(1)
        name = body.string()
        body.end()
        if target == ord("S"):
            self.statements.pop(name, None)
        elif target == ord("P"):
            self.portals.pop(name, None)
        else:
            raise Malformed("invalid CLOSE message subtype")
        return m.message(ord("3"))  # CloseComplete
