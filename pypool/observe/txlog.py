"""The transaction log: one JSON object per line for every transaction and every failed wait.

A *transaction* here is what the pool sees: one server assignment, from the first byte of the
client's request (arrival) through the link to a server (assigned) to the ReadyForQuery
that gave the server back (released). A client that pipelines two transactions without
waiting for the first's replies holds one server for both: that is one line.

Theory of operation. Four calls from the pooler feed it, all cheap, none blocking:
- `client_data(client, n)` for each read from a client (bytes in; the first read after a
  release opens the client's next transaction, and the last read before it asks for a
  server is its arrival: the time and the queue length then);
- `ServerTap.feed(data)` for each read from a server: it walks the message headers on its
  own (the relay is untouched) and counts, for the client linked then, ReadyForQuery
  (statements), the first ErrorResponse's SQLSTATE, the last COMMIT/ROLLBACK tag, and bytes;
- `released(client, server, now)` when the server goes back: the line is complete;
- `client_closed(...)` / `refused(...)`: the client left mid-transaction or while waiting,
  was timed out (query_wait_timeout) or refused.

A finished line is a tuple appended to a bounded deque; a writer thread formats it as JSON
and writes it, so the event loop never formats, encodes or touches the file. When the deque
is full the line is dropped and counted (`dropped`, shown in SHOW STATE and the metrics);
a client is never held up. `reopen()` (SIGHUP) makes the writer close and reopen the path
before its next write, for log rotation. With the log off none of this exists: the pooler
holds None and the hot path pays one `is not None` per read and per release.

The fields (docs/research.md): kind ("transaction" or "wait"), arrival/assigned/released
as ISO 8601 UTC and as monotonic microseconds (*_us), wait_us, xact_us, client_id, user,
database, application_name, server_id, backend_pid, statements, bytes_in, bytes_out,
outcome (commit, rollback, error, cancelled, client_gone, query_wait_timeout, refused),
sqlstate, queue_on_arrival, queue_policy, server_policy.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from datetime import UTC, datetime
from typing import Any, Final

log = logging.getLogger("pypool")

QUEUE_LIMIT: Final = 65536  # lines waiting for the writer before new ones are dropped
WRITER_PERIOD: Final = 0.05  # seconds the writer sleeps when it has nothing to write
BODY_KEPT: Final = 256  # of an ErrorResponse or CommandComplete body, enough for C / the tag

_READY: Final = ord("Z")
_ERROR: Final = ord("E")
_COMPLETE: Final = ord("C")
_TX_IDLE: Final = ord("I")
CANCELED: Final = "57014"  # query_canceled
_SERVED: Final = frozenset({"IDLE", "ACTIVE", "WAITING"})  # client states whose reads count

FIELDS: Final = (
    "kind", "arrival", "arrival_us", "assigned", "assigned_us", "released", "released_us",
    "wait_us", "xact_us", "client_id", "user", "database", "application_name", "server_id",
    "backend_pid", "statements", "bytes_in", "bytes_out", "outcome", "sqlstate",
    "queue_on_arrival", "queue_policy", "server_policy",
)


class Tally:
    """What one client's transaction in progress has done so far."""

    __slots__ = ("arrival", "queue_on_arrival", "bytes_in", "bytes_out", "statements",
                 "sqlstate", "tag")

    def __init__(self, arrival: float, queue_on_arrival: int) -> None:
        self.arrival = arrival
        self.queue_on_arrival = queue_on_arrival
        self.bytes_in = 0
        self.bytes_out = 0
        self.statements = 0
        self.sqlstate = ""
        self.tag = ""  # the last COMMIT or ROLLBACK command tag


def outcome_of(tally: Tally) -> str:
    if tally.sqlstate:
        return "cancelled" if tally.sqlstate == CANCELED else "error"
    return "rollback" if tally.tag == "ROLLBACK" else "commit"


def error_sqlstate(body: bytes) -> str:
    """The C field of an ErrorResponse body ('' if it is not in the part kept)."""
    pos = 0
    while pos < len(body) and body[pos]:
        end = body.find(b"\0", pos + 1)
        if end < 0:
            return ""
        if body[pos] == 67:  # "C"
            return body[pos + 1 : end].decode("ascii", "replace")
        pos = end + 1
    return ""


