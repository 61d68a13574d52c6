"""The request queue: one entry per request sent to a server on the linked client's behalf
(or answered by the pooler itself), in the order sent, and the matching of each server reply
to the entry at its head.

`RequestQueue` owns the queue and what is known of the server's progress through it: how
replies must be read (`tracking`), the Sync segments and ReadyForQuery counts, the requests
an error may still undo, the skip to the next Sync after an ErrorResponse, and the open
segment (requests queued since the last Sync) that a Sync may fold into itself (`fold`).
`reply` and `pop_ready` take the server's messages; `push` queues.

What a completed or skipped request means for the statements is not decided here: the queue
tells its `owner` (the ServerStatements that holds it, rewriter.py), through `Outcomes`. Its
vocabulary is in requests.py. It never looks at a client message.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ...protocol import messages as m
from .requests import (
    COMPLETES,
    NO_SUCH_STATEMENT,
    PLAIN_QUERY,
    PLAIN_SYNC,
    UNDOABLE,
    Op,
    Request,
    Tracking,
    Verdict,
    Wait,
)

if TYPE_CHECKING:
    from .registry import Statement

log = logging.getLogger("pypool.prepared")


class Outcomes(Protocol):
    """What the queue's owner decides when a request settles or a reply says something about
    the server's statements (ServerStatements, rewriter.py)."""

    def settled(self, request: Request, ok: bool) -> None:
        """Apply a completed request's operation, or undo a failed or skipped one."""

    def hidden_failed(self, request: Request) -> None:
        """A pooler-issued SQL-level statement failed (sql.py)."""

    def command_tag(self, body: bytes) -> None:
        """A CommandComplete tag (only those starting with "D" matter)."""

    def distrust(self, why: str) -> None:
        """The server's statements cannot be trusted any more."""

    def guard_error(self, body: bytes, request: Request) -> int:
        """An ErrorResponse for a request of the query_wait_timeout guard: its Verdict."""


