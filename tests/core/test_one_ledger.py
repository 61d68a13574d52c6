"""The client's ledger and the server's prepared-statement queue, fed together.

Both are fed from the same messages: the request reader (core/frontend.py) counts a request
in the FrontendLedger and queues it on the server's statements in the same step, and the
reply reader (core/replies.py) strikes the Syncs a COPY makes PostgreSQL ignore from both
in one call (`FrontendLedger.copy_started`). Here a client with named and unnamed
statements, COPYs and failing statements runs against a model of PostgreSQL's message loop,
its requests rewritten as the pooler rewrites them; at every ReadyForQuery the two must
agree (`core.link.ready_event` never says READY_DOUBT), and after each exchange
both are empty and the server was released exactly once.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from pypool.core import link as lk
from pypool.core import replies
from pypool.core.frontend import RequestReader
from pypool.core.replies import ReplyReader
from pypool.pooling.pool import PoolStats
from pypool.pooling.prepared import ClientStatements, ServerStatements
from pypool.pooling.prepared.registry import Registry
from pypool.protocol import messages as m
from pypool.protocol.framing import MessageBuffer

pytestmark = pytest.mark.timeout(120)


def msg(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


def parse(name: str, sql: str) -> bytes:
    return msg(b"P", name.encode() + b"\x00" + sql.encode() + b"\x00\x00\x00")


def bind(name: str) -> bytes:
    return msg(b"B", b"\x00" + name.encode() + b"\x00\x00\x00\x00\x00\x00\x00")


EXECUTE = msg(b"E", b"\x00\x00\x00\x00\x00")
DESCRIBE = msg(b"D", b"P\x00")
SYNC = msg(b"S")
COPY_DATA = msg(b"d", b"1\n")
BAD_COPY_DATA = msg(b"d", b"bad\n")
COPY_DONE = msg(b"c")

PARSE_COMPLETE = msg(b"1")
BIND_COMPLETE = msg(b"2")
CLOSE_COMPLETE = msg(b"3")
NO_DATA = msg(b"n")
COPY_IN = msg(b"G", b"\x00\x00\x01\x00\x00")
ERROR = msg(b"E", b"SERROR\x00C22P02\x00Mbad\x00\x00")
READY_I = msg(b"Z", b"I")


def complete(tag: bytes) -> bytes:
    return msg(b"C", tag + b"\x00")


class Postgres:
    """PostgreSQL's message loop as far as replies go: each extended message answered,
    a COPY (its statement text starts with COPY) entered in copy-in, CopyData "bad" fails
    it, an Execute of a statement whose text has FAIL fails, an error skips to the Sync."""

    def __init__(self) -> None:
        self.statements: dict[bytes, bytes] = {}
        self.portal = b""
        self.copy_in = False
        self.copy_extended = False
        self.skipping = False

    def feed(self, data: bytes) -> bytes:
        out: list[bytes] = []
        buffer = MessageBuffer()
        buffer.feed(data)
        for kind, body in buffer.messages():
            self._message(kind, bytes(body), out)
        return b"".join(out)

    def _message(self, kind: int, body: bytes, out: list[bytes]) -> None:
        k = bytes([kind])
        if self.copy_in:
            if k == b"d":
                if b"bad" in body:
                    self._error(out)
            elif k == b"c":
                self.copy_in = False
                out.append(complete(b"COPY 1"))
                if not self.copy_extended:
                    out.append(READY_I)
            elif k not in (b"S", b"H"):
                self._error(out)
                self._message(kind, body, out)
            return
        if self.skipping:
            if k == b"S":
                self.skipping = False
                out.append(READY_I)
            return
        if k == b"Q":
            if body.startswith(b"COPY"):
                self.copy_in, self.copy_extended = True, False
                out.append(COPY_IN)
            else:
                out.append(complete(b"SELECT 1") + READY_I)
        elif k == b"P":
            name, _, rest = body.partition(b"\x00")
            self.statements[name] = rest.partition(b"\x00")[0]
            out.append(PARSE_COMPLETE)
        elif k == b"B":
            portal, _, rest = body.partition(b"\x00")
            name = rest.partition(b"\x00")[0]
            if name not in self.statements:
                out.append(msg(b"E", b"SERROR\x00C26000\x00Mprepared statement \"" + name
                               + b"\" does not exist\x00\x00"))
                self.skipping = True
                return
            self.portal = self.statements[name]
            out.append(BIND_COMPLETE)
        elif k == b"D":
            out.append(NO_DATA)
        elif k == b"E":
            if self.portal.startswith(b"COPY"):
                self.copy_in, self.copy_extended = True, True
                out.append(COPY_IN)
            elif b"FAIL" in self.portal:
                out.append(ERROR)
                self.skipping = True
            else:
                out.append(complete(b"SELECT 1"))
        elif k == b"C":
            name = body[1:].partition(b"\x00")[0]
            self.statements.pop(name, None)
            out.append(CLOSE_COMPLETE)
        elif k == b"S":
            out.append(READY_I)

    def _error(self, out: list[bytes]) -> None:
        self.copy_in = False
        out.append(ERROR)
        if self.copy_extended:
            self.skipping = True
        else:
            out.append(READY_I)


class Link:
    """One client linked to one server, with what net/client.py and net/server.py do
    between the readers and the sockets (no pipelining: one client per server)."""

    def __init__(self) -> None:
        registry = Registry()
        stats = PoolStats()
        self.st = ServerStatements(registry, 100, stats)
        self.client_statements = ClientStatements(registry, 100)
        assert self.st.attach(self.client_statements) == b""
        self.requests = RequestReader(1 << 20)
        self.requests.rewriting = True
        self.ledger = self.requests.ledger
        self.replies = ReplyReader(self.st, stats)
        self.replies.frontend = self.ledger
        self.replies.client_params = {}
        self.postgres = Postgres()
        self.to_server = b""
        self.released = 0
        self.verdicts: list[int] = []

    def client_sends(self, data: bytes) -> None:
        self.to_server += self.requests.feed(data, self.st, True)
        assert self.requests.error is None

    def server_runs(self) -> None:
        """PostgreSQL reads everything sent so far and answers; the answers are read."""
        while self.to_server:
            data, self.to_server = self.to_server, b""
            self._read(self.postgres.feed(data))
            if self.st.requests.blocked or self.requests.blocked:
                self._resume()

    def _read(self, data: bytes) -> None:
        event = self.replies.feed(data)
        while True:
            self.replies.take_out()
            if event == replies.READY:
                if self.ledger.ready():
                    verdict = lk.ready_event(self.ledger, self.replies.status, "transaction",
                                             lk.Link(), False, len(self.st.requests.queue))
                    self.verdicts.append(verdict)
                    assert verdict != lk.LinkEvent.READY_DOUBT, (
                        list(self.st.requests.queue), self.ledger.owed, self.ledger.pending)
                    if verdict == lk.LinkEvent.READY_RELEASE:
                        self.released += 1
            elif event != replies.HIDDEN:
                break
            if not self.replies.more():
                break
            event = self.replies.feed(b"")

    def _resume(self) -> None:
        """net/outbox.py resume_rewriting: carry on with what waited for the queue."""
        reader = self.requests
        if not reader.blocked:
            return
        reader.blocked = False
        self.st.requests.blocked = False
        held, reader.held = reader.held, b""
        if held:
            self.to_server += reader.rewrite_whole(self.st, held)
            if reader.blocked:
                return
        if reader.partial:
            self.client_sends(reader.take_partial())


STEP = hs.sampled_from(["query", "unnamed", "named", "named-fail", "copy-simple",
                        "copy-unnamed", "copy-named", "close", "query-inside"])


def step_messages(step: str, name: int, rows: int, fail: bool, known: set[str]) -> bytes:
    """A driver's exchange: a named statement is parsed the first time only, as drivers do."""
    stmt = f"s{name}"
    if step == "query":
        return msg(b"Q", b"SELECT 1\x00")
    if step == "copy-simple":
        data = [COPY_DATA] * rows + ([BAD_COPY_DATA] if fail else [])
        return msg(b"Q", b"COPY t FROM STDIN\x00") + b"".join(data) + COPY_DONE
    if step == "close":
        known.discard(stmt)
        return msg(b"C", b"S" + stmt.encode() + b"\x00") + SYNC
    if step == "query-inside":
        # A simple Query inside an extended segment: answered if the segment did not fail
        # before it, skipped (no ReadyForQuery) if it did.
        stmt = f"{stmt}inside{'-fail' if fail else ''}"
        head = (b"" if stmt in known else parse(stmt, "SELECT FAIL" if fail else "SELECT 1"))
        known.add(stmt)
        return head + bind(stmt) + EXECUTE + msg(b"Q", b"SELECT 1\x00") + SYNC
    if step in ("unnamed", "copy-unnamed"):
        sql = "COPY t FROM STDIN" if step == "copy-unnamed" else "SELECT 1"
        head = parse("", sql) + bind("")
    else:
        stmt = stmt + step  # one text per name
        sql = {"named": "SELECT 1", "named-fail": "SELECT FAIL",
               "copy-named": "COPY t FROM STDIN"}[step]
        head = (b"" if stmt in known else parse(stmt, sql)) + bind(stmt)
        known.add(stmt)
    out = head + DESCRIBE + EXECUTE + SYNC
    if step.startswith("copy"):
        out += b"".join([COPY_DATA] * rows + ([BAD_COPY_DATA] if fail else [])) + COPY_DONE
        out += SYNC
    return out


