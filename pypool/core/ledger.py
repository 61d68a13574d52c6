"""The frontend ledger: what a client has sent to its server and what it is still owed.

Theory of operation. A server may go back to the pool only when its client is owed nothing:
no ReadyForQuery outstanding and no extended-protocol segment left open. PostgreSQL answers
each simple Query, FunctionCall and Sync with exactly one ReadyForQuery, with one exception
that this ledger exists to get right: COPY FROM STDIN.

- `owed` lists, in the order they were sent, the requests still owed a ReadyForQuery (the
  message type byte of each Query, FunctionCall and Sync), with the CopyDone and CopyFail
  messages the client sent in between (they bound a COPY, below). `pending` counts the
  requests in it.
- `unsynced` is true while extended-protocol messages (Parse, Bind, Describe, Execute, Close)
  were sent after the last Sync: the server owes their replies, and a ReadyForQuery after
  the Sync to come.
- COPY. When the server answers with CopyInResponse (or CopyBothResponse) it is in copy-in
  mode, reading CopyData until CopyDone or CopyFail, and it *ignores* every Sync (and
  Flush) it reads meanwhile (protocol chapter, "COPY Operations"). A driver running COPY
  through the extended protocol sends Parse/Bind/Execute/Sync, then CopyData..., CopyDone,
  Sync: two Syncs, one ReadyForQuery. So on CopyInResponse the Syncs already sent between
  the COPY's Execute and the client's CopyDone are struck from `owed`, and Syncs sent later,
  while the client is still in copy-in, are not counted.
- A COPY that fails on the server (ErrorResponse in copy-in mode) ends copy-in at once: in
  the simple protocol a ReadyForQuery follows; in the extended one the server skips to the
  next Sync. CopyData, CopyDone and CopyFail that arrive when nothing is owed (the COPY
  already failed and was answered) are ignored by PostgreSQL; the ledger says to drop them,
  so they never take a server from the pool for a reply that will never come.
- A Sync sent during copy-in after CopyData, then a copy failure, leave it unknowable whether
  the server read that Sync in copy-in (ignored) or after the failure (answered): the ledger
  is then `doubtful`, and the server must be closed rather than handed on; so does any other
  message sent during copy-in (it makes the COPY fail, and what follows it is answered).
  A Sync before any CopyData and any other message is surely ignored. "During copy-in"
  includes what was sent before the CopyInResponse came, after the COPY's request and before
  the client's CopyDone or CopyFail: a Query or FunctionCall owed there, or an
  extended-protocol segment opened there (`owed` keeps a SEGMENT mark where a segment was
  opened behind requests still owed: a position, never answered).

- An extended-protocol error makes PostgreSQL skip everything up to the next Sync, a simple
  Query or FunctionCall sent in between too: no ReadyForQuery answers those. Only the
  server's prepared-statement queue can tell which error was such an error (it knows what
  each reply answers), so it counts the Queries it sees skipped and they are struck here
  (`skipped`). With no queue (prepared statements not rewritten) such a Query stays owed:
  the server stays with its client, and is closed, never handed on, when it leaves.

The ledger never decides alone: `ready()` says whether the client is owed nothing more, and
the caller releases the server only then, on a ReadyForQuery with status `I`.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Final

from ..protocol import messages as m

if TYPE_CHECKING:
    from ..pooling.prepared.request_queue import RequestQueue

# What a frontend message means for the ledger, by type byte (ACTION[kind]; 0: not allowed
# after the startup).
OWES_READY: Final = 1  # Query, FunctionCall, Sync: one ReadyForQuery owed
OPENS_SEGMENT: Final = 2  # Parse, Bind, Describe, Execute, Close: replies owed up to a Sync
FLUSH: Final = 3  # asks for pending output, owes nothing of its own
TERMINATE: Final = 4
COPY_MESSAGE: Final = 5  # CopyData, CopyDone, CopyFail
# In `owed`: an extended-protocol segment was opened here, behind the requests before it (a
# position for a COPY's window, never answered; dropped once those are).
SEGMENT: Final = m.PARSE
_KINDS: Final = {
    OWES_READY: (m.QUERY, m.FUNCTION_CALL, m.SYNC),
    OPENS_SEGMENT: (m.PARSE, m.BIND, m.DESCRIBE, m.EXECUTE, m.CLOSE),
    FLUSH: (m.FLUSH,),
    TERMINATE: (m.TERMINATE,),
    COPY_MESSAGE: (m.COPY_DATA, m.COPY_DONE, m.COPY_FAIL),
}
ACTION: Final = bytes(
    next((action for action, kinds in _KINDS.items() if kind in kinds), 0)
    for kind in range(256)
)

# The COPY sub-state, as the server's replies made it.
NO_COPY: Final = 0
COPY_IN: Final = 1  # the server reads the client's CopyData (CopyInResponse, CopyBothResponse)
COPY_OUT: Final = 2  # the server sends CopyData (CopyOutResponse) until its CopyDone

_SYNC: Final = m.SYNC
_QUERY: Final = m.QUERY
_FUNCTION_CALL: Final = m.FUNCTION_CALL
_COPY_DONE: Final = m.COPY_DONE
_COPY_FAIL: Final = m.COPY_FAIL
_SEGMENT: Final = SEGMENT


class FrontendLedger:
    """One client's requests in flight. Fed frontend message types as they are sent and the
    server's ReadyForQuery, CopyIn/Out/BothResponse and copy-in ErrorResponse as they come."""

    def __init__(self) -> None:
        # What is owed, oldest first: the message types of the requests a ReadyForQuery
        # answers (Query, FunctionCall, Sync) and of the CopyDone/CopyFail sent among them.
        # The oldest is `first` (0: nothing owed), the rest in `later`, None while there
        # are no more: a client's usual transaction owes one at a time, and touches no
        # container. A deque: a client may pipeline a million Queries before it reads a
        # reply, and each ReadyForQuery takes the oldest (a list's pop(0) is quadratic).
        self.first = 0
        self.later: deque[int] | None = None
        self.pending = 0
        self.unsynced = False
        self.copy = NO_COPY
        self.copy_extended = False  # the COPY in progress came through the extended protocol
        self.syncs_in_copy = 0  # Syncs sent during copy-in after CopyData, not counted
        self.copy_data_sent = False  # CopyData sent since the last ReadyForQuery
        self.doubtful = False
        self.errors = 0  # ErrorResponses the server sent it (pooling/session_state/)

    @property
    def owed(self) -> list[int]:
        """What is owed, oldest first (for the tests and log lines)."""
        return ([self.first, *self.later] if self.later else [self.first]) if self.first else []

    def _owe(self, kind: int) -> None:
        if not self.first:
            self.first = kind
        elif self.later is None:
            self.later = deque((kind,))
        else:
            self.later.append(kind)

    def _take_oldest(self) -> int:
        oldest = self.first
        later = self.later
        if later:
            self.first = later.popleft()
            if not later:
                self.later = None
        else:
            self.first = 0
        return oldest

    def idle(self) -> bool:
        """Owed nothing: the server could serve someone else (given ReadyForQuery 'I')."""
        return not self.pending and not self.unsynced and self.copy == NO_COPY

    # --- what the client sends --------------------------------------------------------------

    def segment(self) -> None:
        """A Parse, Bind, Describe, Execute or Close was sent: owed up to the next Sync."""
        self.unsynced = True
        if self.first:
            # Behind requests owed (a pipeline): where, for a COPY's window; once for the
            # messages that follow each other.
            later = self.later
            if (later[-1] if later else self.first) != _SEGMENT:
                self._owe(_SEGMENT)
        if self.copy == COPY_IN:
            self.doubtful = True  # ends the COPY with an error: see the module docstring

    def answers(self, kind: int) -> bool:
        """Whether PostgreSQL will answer this Query, FunctionCall or Sync: not a Sync read
        in copy-in mode. The prepared-statement queue queues a request only if so, so that
        it and this ledger count the same requests."""
        return kind != _SYNC or self.copy != COPY_IN

    def request(self, kind: int) -> None:
        """A Query, FunctionCall or Sync was sent."""
        if kind == _SYNC:
            self.unsynced = False
            if self.copy == COPY_IN:
                # Read in copy-in mode, ignored by the server (unless the COPY fails on data
                # sent before it: copy_failed).
                if self.copy_data_sent:
                    self.syncs_in_copy += 1
                return
        elif self.copy == COPY_IN:
            self.doubtful = True  # ends the COPY with an error: see the module docstring
        self._owe(kind)
        self.pending += 1

    def copy_message(self, kind: int) -> bool:
        """CopyData, CopyDone or CopyFail: False if it must be dropped (nothing is owed, so
        the COPY it belonged to is over and PostgreSQL would ignore it)."""
        if self.idle():
            return False
        if kind == m.COPY_DATA:
            self.copy_data_sent = True
        elif kind == _COPY_DONE or kind == _COPY_FAIL:
            if self.copy == COPY_IN:
                # Ends the COPY already known; it bounds no COPY to come (a second COPY in
                # the same Query starts after it).
                self.copy = NO_COPY
                if self.copy_extended:
                    self.unsynced = True  # the server waits for a Sync after the COPY
            else:
                self._owe(kind)  # sent before its CopyInResponse came: a bound
        return True

    # --- what the server answers ------------------------------------------------------------

    def copy_started(self, kind: int, queue: RequestQueue) -> None:
        """CopyInResponse, CopyOutResponse or CopyBothResponse from the server. The Syncs the
        server will ignore are struck here and from the server's prepared-statement `queue`
        in the same step, so the two never count different requests."""
        struck = self._copy_started(kind)
        if struck:
            queue.ignored_syncs(struck)

    def _copy_started(self, kind: int) -> int:
        owed = self.owed
        head = -1
        for entry in owed:
            if entry != _COPY_DONE and entry != _COPY_FAIL and entry != _SEGMENT:
                head = entry
                break
        # The request running the COPY: a Sync ends an extended segment; none sent yet also
        # means extended (Parse/Bind/Execute then a Flush).
        self.copy_extended = head == _SYNC or (head == -1 and self.unsynced)
        if kind == m.COPY_OUT_RESPONSE:
            self.copy = COPY_OUT
            return 0
        # Copy-in: strike the Syncs sent before the client's CopyDone/CopyFail, if it has
        # sent one already; else all of them, and stop counting Syncs until it does. A
        # Query, FunctionCall or segment after the COPY's request and before that bound is
        # read in copy-in: the COPY fails there, and what follows is answered (doubtful).
        kept: list[int] = []
        ended = False
        head_seen = False
        struck = 0
        for entry in owed:
            if entry == _COPY_DONE or entry == _COPY_FAIL:
                ended = True
            elif entry == _SEGMENT:
                if head_seen and not ended:
                    self.doubtful = True
                continue  # a position only: its part is done here
            elif not ended:
                if head_seen and entry != _SYNC:
                    self.doubtful = True
                head_seen = True
                if entry == _SYNC:
                    self.pending -= 1
                    struck += 1
                    continue
            kept.append(entry)
        self.first = kept[0] if kept else 0
        self.later = deque(kept[1:]) if len(kept) > 1 else None
        if ended:
            if self.copy_extended and _SYNC not in kept:
                self.unsynced = True
        else:
            self.copy = COPY_IN
            self.syncs_in_copy = 0
        return struck

    def skipped(self, queue: RequestQueue) -> None:
        """The server's prepared-statement `queue` found Queries or FunctionCalls that
        PostgreSQL skips (sent after an extended-protocol error, before its Sync): no
        ReadyForQuery answers them, so they are struck here, oldest first, in the same step.
        They are the oldest requests owed (everything before the failed segment was
        answered); finding a Sync first means the two disagree: doubtful."""
        count, queue.skipped = queue.skipped, 0
        kept: list[int] = []
        for entry in self.owed:
            if entry == _SEGMENT:
                continue  # a position only (skipped Queries end no COPY window)
            if count:
                if entry == _QUERY or entry == _FUNCTION_CALL:
                    count -= 1
                    self.pending -= 1
                    continue
                if entry == _SYNC:
                    count = -1  # a Sync before them: the queue and this ledger disagree
            kept.append(entry)
        self.first = kept[0] if kept else 0
        self.later = deque(kept[1:]) if len(kept) > 1 else None
        if count:
            self.doubtful = True

    def copy_failed(self) -> None:
        """An ErrorResponse: if the server was in copy-in, it left copy-in there."""
        if self.syncs_in_copy:
            # Even after the client's CopyDone: the server may have failed before reading
            # those Syncs, and will answer them.
            self.doubtful = True
        if self.copy != COPY_IN:
            return
        self.copy = NO_COPY
        if self.syncs_in_copy:
            self.doubtful = True  # read before the failure (ignored) or after (answered)?
        if self.copy_extended:
            self.unsynced = True  # the server skips to the next Sync

    def ready(self) -> bool:
        """A ReadyForQuery from the server answered the oldest request; True when the client
        is owed nothing more."""
        while self.first:
            entry = self._take_oldest()
            if entry != _COPY_DONE and entry != _COPY_FAIL and entry != _SEGMENT:
                break
        # A CopyDone/CopyFail now at the front ended a COPY of the request just answered
        # (or was sent after it was refused): it bounds no COPY to come. A SEGMENT mark
        # there is behind nothing owed any more.
        first = self.first
        while first and (first == _COPY_DONE or first == _COPY_FAIL or first == _SEGMENT):
            self._take_oldest()
            first = self.first
        if self.pending > 0:
            self.pending -= 1
        else:
            self.doubtful = True  # a ReadyForQuery nobody asked for
        self.copy = NO_COPY
        self.syncs_in_copy = 0
        self.copy_data_sent = False
        return self.idle()

    def reset(self) -> None:
        """The server is gone (or the client is): nothing is in flight any more."""
        self.first = 0
        self.later = None
        self.pending = 0
        self.unsynced = False
        self.copy = NO_COPY
        self.syncs_in_copy = 0
        self.copy_data_sent = False
        self.doubtful = False
