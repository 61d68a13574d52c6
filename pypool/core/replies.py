"""The reply reader: a server's byte stream after login, framed and judged for its client.

Theory of operation. `ReplyReader.feed(data)` takes what the server sent and leaves the bytes
for the linked client, in order, for `take_out`; it returns DONE when everything fed is dealt with,
or stops early, with the rest kept, when the connection must act before reading on:

- READY: a ReadyForQuery for the client is among them (`status` says its transaction
  status). The client's FrontendLedger then decides whether the server is released
  (core/link.py `ready_event`); what follows may belong to the next client of a pipeline
  line, so the caller writes what `take_out` gives and acts before it calls `feed(b"")`
  to read on.
- HIDDEN: a reply to one of the pooler's own queries settled it (`outcome`, one of
  core/backend.py's CHECK_FAILED, APPLIED, SET_FAILED).

Only the few messages that matter are looked at: ReadyForQuery, ParameterStatus (the
server's and the client's session parameters), ErrorResponse (counted; a COPY in progress
fails), CommandComplete of DISCARD ALL / DEALLOCATE ALL (the server's statements are gone),
and CopyInResponse, CopyOutResponse, CopyBothResponse (the client's ledger must see them).
Every other message streams through untouched, read by its 5-byte header alone, unless the
prepared-statement queue (pooling/prepared/) needs each reply matched to its request
(`tracking`): then replies are read one at a time, and some are swallowed, replaced or
preceded by replies the pooler makes itself. While the pooler's own queries are in flight
(`hiding`: `hide` and `hide_parameters` send them to core/backend.py), every reply is
theirs and none reaches the client.

Never touches a socket and never decides a release: it says what came, the caller acts.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from ..pooling import prepared
from ..pooling.params import ClientParams, covers, params_key
from ..pooling.prepared import Op, Tracking
from ..protocol import messages as m
from ..protocol.errors import ServerProtocolError
from ..protocol.framing import be32
from .backend import APPLIED, FAILED, BackendLedger

if TYPE_CHECKING:
    from ..pooling.pool import PoolStats
    from .ledger import FrontendLedger

log = logging.getLogger("pypool.server")

# What feed() returns.
DONE: Final = 0
READY: Final = 1
HIDDEN: Final = 2

_COPY_RESPONSES: Final = (m.COPY_IN_RESPONSE, m.COPY_OUT_RESPONSE, m.COPY_BOTH_RESPONSE)
_LOOKED_AT: Final = (m.READY_FOR_QUERY, m.PARAMETER_STATUS, m.ERROR_RESPONSE,
                     m.COMMAND_COMPLETE) + _COPY_RESPONSES
# 1 for a reply passed through without a look, 0 for one looked at, by type byte: bytes,
# as frontend.py's `_table`.
_STREAMED: Final = bytes(kind not in _LOOKED_AT for kind in range(256))
_READY_FOR_QUERY: Final = m.READY_FOR_QUERY
_PARAMETER_STATUS: Final = m.PARAMETER_STATUS
_ERROR_RESPONSE: Final = m.ERROR_RESPONSE
_COMMAND_COMPLETE: Final = m.COMMAND_COMPLETE
_DATA_ROW: Final = m.DATA_ROW
_COPY_DATA: Final = m.COPY_DATA
_TX_IDLE: Final = m.TX_IDLE
# Reported settings no SET can give a client back: they follow it, if at all, through the
# statements that made them (pooling/session_state.py: SET SESSION AUTHORIZATION).
_NOT_SETTABLE: Final = frozenset({"is_superuser", "session_authorization", "server_version",
                                  "server_encoding", "integer_datetimes", "in_hot_standby"})


class ReplyReader:
    """One server's replies, framed. `frontend` and `client_params` are the linked client's
    ledger and session parameters (None while no client is linked)."""

    def __init__(self, statements: prepared.ServerStatements, stats: PoolStats) -> None:
        self.statements = statements
        self.requests = statements.requests  # its request queue, read per reply
        self.stats = stats
        self.backend = BackendLedger()
        # How many of the pooler's own queries are in flight: the length of the backend
        # ledger's list of them, read on every read, counted here so that a read touches
        # neither that list nor the ledger (`hide`, `hide_parameters`, and their ReadyForQuery
        # in `_hidden_message` move both).
        self.hiding = 0
        self.params: dict[str, str] = {}  # the server's session parameters, as it reported
        self.params_version = 0  # moved on by every ParameterStatus after the login
        # The key of the last client parameters `covers` found these cover
        # (params_key: the same for the same values), and params_version then.
        self._covered: frozenset[tuple[str, str]] | None = None
        self._covered_at = 0
        self.frontend: FrontendLedger | None = None
        self.client_params: dict[str, str] | None = None
        self.statement_mode = False  # pool_mode = statement: a transaction block is refused
        # What the reads so far leave for the client, until the connection takes it
        # (`take_out`): the first piece, and a list only if more follow. A read that ends
        # a transaction on the hot path leaves one piece, and no list is touched.
        self._first = b""
        self._rest: list[bytes] | None = None
        self.status = _TX_IDLE  # of the ReadyForQuery behind the last READY
        self.outcome = 0  # of the hidden reply behind the last HIDDEN
        self._skip = 0  # bytes of a message body still to pass through unparsed
        self._partial = b""  # an incomplete message, or what is left after READY/HIDDEN
        self.name = ""  # the connection's, for log lines

    def at_message_boundary(self) -> bool:
        """Whether the next byte from the server starts a message (nothing half-relayed)."""
        return not self._skip and not self._partial

    def covers(self, wanted: ClientParams) -> bool:
        """Whether the server's parameters already have every value a client `wanted`
        (pooling/params.covers), asked at every link. The key of the last values found
        covered is kept (params_key: one object for the same values, forgotten when
        they change) with params_version then: a client that wants the very same values,
        as every client of an application does, is answered by comparing two references,
        not two dicts. A ParameterStatus since then moves the version on, so the next link
        compares afresh."""
        key = params_key(wanted)
        if key is self._covered and self._covered_at == self.params_version:
            return True
        if not covers(self.params, wanted):
            return False
        self._covered = key
        self._covered_at = self.params_version
        return True

    def _emit(self, piece: bytes) -> None:
        """`piece` goes to the client after what the reads left before it."""
        if not self._first:
            self._first = piece
        elif self._rest is None:
            self._rest = [piece]
        else:
            self._rest.append(piece)

    def take_out(self) -> bytes:
        """The bytes for the client the reads left, in order (b"" if none); they are the
        caller's now."""
        first, self._first = self._first, b""
        rest = self._rest
        if rest is None:
            return first
        self._rest = None
        return b"".join((first, *rest))

    def more(self) -> bool:
        """Whether a feed(b"") after READY or HIDDEN has anything left to do."""
        rq = self.requests
        return bool(self._partial or rq.to_client or rq.tracking == Tracking.SYNTHETIC)

    def feed(self, data: bytes) -> int:
        rq = self.requests
        if rq.to_client or self._partial:
            data = self._resume(data)
        n = len(data)
        pos = self._skip
        hidden = self.hiding
        if pos >= n and not hidden:
            return self._inside_message(data, n, pos)
        self._skip = 0
        frontend = self.frontend
        sent = 0  # start of the bytes not yet emitted
        while n - pos >= 5:
            kind = data[pos]
            end = pos + 1 + be32(data, pos + 1)
            if end - pos < 5 or (kind == _READY_FOR_QUERY and end - pos != 6):
                raise ServerProtocolError(_bad_message(kind, end - pos - 1))
            if _STREAMED[kind] and not rq.tracking and not hidden:
                # BindComplete, RowDescription, DataRow, ...: nothing to act on.
                if end > n:
                    self._skip = end - n
                    pos = n
                    break
                pos = end
                continue
            if rq.tracking and not hidden:
                # The slow path: this reply is matched to the request at the queue's head.
                if rq.tracking == Tracking.SYNTHETIC:  # a reply the pooler makes goes first
                    if sent < pos:
                        self._emit(data[sent:pos])
                    self._emit(rq.emit_synthetic())
                    sent = pos
                    continue
                if end > n:
                    if (kind == _DATA_ROW or kind == _COPY_DATA) and not rq.queue[0].swallow:
                        self._skip = end - n  # stream long rows; they complete nothing
                        pos = n
                    break
                sent = self._tracked_reply(kind, data, pos, end, sent)
                if sent < 0:
                    return self._stop(READY, data, end, data[pos + 5])
                pos = end
                continue
            if kind == _READY_FOR_QUERY or kind == _PARAMETER_STATUS or hidden:
                if end > n:
                    break
                if hidden:
                    if self._hidden_reply(kind, data, pos, end, sent):
                        return self._stop(HIDDEN, data, end, _TX_IDLE)
                    sent = end
                    hidden = self.hiding  # one fewer after its ReadyForQuery
                elif kind == _READY_FOR_QUERY:
                    return self._ready_for_query(data, pos, end, sent)
                else:
                    self._parameter_status(data[pos + 5 : end])
            elif kind == _ERROR_RESPONSE:
                if rq.queue and rq.queue[0].op == Op.RENAME:
                    # A folded segment of the client's statements: name them in the error.
                    if end > n:
                        break
                    sent = self._renamed_error(data, pos, end, sent)
                self._server_error()
                if end > n:
                    self._skip = end - n
                    pos = n
                    break
            elif kind == _COMMAND_COMPLETE:
                if end > n:
                    break  # small: wait for all of it
                if end > pos + 5 and data[pos + 5] == 68:  # "D": DISCARD ALL, DEALLOCATE ALL
                    self.statements.command_tag(data[pos + 5 : end])
            elif kind in _COPY_RESPONSES:
                if frontend is not None:
                    frontend.copy_started(kind, rq)
                if end > n:
                    self._skip = end - n
                    pos = n
                    break
            elif end > n:
                self._skip = end - n
                pos = n
                break
            pos = end
        return self._read_ends(data, n, pos, sent)

    def _inside_message(self, data: bytes, n: int, skip: int) -> int:
        """All of `data` belongs to the message being streamed (`skip` bytes of it were
        still to come): it goes to the client as it is."""
        self._skip = skip - n
        if n:
            self._emit(data)
        if self.requests.tracking == Tracking.SYNTHETIC and not self._skip:
            self._synthetic()
        return DONE

    def _read_ends(self, data: bytes, n: int, pos: int, sent: int) -> int:
        """The end of a read: a message cut short is kept for the next (from `pos`), the
        bytes since `sent` go to the client, and a reply the pooler makes may follow."""
        if pos < n:
            self._partial = data[pos:]
        if sent < pos:
            self._emit(data[sent:pos] if sent or pos < n else data)
        if (self.requests.tracking == Tracking.SYNTHETIC and not self._skip
                and not self._partial):
            self._synthetic()
        return DONE

    def _resume(self, data: bytes) -> bytes:
        """The start of a read: what the request queue made for whoever is linked now
        (after a READY: the next in line) goes first, and a message cut by the last read is
        put back in front of `data`."""
        rq = self.requests
        if rq.to_client:
            self._emit(b"".join(rq.to_client))
            rq.to_client = None
        if self._partial:
            data = self._partial + data if data else self._partial
            self._partial = b""
        return data

    def hide(self, purpose: int) -> None:
        """A query of the pooler's own was sent (core/backend.py: its `purpose`)."""
        self.backend.query(purpose)
        self.hiding += 1

    def hide_parameters(self, names: list[str]) -> None:
        """A HIDDEN_SET of the client's parameters `names` was sent."""
        self.backend.parameters(names)
        self.hiding += 1

    def _hidden_reply(self, kind: int, data: bytes, pos: int, end: int, sent: int) -> bool:
        """A reply to the pooler's own query (core/backend.py): swallowed, the client's
        bytes before it go out. True when it settles that query (`outcome` says how)."""
        if sent < pos:
            self._emit(data[sent:pos])
        outcome = self._hidden_message(kind, data[pos + 5 : end])
        if outcome:
            self.outcome = outcome
            return True
        return False

    def _renamed_error(self, data: bytes, pos: int, end: int, sent: int) -> int:
        """An ErrorResponse to a folded segment of the client's statements: named after
        them (pooling/prepared/). Returns where the bytes not yet emitted start."""
        renamed = self.requests.renamed_error(data[pos + 5 : end])
        if renamed is None:
            return sent
        if sent < pos:
            self._emit(data[sent:pos])
        self._emit(renamed)
        return end

    def _tracked_reply(self, kind: int, data: bytes, pos: int, end: int, sent: int) -> int:
        """The slow path's step: one whole reply, matched to the request at the queue's
        head (pooling/prepared/). Returns where the bytes not yet emitted start, or -1 when
        the reply is the ReadyForQuery that ends the client's request (the caller stops)."""
        rq = self.requests
        if kind == _COMMAND_COMPLETE or kind == _ERROR_RESPONSE or kind == _READY_FOR_QUERY:
            body = data[pos + 5 : end]
            if kind == _ERROR_RESPONSE:
                self._server_error()
        elif kind == _PARAMETER_STATUS:
            body = data[pos + 5 : end]
            self._parameter_status(body)
        else:
            frontend = self.frontend
            if kind in _COPY_RESPONSES and frontend is not None:
                frontend.copy_started(kind, rq)
            body = b""
        verdict = rq.reply(kind, body)
        if rq.skipped:  # an error made PostgreSQL skip Queries: the ledger strikes them too
            if self.frontend is not None:
                self.frontend.skipped(rq)
            else:
                rq.skipped = 0
        if not verdict and not rq.to_client:
            return sent
        if verdict == prepared.READY:
            if data[pos + 5] != _TX_IDLE and self.statement_mode:
                stop = pos  # withheld, as on the hot path (_ready_for_query)
            else:
                stop = end
        else:
            stop = pos if verdict else end
        if sent < stop:
            self._emit(data[sent:stop])
        if verdict == prepared.REPLACE:
            self._emit(rq.replacement)
        if verdict == prepared.READY:
            return -1
        if rq.to_client:
            self._emit(b"".join(rq.to_client))
            rq.to_client = None
        return end

    def _ready_for_query(self, data: bytes, pos: int, end: int, sent: int) -> int:
        """The hot path's ReadyForQuery: the reply up to it goes out, and the read stops."""
        rq = self.requests
        n = len(data)
        status = data[pos + 5]
        if rq.queue:
            rq.pop_ready(status)
        if status != _TX_IDLE and self.statement_mode:
            # As PgBouncer: the ReadyForQuery is withheld, so the statement that opened the
            # transaction fails (the client sends the FATAL).
            if sent < pos:
                self._emit(data[sent:pos])
        else:
            self._emit(data[sent:end] if sent or end < n else data)
        if end < n:
            self._partial = data[end:]
        self.status = status
        return READY

    def _stop(self, event: int, data: bytes, end: int, status: int) -> int:
        """Stop before `end`: the rest is read by the next feed."""
        if end < len(data):
            self._partial = data[end:]
        self.status = status
        return event

    def _synthetic(self) -> None:
        synthetic = self.requests.emit_synthetic()
        if synthetic:
            self._emit(synthetic)

    def _server_error(self) -> None:
        errs = self.stats.errors
        errs["server"] = errs.get("server", 0) + 1
        if self.frontend is not None:
            self.frontend.errors += 1
            self.frontend.copy_failed()

    def _parameter_status(self, body: bytes) -> None:
        name, value = m.parse_parameter_status(body)
        self.params[name] = value
        self.params_version += 1
        if self.client_params is not None and name not in _NOT_SETTABLE:
            self.client_params[name] = value

    def _hidden_message(self, kind: int, body: bytes) -> int:
        """A reply to the oldest of the pooler's own queries: never the client's."""
        backend = self.backend
        if kind == _READY_FOR_QUERY:
            self.hiding -= 1
            outcome = backend.ready()
            return 0 if outcome == FAILED else outcome
        if kind == _PARAMETER_STATUS:
            self._parameter_status(body)
        elif kind == _ERROR_RESPONSE:
            fields = m.parse_error_fields(body)
            backend.failed(fields)
            log.warning("%s: pooler-issued query failed: %s %s", self.name, fields.get("C"),
                        fields.get("M"))
        return 0

    def reset(self) -> None:
        """The server is gone: nothing more will be read."""
        self._skip = 0
        self._partial = b""
        self._first, self._rest = b"", None
        self.hiding = 0
        self.backend.reset()


def _bad_message(kind: int, length: int) -> str:
    """What a server message whose header says `length` bytes (the type byte not counted)
    is, when no message of type `kind` can be that long: a server gone wrong or not
    PostgreSQL, whose next bytes cannot be framed."""
    if length < 4:
        return f"bad pkt header: length {length}"
    return f"bad ReadyForQuery: length {length}"


__all__ = ["APPLIED", "DONE", "HIDDEN", "READY", "ReplyReader"]