class TxLog:
    """The collector (called on the event loop) and its writer thread."""

    def __init__(self, path: str, now: Any, queue_policy: str = "fifo",
                 server_policy: str = "lifo", limit: int = QUEUE_LIMIT) -> None:
        self.path = path
        self.now = now  # the pooler's clock (monotonic seconds)
        self.queue_policy = queue_policy
        self.server_policy = server_policy
        self.limit = limit
        self.open: dict[int, Tally] = {}  # client id -> its transaction in progress
        self.lines: deque[tuple[Any, ...]] = deque()
        self.written = 0
        self.dropped = 0
        # monotonic + offset = wall clock, for the ISO times (taken once: a wall clock
        # stepped later does not bend the monotonic times the lines are built on)
        self.offset = time.time() - time.monotonic()
        self._reopen = False
        self._stop = threading.Event()
        self._fd = -1  # the file, opened by the writer
        self._opened = False
        self._thread = threading.Thread(target=self._write_lines, name="pypool-txlog",
                                        daemon=True)
        self._thread.start()

    # --- called by the pooler -----------------------------------------------------------

    def client_data(self, client: Any, n: int) -> None:
        tally = self.open.get(client.id)
        if tally is None:
            pool = client.pool
            if pool is None or client.state.name not in _SERVED:
                return  # the console, or a client still logging in
            tally = self.open[client.id] = Tally(self.now(), len(pool.waiting))
        elif client.server is None and client.state.name == "IDLE":
            # Not asked for a server yet: what came before (a lone Flush, the start of a
            # message) does not start the clock; this read may.
            tally.arrival = self.now()
            tally.queue_on_arrival = len(client.pool.waiting)
        tally.bytes_in += n

    def tap(self, server: Any) -> ServerTap:
        return ServerTap(self, server)

    def released(self, client: Any, server: Any, now: float) -> None:
        tally = self.open.pop(client.id, None)
        if tally is None:
            tally = Tally(client.link_time, 0)
        self._line("transaction", client, server, tally, client.link_time, now,
                   outcome_of(tally))

    def client_closed(self, client: Any, reason: str) -> None:
        """A client gone with a transaction in progress or a wait unfinished."""
        tally = self.open.pop(client.id, None)
        if tally is None or client.pool is None:
            return
        server = client.server
        state = client.state.name
        if server is not None and state == "ACTIVE":
            self._line("transaction", client, server, tally, client.link_time, self.now(),
                       "client_gone")
        elif state == "WAITING":
            outcome = "query_wait_timeout" if reason == "query_wait_timeout" else "client_gone"
            self._line("wait", client, None, tally, 0.0, self.now(), outcome)

    def refused(self, client: Any, sqlstate: str) -> None:
        """The client's request was refused before it could wait (e.g. logins failing)."""
        tally = self.open.pop(client.id, None) or Tally(self.now(), 0)
        tally.sqlstate = sqlstate
        self._line("wait", client, None, tally, 0.0, self.now(), "refused")

    def forget(self, client: Any) -> None:
        self.open.pop(client.id, None)

    def reopen(self) -> None:
        """SIGHUP: the writer closes and reopens the file before its next line."""
        self._reopen = True

    def close(self) -> None:
        """Write what is queued and stop the writer."""
        self._stop.set()
        self._thread.join(5)

    def _line(self, kind: str, client: Any, server: Any, tally: Tally, assigned: float,
              end: float, outcome: str) -> None:
        if len(self.lines) >= self.limit:
            self.dropped += 1
            return
        params = client.params
        self.lines.append((
            kind, tally.arrival, assigned, end, client.id, client.user, client.database,
            params.get("application_name", ""),
            server.id if server is not None else None,
            server.backend_pid if server is not None else None,
            tally.statements, tally.bytes_in, tally.bytes_out, outcome, tally.sqlstate,
            tally.queue_on_arrival, self.queue_policy, self.server_policy,
        ))

    # --- the writer thread ----------------------------------------------------------------

    def record(self, line: tuple[Any, ...]) -> dict[str, Any]:
        """A queued line as the JSON object written."""
        (kind, arrival, assigned, end, client_id, user, database, app, server_id, pid,
         statements, bytes_in, bytes_out, outcome, sqlstate, queue_on_arrival, queue_policy,
         server_policy) = line
        arrival_us = int(arrival * 1e6)
        end_us = int(end * 1e6)
        assigned_us = int(assigned * 1e6) if assigned else None
        return {
            "kind": kind,
            "arrival": self.iso(arrival), "arrival_us": arrival_us,
            "assigned": self.iso(assigned) if assigned else None, "assigned_us": assigned_us,
            "released": self.iso(end), "released_us": end_us,
            "wait_us": max(0, (assigned_us if assigned_us is not None else end_us)
                           - arrival_us),
            "xact_us": end_us - assigned_us if assigned_us is not None else None,
            "client_id": client_id, "user": user, "database": database,
            "application_name": app, "server_id": server_id, "backend_pid": pid,
            "statements": statements, "bytes_in": bytes_in, "bytes_out": bytes_out,
            "outcome": outcome, "sqlstate": sqlstate or None,
            "queue_on_arrival": queue_on_arrival,
            "queue_policy": queue_policy, "server_policy": server_policy,
        }

    def iso(self, monotonic: float) -> str:
        return datetime.fromtimestamp(monotonic + self.offset, UTC).isoformat(
            timespec="microseconds")

    def _write_lines(self) -> None:
        while True:
            stopping = self._stop.is_set()
            if self._reopen or not self._opened:
                self._open_file()  # a path that cannot be opened is tried again on SIGHUP
            lines = self.lines
            if lines:
                out = []
                while lines:
                    out.append(json.dumps(self.record(lines.popleft()), separators=(",", ":")))
                self._write(("\n".join(out) + "\n").encode(), len(out))
            elif stopping:
                break
            else:
                self._stop.wait(WRITER_PERIOD)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _write(self, data: bytes, count: int) -> None:
        """One write per batch on an O_APPEND descriptor: with `workers`, several processes
        append to one file without cutting each other's lines."""
        if self._fd < 0:
            self.dropped += count
            return
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            self.written += count
        except OSError as exc:
            log.error("transaction_log %s: write failed: %s", self.path, exc.strerror)
            self.dropped += count

    def _open_file(self) -> None:
        self._reopen = False
        self._opened = True
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        except OSError as exc:
            log.error("transaction_log %s: cannot open: %s", self.path, exc.strerror)


