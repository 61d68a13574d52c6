"""The request queue: one entry per request sent to a server on the linked client's behalf
(or answered by the pooler itself), in the order sent, and the matching of each server reply
to the entry at its head.

`RequestQueue` owns the queue and what is known of the server's progress through it: how
replies must be read (`tracking`), the Sync segments and ReadyForQuery counts, the requests
an error may still undo, the skip to the next Sync after an ErrorResponse. `reply` and
`pop_ready` take the server's messages; `_push` queues. What a completed or skipped request
means for the statements is not decided here: `_settled`, `_undo_hidden`, `_command_tag`
and `distrust` are defined by the layers above (cache.py, sql.py). Its vocabulary is in
requests.py. It never looks at a client message.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from ...protocol import messages as m
from .requests import (
    COMPLETES,
    FORWARD,
    NO_SUCH_STATEMENT,
    OP_FAIL,
    OP_GUARD,
    OP_HIDDEN,
    OP_NAMED,
    OP_RENAME,
    OP_SQL,
    PLAIN_QUERY,
    PLAIN_SYNC,
    R_NAME,
    R_OP,
    R_PAYLOAD,
    R_SEGMENT,
    R_STMT,
    R_SWALLOW,
    R_WAIT,
    READY,
    REPLACE,
    SWALLOW,
    UNDOABLE,
    W_SYNC,
    W_SYNTHETIC,
    Request,
)

if TYPE_CHECKING:
    from ..pool import PoolStats
    from .registry import ClientStatements, Registry, Statement

log = logging.getLogger("pypool.prepared")


class RequestQueue:
    """The requests outstanding on one server, and the reading of its replies."""

    def __init__(self, registry: Registry, stats: PoolStats | None = None) -> None:
        self.registry = registry
        self.stats = stats
        self.client: ClientStatements | None = None
        self.queue: deque[Request] = deque()
        # How the server's replies must be read: 0 on the hot path (the queue is empty or
        # its head is a plain Sync or Query, done at the next ReadyForQuery), 1 one message
        # at a time against the queue, 2 the same but a synthesised reply is at the head and
        # must go to the client before the next server message.
        self.tracking = 0
        self.segment = 0  # Syncs queued so far
        # The transaction status of the last ReadyForQuery, and the requests queued and done
        # that end with one: while they differ, the status further on is not known yet.
        self.tx_status = m.TX_IDLE
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
        self.blocked = False  # a WAIT was returned; the client waits for the queue to move
        # Requests whose effect an error may still undo, by segment: while an earlier
        # segment has some, a statement name is not looked up (WAIT), since its answer may
        # change. (Within one segment an error skips the rest anyway.)
        self.undoable: dict[int, int] = {}
        self.to_client: list[bytes] = []  # synthesised replies ready to go out
        self.replacement = b""  # the message to send for a REPLACE verdict

    # --- what the layers above decide -----------------------------------------------------

    def _settled(self, request: Request, ok: bool) -> None:
        """Apply a completed request's operation, or undo a failed or skipped one."""

    def _undo_hidden(self, request: Request) -> None:
        """A pooler-issued SQL-level statement failed (sql.py)."""

    def _command_tag(self, body: bytes) -> None:
        """A CommandComplete tag starting with "D" (sql.py)."""

    def distrust(self, why: str) -> None:
        """The server's statements cannot be trusted any more (cache.py)."""

    def _guard_error(self, body: bytes, request: Request) -> int:
        """An ErrorResponse for a request of the query_wait_timeout guard (guard.py):
        SWALLOW for its deadline error, else FORWARD."""
        return FORWARD

    # --- queueing -------------------------------------------------------------------------

    def _push(self, request: Request) -> None:
        queue = self.queue
        queue.append(request)
        self.open_count += 1
        wait = request[R_WAIT]
        if wait >= W_SYNC:
            self.readies_queued += 1
        op = request[R_OP]
        if op:
            if op in UNDOABLE:
                segment = request[R_SEGMENT]
                self.undoable[segment] = self.undoable.get(segment, 0) + 1
            if op != OP_NAMED:
                self.open_fine = True
            elif wait < W_SYNC:
                stmt, name = request[R_STMT], request[R_NAME]
                assert stmt is not None and name is not None
                self.open_renames.append((stmt, name))
        if request[R_SWALLOW] or wait == W_SYNTHETIC or wait >= W_SYNC:
            self.open_fine = True
        if len(queue) == 1:
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
        return self.readies_queued == self.readies_done and self.tx_status != m.TX_FAILED

    def _retrack(self) -> None:
        queue = self.queue
        if not queue:
            self.tracking = 0
            return
        head = queue[0]
        if head == PLAIN_QUERY or head == PLAIN_SYNC or head[R_OP] == OP_RENAME:
            self.tracking = 0
        elif head[R_WAIT] == W_SYNTHETIC:
            self.tracking = 2
        else:
            self.tracking = 1

    # --- server replies -------------------------------------------------------------------

    def reply(self, kind: int, body: bytes) -> int:
        """A whole server message while `tracking`; `body` is given for CommandComplete,
        ErrorResponse and ReadyForQuery. Returns the verdict; synthesised replies that must
        follow it are left in `to_client`."""
        queue = self.queue
        if not queue:
            return READY if kind == m.READY_FOR_QUERY else FORWARD
        head = queue[0]
        wait = head[R_WAIT]
        if wait >= W_SYNC:
            if kind == m.READY_FOR_QUERY:
                queue.popleft()
                self.readies_done += 1
                self.tx_status = body[0]
                if head[R_OP]:
                    self._settle(head, True)
                self._advance()
                return SWALLOW if head[R_SWALLOW] else READY
            if kind == m.COMMAND_COMPLETE:
                if head[R_OP] == OP_SQL:
                    head[R_PAYLOAD].tags += 1
                self._command_tag(body)
            elif kind == m.ERROR_RESPONSE:
                if head[R_OP] == OP_SQL or head[R_OP] == OP_NAMED:
                    if head[R_OP] == OP_SQL:
                        head[R_PAYLOAD].failed = True
                    if head[R_STMT] is not None:
                        return self._rename_error(body, head)
                elif head[R_OP] == OP_HIDDEN:
                    # Undone now; settled (done with) at its ReadyForQuery, like the rest.
                    self._undo_hidden(head)
                    fields = m.parse_error_fields(body)
                    log.warning("pooler-issued statement failed: %s %s", fields.get("C"),
                                fields.get("M"))
            return SWALLOW if head[R_SWALLOW] else FORWARD
        assert wait != W_SYNTHETIC, "emit_synthetic() comes first while tracking == 2"
        if kind == m.ERROR_RESPONSE:  # the head failed, the server skips to the next Sync
            verdict = FORWARD
            op = head[R_OP]
            if op == OP_NAMED:
                verdict = self._rename_error(body, head)
            elif op == OP_FAIL:
                self.replacement = head[R_PAYLOAD]
                verdict = REPLACE
            elif op == OP_GUARD:
                verdict = self._guard_error(body, head)
            self._skip_to_sync()
            if op == OP_GUARD and verdict == SWALLOW:
                # A pipelined client's deadline passed before its transaction began: the
                # server skips it to its Sync. Told once the queue has settled the skip.
                guard = head[R_PAYLOAD]
                guard.on_verdict(guard)
            return verdict
        if COMPLETES[kind] == wait:
            queue.popleft()
            if head[R_OP]:
                self._settle(head, True)
            if kind == m.COMMAND_COMPLETE:
                self._command_tag(body)
            self._advance()
            return SWALLOW if head[R_SWALLOW] else FORWARD
        return FORWARD  # DataRow, ParameterDescription, NoticeResponse, Copy*, ...

    def ignored_syncs(self, count: int) -> None:
        """PostgreSQL will ignore `count` of the client's Syncs: they reached it in copy-in
        mode (core/ledger.py strikes them from the client's ledger). The oldest Sync entries
        go, as answered, so this queue and the ledger keep agreeing."""
        queue = self.queue
        kept: list[Request] = []
        while count and queue:
            request = queue.popleft()
            if request[R_WAIT] == W_SYNC:
                count -= 1
                self.readies_done += 1
                if request[R_OP]:
                    self._settle(request, True)
            else:
                kept.append(request)
        for request in reversed(kept):
            queue.appendleft(request)
        self._retrack()

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
        while queue and queue[0][R_WAIT] == W_SYNTHETIC:
            request = queue.popleft()
            out.append(request[R_PAYLOAD])
            if request[R_OP]:
                self._settle(request, True)
        self._retrack()
        return b"".join(out)

    def renamed_error(self, body: bytes) -> bytes | None:
        """An ErrorResponse on the hot path while a folded segment is at the head (see
        `_sync`): the message with the client's statement name, or None if unchanged."""
        queue = self.queue
        if not queue or queue[0][R_OP] != OP_RENAME:
            return None
        for stmt, name in queue[0][R_PAYLOAD]:
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
        if queue and queue[0][R_WAIT] == W_SYNTHETIC:
            self.to_client.append(self.emit_synthetic())
        else:
            self._retrack()

    def _skip_to_sync(self) -> None:
        queue = self.queue
        skipped = []
        while queue and queue[0][R_WAIT] != W_SYNC:
            request = queue.popleft()
            if request[R_WAIT] >= W_SYNC:
                self.readies_done += 1  # a Query after the error: skipped, no ReadyForQuery
            skipped.append(request)
        if not queue:
            self.discarding = True  # the client's Sync is still to come
        for request in reversed(skipped):
            if request[R_OP]:
                self._settle(request, False)
        self._retrack()

    def _rename_error(self, body: bytes, request: Request) -> int:
        """A Bind or Describe failed naming our statement: name the client's instead."""
        stmt, name = request[R_STMT], request[R_NAME]
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
        """A request completed (ok) or was skipped after an error: its undo is no longer
        pending, and the layer that owns its operation applies or undoes it."""
        op = request[R_OP]
        if op in UNDOABLE:
            segment = request[R_SEGMENT]
            left = self.undoable[segment] - 1
            if left:
                self.undoable[segment] = left
            else:
                del self.undoable[segment]
        self._settled(request, ok)