class RequestQueue:
    """The requests outstanding on one server, and the reading of its replies."""

    def __init__(self, owner: Outcomes) -> None:
        self.owner = owner
        self.queue: deque[Request] = deque()
        # Its append and popleft, bound once: compiled code looks a deque's method up at
        # every call (bench/README.md, "Looked up by name"). The hot path's pushes
        # (rewriter.py) and `pop_ready` use them.
        self.append: Callable[[Request], None] = self.queue.append
        self._popleft: Callable[[], Request] = self.queue.popleft
        self.tracking = Tracking.HOT  # how the server's replies must be read (Tracking)
        self.segment = 0  # Syncs queued so far
        # The transaction status of the last ReadyForQuery, and the requests queued and done
        # that end with one: while they differ, the status further on is not known yet.
        self.tx_status = m.TX_IDLE
        self.readies_queued = 0
        self.readies_done = 0
        # A server error came before the client's Sync: the server skips the client's
        # messages up to it, so they are dropped here (and not queued) until then.
        self.discarding = False
        # Queries and FunctionCalls that an error made PostgreSQL skip (no ReadyForQuery
        # answers them): struck from the client's ledger by whoever holds both
        # (FrontendLedger.skipped), so the two never count different requests.
        self.skipped = 0
        # Whether the segment still open (no Sync yet) has requests whose replies need more
        # than forwarding; if not, its Sync stands in for all of them (`fold`).
        self.open_fine = False
        self.open_count = 0  # requests queued since the last Sync
        # Their statement names. This and the two containers below are None while empty:
        # a transaction that needs none of them (the common one) does not read them.
        self.open_renames: list[tuple[Statement, bytes]] | None = None
        self.blocked = False  # a WAIT was returned; the client waits for the queue to move
        # Requests whose effect an error may still undo, by segment: while an earlier
        # segment has some, a statement name is not looked up (WAIT), since its answer may
        # change. (Within one segment an error skips the rest anyway.)
        self.undoable: dict[int, int] | None = None
        self.to_client: list[bytes] | None = None  # synthesised replies ready to go out
        self.replacement = b""  # the message to send for a REPLACE verdict
        self.links = 0  # clients linked so far: the statement cache's epoch (cache.py)

    # --- queueing -------------------------------------------------------------------------

    def push(self, request: Request) -> None:
        queue = self.queue
        queue.append(request)
        self.open_count += 1
        wait = request.wait
        if wait >= Wait.SYNC:
            self.readies_queued += 1
        op = request.op
        if op:
            if op in UNDOABLE:
                self.may_undo(request.segment)
            if op != Op.NAMED:
                self.open_fine = True
            elif wait < Wait.SYNC:
                stmt, name = request.stmt, request.name
                assert stmt is not None and name is not None
                self.rename(stmt, name)
        if request.swallow or wait == Wait.SYNTHETIC or wait >= Wait.SYNC:
            self.open_fine = True
        if len(queue) == 1:
            self.retrack()

    def may_undo(self, segment: int) -> None:
        """A request queued in `segment` has an effect an error may still undo."""
        undoable = self.undoable
        if undoable is None:
            undoable = self.undoable = {}
        undoable[segment] = undoable.get(segment, 0) + 1

    def rename(self, stmt: Statement, name: bytes) -> None:
        """A request of the open segment names `stmt`, the client's `name`."""
        if self.open_renames is None:
            self.open_renames = [(stmt, name)]
        else:
            self.open_renames.append((stmt, name))

    def must_wait(self) -> bool:
        """Whether a request in an earlier segment may still be undone (see `undoable`)."""
        undoable = self.undoable
        if undoable and min(undoable) < self.segment:
            self.blocked = True
            return True
        return False

    def status_known(self) -> bool:
        """Whether the server will not be in a failed transaction when it reaches what is
        queued next: no ReadyForQuery is owed before it and the last one was not "E". (An
        error in between makes the server skip it altogether.)"""
        return self.readies_queued == self.readies_done and self.tx_status != m.TX_FAILED

    def retrack(self) -> None:
        queue = self.queue
        if not queue:
            self.tracking = Tracking.HOT
            return
        head = queue[0]
        if head is PLAIN_QUERY or head is PLAIN_SYNC or head.op == Op.RENAME:
            self.tracking = Tracking.HOT
        elif head.wait == Wait.SYNTHETIC:
            self.tracking = Tracking.SYNTHETIC
        else:
            self.tracking = Tracking.EACH

    def fold(self) -> Request | None:
        """The client's Sync closes the open segment. When nothing in it needs its reply read
        (plain requests, Binds of statements the server has: the steady state of every
        driver), its requests are taken back off the queue and the Sync stands for them:
        the hot path forwards their replies and is done at the ReadyForQuery. Only the
        statement names are kept, to name the client's in an error. Returns the Sync's
        request (PLAIN_SYNC, or one of Op.RENAME), or None when one statement goes by two
        client names in the segment: then nothing is folded (which name failed? Keep them
        apart)."""
        if self.open_fine or not self.open_count:
            return PLAIN_SYNC
        # The segment's requests are the last ones queued (those already answered, if any,
        # were taken from the front).
        queue = self.queue
        count = min(self.open_count, len(queue))
        renames = self.open_renames
        if renames is not None and len(renames) > 1 and _ambiguous(renames):
            return None
        if count:
            for _ in range(count):
                queue.pop()
            if renames:
                self.open_renames = None
                return Request(Wait.SYNC, False, Op.RENAME, None, None, self.segment, renames)
        return PLAIN_SYNC

    def close_segment(self, request: Request) -> None:
        """Queue the Sync `request` that ends the open segment."""
        self.queue.append(request)
        self.readies_queued += 1
        self.segment += 1
        self.open_fine = False
        self.open_count = 0
        self.open_renames = None
        self.retrack()

    # --- server replies -------------------------------------------------------------------

    def reply(self, kind: int, body: bytes) -> int:
        """A whole server message while `tracking`; `body` is given for CommandComplete,
        ErrorResponse and ReadyForQuery. Returns the Verdict; synthesised replies that must
        follow it are left in `to_client`."""
        queue = self.queue
        if not queue:
            return Verdict.READY if kind == m.READY_FOR_QUERY else Verdict.FORWARD
        head = queue[0]
        if head.wait >= Wait.SYNC:
            return self._reply_to_ready(kind, body, head)
        assert head.wait != Wait.SYNTHETIC, "emit_synthetic() comes first while SYNTHETIC"
        if kind == m.ERROR_RESPONSE:  # the head failed, the server skips to the next Sync
            verdict = Verdict.FORWARD
            op = head.op
            if op == Op.NAMED:
                verdict = self._rename_error(body, head)
            elif op == Op.FAIL:
                self.replacement = head.payload
                verdict = Verdict.REPLACE
            elif op == Op.GUARD:
                verdict = self.owner.guard_error(body, head)
            self._skip_to_sync()
            if op == Op.GUARD and verdict == Verdict.SWALLOW:
                # A pipelined client's deadline passed before its transaction began: the
                # server skips it to its Sync. Told once the queue has settled the skip.
                guard = head.payload
                guard.on_verdict(guard)
            return verdict
        if COMPLETES[kind] == head.wait:
            queue.popleft()
            if head.op:
                self._settle(head, True)
            if kind == m.COMMAND_COMPLETE:
                self.owner.command_tag(body)
            self._advance()
            return Verdict.SWALLOW if head.swallow else Verdict.FORWARD
        return Verdict.FORWARD  # DataRow, ParameterDescription, NoticeResponse, Copy*, ...

    def _reply_to_ready(self, kind: int, body: bytes, head: Request) -> int:
        """A reply while a Sync or a Query, done at its ReadyForQuery, is at the head."""
        if kind == m.READY_FOR_QUERY:
            self.queue.popleft()
            self.readies_done += 1
            self.tx_status = body[0]
            if head.op:
                self._settle(head, True)
            self._advance()
            return Verdict.SWALLOW if head.swallow else Verdict.READY
        op = head.op
        if kind == m.COMMAND_COMPLETE:
            if op == Op.SQL:
                head.payload.tags += 1
            self.owner.command_tag(body)
        elif kind == m.ERROR_RESPONSE:
            if op == Op.SQL or op == Op.NAMED:
                if op == Op.SQL:
                    head.payload.failed = True
                if head.stmt is not None:
                    return self._rename_error(body, head)
            elif op == Op.HIDDEN:
                # Undone now; settled (done with) at its ReadyForQuery, like the rest.
                self.owner.hidden_failed(head)
                fields = m.parse_error_fields(body)
                log.warning("pooler-issued statement failed: %s %s", fields.get("C"),
                            fields.get("M"))
        return Verdict.SWALLOW if head.swallow else Verdict.FORWARD

    def ignored_syncs(self, count: int) -> None:
        """PostgreSQL will ignore `count` of the client's Syncs: they reached it in copy-in
        mode (core/ledger.py strikes them from the client's ledger). The oldest Sync entries
        go, as answered, so this queue and the ledger keep agreeing."""
        queue = self.queue
        kept: list[Request] = []
        while count and queue:
            request = queue.popleft()
            if request.wait == Wait.SYNC:
                count -= 1
                self.readies_done += 1
                if request.op:
                    self._settle(request, True)
            else:
                kept.append(request)
        for request in reversed(kept):
            queue.appendleft(request)
        self.retrack()

    def pop_ready(self, status: int) -> None:
        """A ReadyForQuery went by on the hot path: its request (a plain Sync or Query at the
        head) is done."""
        self._popleft()
        self.readies_done += 1
        self.tx_status = status
        if self.queue:
            self._advance()

    def emit_synthetic(self) -> bytes:
        """Answer the requests at the head that the pooler answers itself."""
        queue = self.queue
        out = []
        while queue and queue[0].wait == Wait.SYNTHETIC:
            request = queue.popleft()
            out.append(request.payload)
            if request.op:
                self._settle(request, True)
        self.retrack()
        return b"".join(out)

    def renamed_error(self, body: bytes) -> bytes | None:
        """An ErrorResponse on the hot path while a folded segment is at the head (see
        `fold`): the message with the client's statement name, or None if unchanged."""
        queue = self.queue
        if not queue or queue[0].op != Op.RENAME:
            return None
        for stmt, name in queue[0].payload:
            ours = b'"' + stmt.name + b'"'
            if ours in body:
                if NO_SUCH_STATEMENT in body:
                    self.owner.distrust("a Bind found it missing")
                renamed = body.replace(ours, b'"' + name + b'"')
                break
        else:
            return None
        return b"E" + (len(renamed) + 4).to_bytes(4, "big") + renamed

    def _advance(self) -> None:
        queue = self.queue
        if queue and queue[0].wait == Wait.SYNTHETIC:
            if self.to_client is None:
                self.to_client = []
            self.to_client.append(self.emit_synthetic())
        else:
            self.retrack()

    def _skip_to_sync(self) -> None:
        queue = self.queue
        skipped = []
        while queue and queue[0].wait != Wait.SYNC:
            request = queue.popleft()
            if request.wait >= Wait.SYNC:
                self.readies_done += 1  # a Query after the error: skipped, no ReadyForQuery
                self.skipped += 1
            skipped.append(request)
        if not queue:
            self.discarding = True  # the client's Sync is still to come
        for request in reversed(skipped):
            if request.op:
                self._settle(request, False)
        self.retrack()

    def _rename_error(self, body: bytes, request: Request) -> int:
        """A Bind or Describe failed naming our statement: name the client's instead."""
        stmt, name = request.stmt, request.name
        assert stmt is not None and name is not None
        ours = b'"' + stmt.name + b'"'
        if ours not in body:
            return Verdict.FORWARD
        if NO_SUCH_STATEMENT in body:
            # The server lost a statement the pooler prepared there. This request fails (its
            # reply was the error); later ones find the statement parsed again.
            self.owner.distrust("a Bind or Describe found it missing")
        body = body.replace(ours, b'"' + name + b'"')
        self.replacement = b"E" + (len(body) + 4).to_bytes(4, "big") + body
        return Verdict.REPLACE

    def _settle(self, request: Request, ok: bool) -> None:
        """A request completed (ok) or was skipped after an error: its undo is no longer
        pending, and the owner applies or undoes its operation."""
        if request.op in UNDOABLE:
            undoable = self.undoable
            assert undoable is not None
            segment = request.segment
            left = undoable[segment] - 1
            if left:
                undoable[segment] = left
            elif len(undoable) > 1:
                del undoable[segment]
            else:
                self.undoable = None
        self.owner.settled(request, ok)

    # --- the link ends ----------------------------------------------------------------------

    def detach(self) -> None:
        """The client leaves: what was about its requests goes."""
        self.discarding = False
        self.blocked = False
        self.readies_queued = self.readies_done = 0
        self.skipped = 0
        self.undoable = None
        self.to_client = None

    def attach(self) -> None:
        """A client is linked: no segment of its is open yet."""
        self.links += 1
        self.open_fine = False
        self.open_count = 0
        self.open_renames = None

    def close(self) -> list[Statement]:
        """The server is gone: empty the queue. Returns the statements whose reference a
        queued Close owned (Op.EVICT, Op.CLOSE), for the caller to give back."""
        owned = [request.stmt for request in self.queue
                 if request.op in (Op.EVICT, Op.CLOSE) and request.stmt is not None]
        self.queue.clear()
        self.readies_queued = self.readies_done = self.skipped = 0
        self.tracking = Tracking.HOT
        return owned


def _ambiguous(renames: list[tuple[Statement, bytes]]) -> bool:
    """Whether one statement goes by two client names in these."""
    seen: dict[int, bytes] = {}
    return any(seen.setdefault(id(stmt), name) != name for stmt, name in renames)