@settings(max_examples=400, deadline=None)
@given(hs.lists(hs.tuples(STEP, hs.integers(0, 2), hs.integers(0, 2), hs.booleans()),
                min_size=1, max_size=10),
       hs.booleans())
def test_the_ledger_and_the_statement_queue_never_disagree(steps, pipelined) -> None:
    link = Link()
    known: set[str] = set()
    for done, (step, name, rows, fail) in enumerate(steps, 1):
        data = step_messages(step, name, rows, fail, known)
        if pipelined:
            link.client_sends(data)  # the whole exchange before any reply
        else:
            buffer = MessageBuffer()
            buffer.feed(data)
            for kind, body in buffer.messages():  # each message answered before the next
                link.client_sends(bytes([kind]) + struct.pack("!I", len(body) + 4) + body)
                link.server_runs()
        link.server_runs()
        assert link.ledger.idle(), (step, link.ledger.owed, link.ledger.unsynced)
        assert not link.st.requests.queue, (step, list(link.st.requests.queue))
        assert link.released == done, (step, link.verdicts)


def test_a_queue_left_waiting_when_the_ledger_is_done_closes_the_server() -> None:
    """The check itself: a ReadyForQuery that leaves the ledger owed nothing while the
    queue still holds a request means one of them is wrong; the server is not handed on."""
    link = Link()
    link.client_sends(parse("s", "SELECT 1") + bind("s") + EXECUTE + SYNC)
    assert link.st.requests.queue and link.ledger.pending == 1
    link.ledger.request(m.SYNC)  # a second Sync counted by the ledger alone
    assert not link.ledger.ready()  # the ReadyForQuery of the first Sync
    assert link.ledger.ready()  # of the second: owed nothing more
    assert lk.ready_event(link.ledger, ord("I"), "transaction", lk.Link(), False,
                          len(link.st.requests.queue)) == lk.LinkEvent.READY_DOUBT
