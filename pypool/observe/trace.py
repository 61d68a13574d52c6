"""The protocol trace: every message decoded on one line, with who sent it, to whom, and
what the pooler did with it.

    C-12 > S-3   Parse name="" query="SELECT $1::int" param_types=1        forwarded
    pooler > S-3 Parse name="PYPOOL_7" query="SELECT $1::int" ...          injected
    S-3 > pooler ParseComplete                                             swallowed
    S-3 > C-12   ReadyForQuery status=I                                    forwarded

This module only reassembles and prints (protocol/describe.py decodes each message); it
reads bytes and never touches a connection. The network layer feeds it through
`Tracer.data(...)` (a read or a write, cut anywhere: a `MessageStream` per connection and
direction reassembles the headers) or `Tracer.message(...)` (one message it made or
swallowed itself). `TraceFilter` says which clients are traced
(all, or some by id or application_name, switched from the console while running).

What it must never print: a password, an MD5 hash, a SCRAM exchange or a cancel key's
secret (protocol/describe.py shows them by length only, and masks a query's `PASSWORD '...'`
literal). Long bodies (queries, parameter values, rows, COPY data) are cut to `limit`
characters with their full length.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from ..protocol.describe import CLIENT, KEPT, LIMIT, SERVER, describe, describe_startup
from ..protocol.startup import GSSENC_REQUEST_CODE, SSL_REQUEST_CODE

ACTIONS: Final = ("forwarded", "rewritten", "injected", "swallowed", "synthesised", "held")


# --- reassembling messages from reads ---------------------------------------------------------


class MessageStream:
    """Messages out of one direction of one connection, however its bytes are cut.

    `feed(data)` yields (type, body start, full body length) for each message completed by
    `data`; a body is kept up to KEPT bytes (enough to decode; the rest only counted).
    With `startup`, the first packet has no type byte (type 0: see describe_startup)."""

    def __init__(self, startup: bool = False) -> None:
        self._startup = startup
        self._head = b""
        self._kind = 0
        self._left = 0
        self._length = 0
        self._body = bytearray()
        self._in_body = False

    def feed(self, data: bytes) -> Iterator[tuple[int, bytes, int]]:
        pos, n = 0, len(data)
        while pos < n:
            if not self._in_body:
                header = 4 if self._startup else 5
                need = header - len(self._head)
                self._head += data[pos : pos + need]
                pos += need
                if len(self._head) < header:
                    return
                if self._startup:
                    self._kind, self._length = 0, int.from_bytes(self._head, "big") - 4
                    self._startup = False
                else:
                    self._kind = self._head[0]
                    self._length = int.from_bytes(self._head[1:5], "big") - 4
                self._head = b""
                self._left = max(0, self._length)
                self._body = bytearray()
                self._in_body = True
            take = min(self._left, n - pos)
            if len(self._body) < KEPT:
                self._body += data[pos : pos + min(take, KEPT - len(self._body))]
            self._left -= take
            pos += take
            if self._left:
                return
            self._in_body = False
            yield self._kind, bytes(self._body), self._length

    def expect_startup(self) -> None:
        """The next packet is untyped again (after an SSLRequest answered 'N')."""
        self._startup = True


# --- which clients, and the lines -------------------------------------------------------------


@dataclass
class TraceFilter:
    """Which clients are traced: all (`trace = on`, `pypool --trace`), or those named by
    id or application_name (the console's switch for one client)."""

    everyone: bool = False
    ids: set[int] = field(default_factory=set)
    application_names: set[str] = field(default_factory=set)

    def wants(self, client: Any) -> bool:
        if self.everyone:
            return True
        if client is None:
            return False
        return client.id in self.ids or (
            client.params.get("application_name", "") in self.application_names)

    def __bool__(self) -> bool:
        return self.everyone or bool(self.ids) or bool(self.application_names)


class Tracer:
    """Formats messages as trace lines and hands each to `write` (a logger, a file)."""

    def __init__(self, write: Callable[[str], None], limit: int = LIMIT) -> None:
        self.write = write
        self.limit = limit
        self.streams: dict[tuple[str, str], MessageStream] = {}

    def message(self, source: str, target: str, sender: str, kind: int, body: bytes,
                action: str = "forwarded", length: int | None = None) -> None:
        """One whole message (type byte and body) from `source` to `target`."""
        if kind == 0:
            text = describe_startup(body, self.limit)
        else:
            text = describe(sender, kind, body, length, self.limit)
        self.write(f"{source + ' > ' + target:<20} {text:<90} {action}")

    def data(self, source: str, target: str, sender: str, data: bytes,
             action: str = "forwarded", startup: bool = False) -> None:
        """Bytes read or written between two connections, cut anywhere: one line per
        message they complete (a stream per source and target keeps the pieces)."""
        key = (source, target)
        stream = self.streams.get(key)
        if stream is None:
            stream = self.streams[key] = MessageStream(startup)
        for kind, body, length in stream.feed(data):
            self.message(source, target, sender, kind, body, action, length)

    def forget(self, label: str) -> None:
        """A connection closed: drop its streams."""
        for key in [key for key in self.streams if label in key]:
            del self.streams[key]


# --- the four socket points: what the pooler did with each message ----------------------------

# A client's messages kept awaiting attribution (what it sent while it had no server, or
# while a WAIT held it). A server's are settled at the end of each read, however many.
_PENDING_LIMIT: Final = 65536
_LOGIN_STATES: Final = ("STARTUP", "AUTH", "WELCOME")
_SSL_ANSWERS: Final = (b"N", b"S", b"G")


def _label(connection: Any) -> str:
    """`C-12`, `S-3`: the start of the connection's repr()."""
    return repr(connection).split(":", 1)[0]


class WireTrace:
    """The trace as the network layer feeds it, at the four socket points:

    - client > pooler (`client_read`): each message is kept, not printed, until it is seen
      going on to a server: unchanged (forwarded), the same but for a statement name
      (rewritten; two lines, the client's `C-n > pooler` and what went on), or never
      (swallowed: the pooler answered it itself, a Parse of a statement the server already
      had, a Close, a Terminate). Login messages print at once.
    - pooler > server (`server_write`): a message matched to one the client sent is printed
      as the client's; one that matches none (or that the caller says is its own: a hidden
      SET, check or reset query, the login) is the pooler's, `injected`.
    - server > pooler (`server_read`, `server_done`): kept until the client is written to.
    - pooler > client (`client_write`): a message equal to one the server sent is
      `forwarded` (and the server's messages before it that did not go on are printed as
      `swallowed`); one that matches none is `synthesised` (a ParseComplete or CloseComplete
      the pooler answered, its own ErrorResponse, the welcome). What the server sent that is
      still unmatched when its read is dealt with was swallowed (hidden queries' replies).

    Matching is by content (type, the body's start, its length), in order. Two equal replies
    in a row (two ParseCompletes) are told apart by that order alone: the trace takes the
    later one as the one passed on, which is right for an injected Parse (it goes first).
    """

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.filter = TraceFilter()
        # Messages read and not yet attributed, by connection label: (type, body, length).
        self.pending: dict[str, deque[tuple[int, bytes, int]]] = {}
        self.relaying: Any = None  # the server whose read is being dealt with

    # client > pooler

    def client_read(self, client: Any, data: bytes) -> None:
        label = _label(client)
        if (label, "pooler") not in self.tracer.streams and data[:1] == b"\x16":
            # Direct TLS: a ClientHello, not a startup packet; the TLS layer answers it and
            # what it decrypts comes here next.
            self.tracer.write(f"{label + ' > pooler':<20} {'TLS ClientHello (direct TLS)':<90} "
                              "swallowed")
            return
        login = client.state.name in _LOGIN_STATES
        for kind, body, length in self._stream(label, "pooler", CLIENT, data, startup=True):
            if login or client.admin is not None:
                target = "console" if client.admin is not None else "pooler"
                self.tracer.message(label, target, CLIENT, kind, body,
                                    "forwarded" if target == "console" else "swallowed",
                                    length)
            else:
                self._keep(label, (kind, body, length))

    def client_gone(self, client: Any) -> None:
        label = _label(client)
        for kind, body, length in self.pending.pop(label, ()):
            self.tracer.message(label, "pooler", CLIENT, kind, body, "swallowed", length)
        self.tracer.forget(label)

    # pooler > server

    def server_write(self, server: Any, data: bytes, own: bool = False) -> None:
        label = _label(server)
        senders = [] if own else [c for c in (server.client, *server.chain) if c is not None]
        for kind, body, length in self._stream("pooler", label, CLIENT, data, startup=True):
            message = (kind, body, length)
            for client in senders:
                source = _label(client)
                original = self._match_request(source, message)
                if original is not None:
                    action = "forwarded" if original == message else "rewritten"
                    if action == "rewritten":  # as the client sent it, then as it went on
                        self.tracer.message(source, "pooler", CLIENT, kind, original[1],
                                            action, original[2])
                    self.tracer.message(source, label, CLIENT, kind, body, action, length)
                    break
            else:
                self.tracer.message("pooler", label, CLIENT, kind, body, "injected", length)

    def _match_request(self, client_label: str, message: tuple[int, bytes, int]
                       ) -> tuple[int, bytes, int] | None:
        """The client's message that `message` is: equal, or the same but for a statement
        name (rewritten). Only a Parse or Close may be passed over on the way (the pooler
        answers those itself: swallowed); anything else means `message` is the pooler's."""
        pending = self.pending.get(client_label)
        if not pending:
            return None
        at = -1
        for i, candidate in enumerate(pending):
            if candidate == message or _renamed(candidate, message):
                at = i
                break
            if candidate[0] not in _ANSWERED_BY_POOLER:
                return None
        if at < 0:
            return None
        for kind, body, length in _take(pending, at):
            self.tracer.message(client_label, "pooler", CLIENT, kind, body, "swallowed", length)
        return pending.popleft()

    # server > pooler

    def server_read(self, server: Any, data: bytes) -> None:
        label = _label(server)
        self.relaying = server
        if (label, "pooler") not in self.tracer.streams and data in _SSL_ANSWERS:
            # The answer to the pooler's SSLRequest (server_tls_sslmode), one byte.
            self.tracer.write(f"{label + ' > pooler':<20} {'SSL answer ' + repr(data):<90} "
                              "swallowed")
            return
        login = server.state.name == "LOGIN"
        for kind, body, length in self._stream(label, "pooler", SERVER, data):
            if login:
                self.tracer.message(label, "pooler", SERVER, kind, body, "swallowed", length)
            else:
                self.pending.setdefault(label, deque()).append((kind, body, length))

    def server_done(self, server: Any) -> None:
        """The server's read is dealt with: what did not go on to a client was swallowed."""
        self.relaying = None
        label = _label(server)
        for kind, body, length in self.pending.pop(label, ()):
            self.tracer.message(label, "pooler", SERVER, kind, body, "swallowed", length)

    def server_gone(self, server: Any) -> None:
        self.server_done(server)
        self.tracer.forget(_label(server))

    # pooler > client

    def client_write(self, client: Any, data: bytes) -> None:
        label = _label(client)
        key = ("pooler", label)
        if key not in self.tracer.streams and data in _SSL_ANSWERS:
            self.tracer.write(f"{'pooler > ' + label:<20} {'SSL answer ' + repr(data):<90} "
                              "synthesised")
            return
        server = self.relaying if self.relaying is not None else client.server
        pending = None if server is None else self.pending.get(_label(server))
        for kind, body, length in self._stream("pooler", label, SERVER, data):
            message = (kind, body, length)
            at = -1 if not pending else _find(pending, message)
            if at < 0:
                self.tracer.message("pooler", label, SERVER, kind, body, "synthesised", length)
                continue
            assert pending is not None
            # Equal messages in a row: the last of the run is the one passed on.
            while at + 1 < len(pending) and pending[at + 1] == message:
                at += 1
            source = _label(server)
            for skipped in _take(pending, at):
                self.tracer.message(source, "pooler", SERVER, skipped[0], skipped[1],
                                    "swallowed", skipped[2])
            pending.popleft()
            self.tracer.message(source, label, SERVER, kind, body, "forwarded", length)

    # ---

    def _stream(self, source: str, target: str, sender: str, data: bytes,
                startup: bool = False) -> Iterator[tuple[int, bytes, int]]:
        key = (source, target)
        stream = self.tracer.streams.get(key)
        if stream is None:
            stream = self.tracer.streams[key] = MessageStream(startup)
        for kind, body, length in stream.feed(data):
            if kind == 0 and len(body) >= 4 and int.from_bytes(body[:4], "big") in (
                    SSL_REQUEST_CODE, GSSENC_REQUEST_CODE):
                stream.expect_startup()  # answered 'N': the StartupMessage comes next
            yield kind, body, length

    def _keep(self, label: str, message: tuple[int, bytes, int]) -> None:
        pending = self.pending.setdefault(label, deque())
        if len(pending) >= _PENDING_LIMIT:  # never seen going on: say so, keep memory bounded
            kind, body, length = pending.popleft()
            self.tracer.message(label, "?", CLIENT, kind, body, "unmatched", length)
        pending.append(message)


# A client's messages the pooler may answer itself instead of passing them on.
_ANSWERED_BY_POOLER: Final = (ord("P"), ord("C"))


def _renamed(sent: tuple[int, bytes, int], went: tuple[int, bytes, int]) -> bool:
    """Whether `went` is `sent` with its statement name changed (the prepared layer's
    rewriting): the same Parse, Bind, Describe or Close but for the name, or a Query (whose
    SQL-level PREPARE/EXECUTE names are rewritten; the pooler's own are flagged apart)."""
    kind, a, b = sent[0], sent[1], went[1]
    if kind != went[0]:
        return False
    if kind == ord("Q"):
        return True
    if kind == ord("P"):  # name, then the query and the types
        return a[a.find(b"\0"):] == b[b.find(b"\0"):]
    if kind == ord("B"):  # portal, statement name, then the values
        portal = a.find(b"\0")
        return (a[:portal] == b[:portal] and b.find(b"\0") == portal
                and a[a.find(b"\0", portal + 1):] == b[b.find(b"\0", portal + 1):])
    if kind == ord("D") or kind == ord("C"):  # 'S' or 'P', then the name
        return a[:1] == b[:1]
    return False


def _take(pending: deque[tuple[int, bytes, int]], count: int) -> list[tuple[int, bytes, int]]:
    """The first `count` messages, taken off."""
    return [pending.popleft() for _ in range(count)]


def _find(pending: deque[tuple[int, bytes, int]], message: tuple[int, bytes, int]) -> int:
    for i, candidate in enumerate(pending):
        if candidate == message:
            return i
    return -1