class ServerTap:
    """Walks one server's replies by their headers, for the transaction log only.

    It keeps its own framing state (a message may end in a later read) and keeps the first
    BODY_KEPT bytes of the messages that matter: ReadyForQuery, ErrorResponse,
    CommandComplete. Replies to the pooler's own hidden queries are not counted. Replies go
    to the client linked when the read arrives; behind a
    pipeline (net/pipeline.py) each ReadyForQuery 'I' moves on to the next client in line.
    """

    __slots__ = ("txlog", "server", "_head", "_left", "_kind", "_body")

    def __init__(self, txlog: TxLog, server: Any) -> None:
        self.txlog = txlog
        self.server = server
        self._head = b""
        self._left = 0  # body bytes of the current message still to come
        self._kind = 0  # its type, if it is one that matters, else 0
        self._body = bytearray()

    def feed(self, data: bytes) -> None:
        server = self.server
        line = [server.client, *server.chain]
        turn = 0
        tallies = self.txlog.open
        client = line[0]
        tally = tallies.get(client.id) if client is not None else None
        if tally is not None:
            tally.bytes_out += len(data)
        # Replies to the pooler's own queries (a SET at link, the reset query) come first
        # and are swallowed (net/server.py, hidden_syncs): not the client's statements.
        hidden = server.hidden_syncs
        pos = 0
        n = len(data)
        while pos < n:
            if self._left:
                take = min(self._left, n - pos)
                if self._kind and len(self._body) < BODY_KEPT:
                    self._body += data[pos : pos + min(take, BODY_KEPT - len(self._body))]
                self._left -= take
                pos += take
                if self._left:
                    break
            else:
                need = 5 - len(self._head)
                self._head += data[pos : pos + need]
                pos += need
                if len(self._head) < 5:
                    break
                kind = self._head[0]
                self._left = int.from_bytes(self._head[1:5], "big") - 4
                self._head = b""
                matters = kind == _READY or kind == _ERROR or kind == _COMPLETE
                self._kind = kind if matters else 0
                self._body = bytearray()
                if self._left > 0:
                    continue
            if not self._kind:
                continue
            kind, body = self._kind, bytes(self._body)
            self._kind = 0
            if hidden:
                if kind == _READY:
                    hidden -= 1
                continue
            if tally is None:
                continue
            if kind == _READY:
                tally.statements += 1
                if body[:1] == b"I" and turn + 1 < len(line):
                    turn += 1
                    client = line[turn]
                    tally = tallies.get(client.id) if client is not None else None
            elif kind == _ERROR:
                if not tally.sqlstate:
                    tally.sqlstate = error_sqlstate(body)
            elif body.startswith(b"ROLLBACK"):
                tally.tag = "ROLLBACK"
            elif body.startswith(b"COMMIT"):
                tally.tag = "COMMIT"
