"""The request reader: a client's byte stream after login, framed, counted and rewritten.

Theory of operation. `RequestReader.feed(data, statements, linked)` takes what the client
sent and returns the bytes to send on to its server (or to keep until one is assigned):

- Framing. Only the 5-byte headers are read. A message that arrives in pieces waits in
  `partial` until it is whole when its body matters (or while there is no server), and
  costs linear time however many reads it takes: the pieces are gathered in one bytearray
  and looked at once, when `need` bytes are there. Otherwise its body streams through
  (`skip`). A message the ledger says to drop is dropped, in pieces too (`drop`).
- Counting. Every message is told to the client's FrontendLedger (core/ledger.py), which
  knows what the client is owed and so when its server may go back to the pool.
- Session state. When `watch` is on (transaction mode, session_state follow or reject),
  each simple Query and Parse is read whole and its text's first byte(s) looked at
  (pooling/session_state/), except a Parse identical to the last one that changed
  nothing; the few that pass are classified. What they change is left in
  `changes` for the caller; with `reject` the statement is replaced by one that fails in its
  place (`refused` names it).
- A large Query. A simple Query larger than STREAM_AT is not read whole for either
  feature: once its first STREAM_HEAD bytes are in (`need` stops there), it is classified
  on that start and the rest streams through as unread bodies do, with the client's
  back-pressure (`_streams`; pooling/session_state/streamed.py says what pins when the
  start cannot settle it, and `scan` looks through the rest as it passes). Read whole as
  before: with `reject`, on the admin console, and a Query the rewriting must read whole
  (a SQL-level EXECUTE, DEALLOCATE or DISCARD, or a first word beyond the start).
- Rewriting. When prepared statements are rewritten (`rewriting`, pooling/prepared/), the
  messages that name a statement are read whole and rewritten by the linked server's
  ServerStatements. With no server yet, whole messages are kept and rewritten at the link
  (`rewrite_whole`). When the rewriting must wait for a reply (WAIT), the reader is
  `blocked`: what the client sends meanwhile waits, uncounted, in `partial`, and what was
  counted but not yet rewritten in `held`.

What the caller must act on is left in plain attributes after each feed: `began` (the
client went from owed nothing to owed something: its query has started), `terminated`
(a Terminate came; what came before it is returned), `error` (the client broke the protocol:
what came before the bad message is returned, the caller sends it and then fails the
client), `segment_end` (the bytes returned are exactly one driver segment, its Bind ending
there: take_outbox need not look at them again), `noticed` (statements that change
session state were seen: `changes` or `refused` has some for the pooler).

Never touches a socket and never decides a release.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ..pooling import prepared
from ..pooling import session_state as ss
from ..pooling.prepared.sql import SQL_FIRST
from ..protocol import errors
from ..protocol import messages as m
from ..protocol.errors import PoolerError
from ..protocol.framing import be32
from . import ledger as lg
from .ledger import FrontendLedger

if TYPE_CHECKING:
    from ..pooling.prepared import ServerStatements


def _table(*kinds: int) -> bytes:
    """1 for `kinds`, 0 for the other message type bytes: bytes, the cheapest lookup the
    hot path can make (indexed, an int; a tuple's bools come boxed)."""
    return bytes(kind in kinds for kind in range(256))


# What each frontend message type means for the ledger (core/ledger.py).
_ACTION: Final = lg.ACTION
_OWES_READY: Final = lg.OWES_READY
_OPENS_SEGMENT: Final = lg.OPENS_SEGMENT
_FLUSH: Final = lg.FLUSH
_TERMINATE: Final = lg.TERMINATE
_COPY_MESSAGE: Final = lg.COPY_MESSAGE
_QUERY: Final = m.QUERY
_PARSE: Final = m.PARSE
_SYNC: Final = m.SYNC
# A simple Query larger than STREAM_AT (header included), which a feature would read whole,
# is streamed once its first STREAM_HEAD bytes are in (`_streams`): its start is enough to
# classify. Up to STREAM_AT it is read whole, as much as a client may have waiting for a
# server (net/outbox.py), and classified exactly: a pin for a statement the start cannot
# settle is kept for Queries no one would hold whole.
STREAM_AT: Final = 1 << 20
STREAM_HEAD: Final = 16 * 1024
_SQL_VERBS: Final = frozenset({b"prepare", b"execute", b"deallocate", b"discard"})
# What `_watched` says of a Query or Parse that changes nothing: one list, never written to.
_NONE_FOUND: Final[list[ss.Command]] = []
# Prepared statements: what the rewriting reads whole, and the requests it queues.
_WHOLE: Final = _table(m.PARSE, m.BIND, m.DESCRIBE, m.CLOSE, m.QUERY)
_REQUESTS: Final = _table(m.PARSE, m.BIND, m.DESCRIBE, m.CLOSE, m.EXECUTE, m.SYNC, m.QUERY,
                          m.FUNCTION_CALL)


class RequestReader:
    """One client's requests after login."""

    def __init__(self, max_packet: int) -> None:
        self.ledger = FrontendLedger()
        self.max_packet = max_packet
        self.rewriting = False  # prepared statements are rewritten for this client
        self.admin = False  # the admin console: simple Queries only
        self.blocked = False  # a rewriting WAIT: see the module docstring
        self.held = b""
        # An incomplete message (or, while blocked, all input); None while there is none, so
        # that a read, which asks, fetches nothing more (`keep` adds to it).
        self.partial: bytearray | None = None
        self.need = 0  # size `partial` must reach before it holds a whole message
        self.skip = 0  # bytes of a message body still to pass through unread
        self.drop = 0  # bytes still to drop of a message the ledger said to drop
        self.began = False
        self.terminated = False
        self.error: PoolerError | None = None
        self.segment_end = 0
        # Session state (module docstring): statements looked at, refused, what they change.
        self.watch = False
        self.reject = ""  # the pool_mode named in a refusal; "" when nothing is refused
        self.changes: list[ss.Command] = []
        self.refused: list[ss.Command] = []
        # Set when either list gains one, cleared by the caller that takes them: the caller
        # asks this plain attribute after each feed, not the two lists.
        self.noticed = False
        # The last Parse looked at that changes nothing: the same one again, as drivers send
        # the unnamed statement of a repeated query, is not looked at again.
        self.last_plain_parse = b""
        # A streamed Query's rest, looked through as it passes (`_streams`, `_scan_rest`).
        self.scan: ss.QueryScan | None = None

    def idle(self) -> bool:
        """Nothing half-read and nothing waiting: the next byte starts a message."""
        return not self.blocked and not self.partial and not self.skip

    def done_with_server(self) -> bool:
        """The client is owed no reply and has no message half-sent to its server (whose
        backend would read the next client's bytes as that message's rest): the one test
        of whether its server may serve someone else, given a ReadyForQuery 'I'."""
        return self.ledger.idle() and not self.skip

    def keep(self, data: bytes) -> None:
        """`data` waits in `partial`, after what is there already."""
        if self.partial is None:
            self.partial = bytearray(data)
        else:
            self.partial += data

    def take_partial(self) -> bytes:
        """What waited in `partial` (during a login step, a WAIT or a SET), to feed again."""
        rest = bytes(self.partial) if self.partial is not None else b""
        self.partial = None
        self.need = 0
        return rest

    def feed(self, data: bytes, st: ServerStatements | None, linked: bool) -> bytes:
        """Frame, count and rewrite `data` for the linked server's statements `st` (None
        with no server, or when nothing is rewritten); `linked`: a server is linked."""
        data, pos = self._resume(data)
        if pos < 0:
            return data
        ledger = self.ledger
        if pos == 0 and self.rewriting and not ledger.unsynced:
            fast = self._driver_segment(data, st)
            if fast is not None:
                return fast
        n = len(data)
        was_idle = ledger.idle()
        admin, max_packet = self.admin, self.max_packet
        rewriting, watch = self.rewriting, self.watch
        # Messages to rewrite are read whole (so are all messages while there is no server);
        # `parts` collects the rewritten bytes up to `start`, `done` what is ready before
        # a dropped message: made when first needed (nearly every read needs neither).
        parts: list[bytes] | None = None
        done: list[bytes] | None = None
        start = 0
        while n - pos >= 5:
            kind = data[pos]
            size = be32(data, pos + 1) + 1
            action = _ACTION[kind]
            if size < 5 or size > max_packet or action == 0:
                self.error = _bad_header(kind, size, max_packet)
                return self._ending(done, data, pos, parts, start)
            found: list[ss.Command] | None = None
            if watch and (kind == _QUERY or kind == _PARSE):
                found = self._watched(kind, data, pos, n, size, st)
                if found is None:
                    break  # read whole: its text may change session state
                if found and self.reject and pos + size <= n:
                    new = self._refusal(found, kind, data, pos, pos + size)
                    if new:  # failed in its place by PostgreSQL: the statement never runs
                        data = data[:pos] + new + data[pos + size :]
                        n, size, found = len(data), len(new), None
            if rewriting:
                end = pos + size
                if end > n and (st is None or _WHOLE[kind] or st.requests.discarding) and (
                        kind != _QUERY or not self._streams(data, pos, n, size, st)):
                    break
                # The queue takes the requests the ledger says PostgreSQL answers.
                if st is not None and _REQUESTS[kind] and ledger.answers(kind):
                    try:
                        out = st.from_client(kind, data, pos, end)
                    except (ValueError, IndexError):
                        self.error = _malformed(kind)
                        return self._ending(done, data, pos, parts, start)
                    if out is not None:
                        if out is prepared.WAIT:
                            self.blocked = True  # the caller resumes with what follows
                            break
                        if parts is None:
                            parts = []
                        if start < pos:
                            parts.append(data[start:pos])
                        parts.append(out)  # type: ignore[arg-type]
                        start = end
            if found:
                self.changes.extend(found)
                self.noticed = True
            if action == _OPENS_SEGMENT:
                ledger.segment()
            elif action == _OWES_READY:
                ledger.request(kind)
            elif (action == _FLUSH or action == _COPY_MESSAGE) and self._dropped(
                    action, kind, size, linked):
                if done is None:
                    done = []
                if pos:
                    done.append(_rewritten(data, pos, parts, start))
                end = pos + size
                if end > n:
                    self.drop = end - n
                    return b"".join(done)
                data = data[end:]
                n, pos, parts, start = len(data), 0, None, 0
                continue
            elif action == _TERMINATE:
                self.terminated = True
                return self._ending(done, data, pos, parts, start)
            if admin and kind != _QUERY:
                self.error = PoolerError("extended query protocol not supported by admin console")
                return b""
            pos += size
        if st is not None and st.requests.skipped:
            ledger.skipped(st.requests)  # Queries dropped in the skip after an error
        return self._finish(data, pos, parts, start, done, was_idle)

    def _watched(self, kind: int, data: bytes, pos: int, n: int, size: int,
                 st: ServerStatements | None) -> list[ss.Command] | None:
        """The session-state look at a Query or Parse at `pos` (`watch`): the commands it
        holds (`_NONE_FOUND`: none), or None when it must be read whole first. A Query that
        streams (`_streams`) is judged by its start."""
        end = pos + size
        if end <= n:
            return self._look(kind, data, pos, end) or _NONE_FOUND
        if kind == _PARSE or not self._streams(data, pos, n, size, st):
            return None
        return self._look_start(data, pos, n) or _NONE_FOUND

    def _resume(self, data: bytes) -> tuple[bytes, int]:
        """A read where the last one left off: the bytes to walk and where the next header
        is in them, or (what to return at once, -1) when the read ends there."""
        self.began = False
        self.segment_end = 0
        if self.blocked:
            self.keep(data)
            return b"", -1
        partial = self.partial
        if partial is not None:
            # An incomplete message waits for its end: gather the pieces, and walk them
            # only once it is whole (a 64 MiB Bind arrives in thousands of reads).
            partial += data
            if len(partial) < self.need:
                return b"", -1
            data = bytes(partial)
            self.partial = None
            self.need = 0
        if self.drop:
            if len(data) <= self.drop:
                self.drop -= len(data)
                return b"", -1
            data = data[self.drop :]
            self.drop = 0
        n = len(data)
        pos = self.skip
        if pos and self.scan is not None:
            self._scan_rest(data, pos)
        if pos >= n:
            self.skip = pos - n
            return data, -1
        self.skip = 0
        return data, pos

    def _driver_segment(self, data: bytes, st: ServerStatements | None) -> bytes | None:
        """The steady state of libpq-style drivers: one whole Bind, Describe, Execute, Sync
        of a prepared statement, done in one step (ServerStatements.bind_segment). None
        when `data` is not one."""
        bind_end = prepared.driver_segment(data)
        if 13 <= bind_end <= self.max_packet:
            fast = data if st is None else st.bind_segment(data, bind_end)
            if fast is not None:
                ledger = self.ledger
                self.began = not ledger.pending
                ledger.request(_SYNC)
                if st is None:
                    self.segment_end = bind_end
                return fast
        return None

    def _look(self, kind: int, data: bytes, pos: int, end: int) -> list[ss.Command] | None:
        """What the whole Query or Parse at data[pos:end] changes of the session state."""
        if kind == _PARSE and self.last_plain_parse and (
                data[pos:end] == self.last_plain_parse):
            return None  # the same Parse again (an ORM's, pgbench -M extended's)
        found = ss.look(kind, data, pos, end)
        if kind == _PARSE and not found:
            self.last_plain_parse = data[pos:end]
        return found

    def _streams(self, data: bytes, pos: int, n: int, size: int,
                 st: ServerStatements | None) -> bool:
        """Whether the simple Query at data[pos:], of `size` bytes, not all in hand, streams
        on to the server (the rest passes through as it comes, unread) rather than being
        read whole: one larger than STREAM_AT, once its first STREAM_HEAD bytes are in,
        unless session_state = reject (its refusal replaces the whole message) or, with
        prepared statements rewritten, its start is a SQL-level command the rewriting must
        read whole (`_sql_streams`)."""
        if size <= STREAM_AT or n - pos < STREAM_HEAD or self.reject or self.admin:
            return False
        if self.rewriting and ((st is not None and st.requests.discarding) or (
                SQL_FIRST[data[pos + 5]] and not self._sql_streams(data[pos + 5 : n]))):
            return False
        return True

    def _sql_streams(self, start: bytes) -> bool:
        """Whether a Query whose text begins with `start`, and could begin with PREPARE,
        EXECUTE, DEALLOCATE or DISCARD (pooling/prepared/sql.py), streams: when its first
        word is another one, or it is a PREPARE and session_state pins its client (the
        pooler cannot record its text to prepare it again elsewhere: `_look_start`).
        EXECUTE, DEALLOCATE, DISCARD and PREPARE TRANSACTION are read whole."""
        word = ss.first_word(start)
        if not word:
            return False
        command = prepared.parse_sql_command(start)
        if command is None:
            return word not in _SQL_VERBS
        return command.verb == b"prepare" and word == b"prepare" and self.watch

    def _look_start(self, data: bytes, pos: int, n: int) -> list[ss.Command]:
        """What the streamed Query at data[pos:], of which data[:n] is in hand, changes
        (pooling/session_state/streamed.py); the rest is looked through as it passes
        (`scan`, `_scan_rest`). A streamed PREPARE pins its client: the rewriting does not
        record it (pooling/prepared/sql.py `streamed`)."""
        found, words = ss.look_start(data, pos + 5, n)
        if self.rewriting and ss.first_word(data[pos + 5 : n]) == b"prepare":
            found.append(ss.Command(ss.UNTRACKABLE, b"prepare"))
        if words:
            self.scan = ss.QueryScan(words, data[max(pos + 5, n - 16) : n])
        return found

    def _scan_rest(self, data: bytes, skip: int) -> None:
        """The next piece of a streamed Query (its first `skip` bytes, or all of `data`):
        a word `scan` looks for pins the client, as the whole text would have."""
        scan = self.scan
        assert scan is not None
        last = skip <= len(data)
        if scan.feed(data[:skip] if last else data):
            self.changes.append(ss.Command(ss.UNTRACKABLE, ss.LONG_STATEMENT))
            self.noticed = True
            last = True
        if last:
            self.scan = None

    def _refusal(self, found: list[ss.Command], kind: int, data: bytes, pos: int,
                 end: int) -> bytes:
        """session_state = reject: the message that fails in place of the Query or Parse at
        data[pos:end] when one of its changes makes state (`refused` names it); b"" when
        they only clear some."""
        refused = next((c for c in found if c.kind in ss.CREATES), None)
        if refused is None:
            return b""
        new = ss.refused_message(kind, data, pos, end, ss.refusal(refused, self.reject))
        self.refused.append(refused)
        self.noticed = True
        return new

    def _dropped(self, action: int, kind: int, size: int, linked: bool) -> bool:
        """Whether a Flush or a COPY message is dropped instead of passed on.

        Flush asks for pending output and owes no reply of its own: it must not pin a
        server (psycopg's pipeline sends one after its Sync). With nothing owed and no
        server, it is dropped rather than take a server for nothing. CopyData, CopyDone and
        CopyFail when nothing is owed belong to a COPY that already failed: PostgreSQL would
        ignore them, and no reply will come."""
        if action == _FLUSH:
            return not linked and self.ledger.idle() and size == 5
        return not self.ledger.copy_message(kind)

    def _finish(self, data: bytes, pos: int, parts: list[bytes] | None, start: int,
                done: list[bytes] | None, was_idle: bool) -> bytes:
        """The end of a read walked up to `pos`: what comes after it waits (a message's
        start) or is skipped (the rest of one passed on), and the bytes for the server."""
        n = len(data)
        if pos > n:
            self.skip = pos - n
        elif pos < n:
            self.partial = bytearray(memoryview(data)[pos:])
            # The whole message's size once its header is here (else its header's); a
            # large Query's start first, which may be enough (`_streams`).
            need = be32(data, pos + 1) + 1 if n - pos >= 5 else 5
            if need > STREAM_AT and data[pos] == _QUERY and n - pos < STREAM_HEAD:
                need = STREAM_HEAD
            self.need = need
            data = data[:pos]
        self.began = was_idle and not self.ledger.idle()
        if parts:
            if start < len(data):
                parts.append(data[start:])
            data = b"".join(parts)
        if done:
            done.append(data)
            return b"".join(done)
        return data

    def _ending(self, done: list[bytes] | None, data: bytes, pos: int,
                parts: list[bytes] | None, start: int) -> bytes:
        """What goes before a message that ends the read (Terminate, an error)."""
        before = b"".join(done) if done else b""
        return before + _rewritten(data, pos, parts, start) if pos else before

    def rewrite_whole(self, st: ServerStatements, data: bytes, bind_end: int = 0) -> bytes:
        """Rewrite whole, already counted messages (the outbox at a link, `held` after a
        WAIT); on WAIT keep the rest in `held`. `bind_end`: data is a driver segment with
        its Bind ending there, if known. A malformed message ends it, with `error` set."""
        bind_end = bind_end or (prepared.driver_segment(data) if data else 0)
        if bind_end:
            fast = st.bind_segment(data, bind_end)
            if fast is not None:
                return fast
        elif data and st.plain_segment(data):
            return data
        parts: list[bytes] | None = None
        start = pos = 0
        n = len(data)
        while pos < n:
            kind = data[pos]
            end = pos + 1 + be32(data, pos + 1)
            if _REQUESTS[kind]:
                try:
                    out = st.from_client(kind, data, pos, end)
                except (ValueError, IndexError):
                    self.error = _malformed(kind)
                    n = pos
                    break
                if out is not None:
                    if out is prepared.WAIT:
                        self.blocked = True
                        self.held = data[pos:]
                        n = pos
                        break
                    if parts is None:
                        parts = []
                    parts.append(data[start:pos])
                    parts.append(out)  # type: ignore[arg-type]
                    start = end
            pos = end
        if st.requests.skipped:
            self.ledger.skipped(st.requests)  # Queries dropped in the skip after an error
        if parts is None:
            # (a slice copies even when it is the whole: compiled code does not share)
            return data if n == len(data) else data[:n]
        parts.append(data[start:n])
        return b"".join(parts)


def _rewritten(data: bytes, pos: int, parts: list[bytes] | None, start: int) -> bytes:
    """The bytes for the server up to `pos`: the rewritten ones, then the rest as is."""
    if not parts:
        return data[:pos]
    return b"".join(parts) + data[start:pos]



def _bad_header(kind: int, size: int, max_packet: int) -> PoolerError:
    """The error for a message header the reader refuses: a length out of bounds, or a type
    refused at its header, as PostgreSQL does, never waited for (a StartupMessage sent again
    reads as type 0 with a length of thousands)."""
    if size < 5 or size > max_packet:
        return errors.ClientProtocolError(f"invalid packet length {size - 1}")
    return errors.ClientProtocolError(f"unsupported pkt type: {kind}")


def _malformed(kind: int) -> PoolerError:
    """The error for a message the rewriting could not read."""
    return errors.ClientProtocolError(f"malformed message of type {chr(kind)!r}")
