"""The protocol trace: every message decoded on one line, with who sent it, to whom, and
what the pooler did with it.

    C-12 > S-3   Parse name="" query="SELECT $1::int" param_types=1        forwarded
    pooler > S-3 Parse name="PYPOOL_7" query="SELECT $1::int" ...          injected
    S-3 > pooler ParseComplete                                             swallowed
    S-3 > C-12   ReadyForQuery status=I                                    forwarded

This module only decodes and prints; it reads bytes and never touches a connection. The
network layer feeds it through `Tracer.data(...)` (a read or a write, cut anywhere: a
`MessageStream` per connection and direction reassembles the headers) or `Tracer.message(...)`
(one message it made or swallowed itself). `TraceFilter` says which clients are traced
(all, or some by id or application_name, switched from the console while running).

What it must never print: a password, an MD5 hash, a SCRAM exchange (client-first,
client-final with its proof, server-first, server-final with its signature) or a cancel
key's secret. PasswordMessage and every SASL step are shown by length only. A query's
`PASSWORD '...'` literal (ALTER ROLE, CREATE ROLE) is masked as well. Long bodies (queries,
parameter values, rows, COPY data) are cut to `limit` characters with their full length.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

CLIENT: Final = "client"  # sent by the client (frontend messages)
SERVER: Final = "server"  # sent by the server (backend messages)
ACTIONS: Final = ("forwarded", "rewritten", "injected", "swallowed", "synthesised", "held")
LIMIT: Final = 60  # characters of a shortened value
KEPT: Final = 4096  # bytes of a body the stream keeps for decoding; the rest is counted

_PASSWORD_LITERAL = re.compile(r"(?i)(\bpassword\s+)'(?:[^']|'')*'")


def shorten(text: str, limit: int = LIMIT) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


def quoted(text: str, limit: int = LIMIT) -> str:
    return '"' + shorten(text, limit).replace('"', '\\"') + '"'


def mask_passwords(sql: str) -> str:
    """A query with its PASSWORD '...' literals replaced by '***'."""
    return _PASSWORD_LITERAL.sub(r"\1'***'", sql)


def _cstrings(body: bytes, count: int) -> tuple[list[str], int]:
    """The first `count` NUL-terminated strings of `body`, and the offset after them."""
    out = []
    pos = 0
    for _ in range(count):
        end = body.find(b"\0", pos)
        if end < 0:
            out.append(body[pos:].decode("utf-8", "replace"))
            return out, len(body)
        out.append(body[pos:end].decode("utf-8", "replace"))
        pos = end + 1
    return out, pos


def _int(body: bytes, pos: int, size: int) -> int:
    return int.from_bytes(body[pos : pos + size], "big", signed=size == 4)


def _fields(body: bytes) -> str:
    """ErrorResponse / NoticeResponse: severity, SQLSTATE and message."""
    fields: dict[str, str] = {}
    pos = 0
    while pos < len(body) and body[pos]:
        end = body.find(b"\0", pos + 1)
        if end < 0:
            break
        fields[chr(body[pos])] = body[pos + 1 : end].decode("utf-8", "replace")
        pos = end + 1
    severity = fields.get("V") or fields.get("S", "")
    return f"{severity} {fields.get('C', '')} {quoted(fields.get('M', ''))}".strip()


# --- frontend messages ----------------------------------------------------------------------


def _query(body: bytes, limit: int) -> str:
    [sql], _ = _cstrings(body, 1)
    return f"query={quoted(mask_passwords(sql), limit)}"


def _parse(body: bytes, limit: int) -> str:
    (name, sql), pos = _cstrings(body, 2)
    types = _int(body, pos, 2)
    return f"name={quoted(name)} query={quoted(mask_passwords(sql), limit)} param_types={types}"


def _bind(body: bytes, limit: int) -> str:
    (portal, statement), pos = _cstrings(body, 2)
    formats = _int(body, pos, 2)
    pos += 2 + 2 * formats
    count = _int(body, pos, 2)
    pos += 2
    values = []
    for _ in range(count):
        size = _int(body, pos, 4)
        pos += 4
        if size < 0:
            values.append("NULL")
            continue
        raw = body[pos : pos + size]
        pos += size
        try:
            values.append(quoted(raw.decode("utf-8"), limit // 3))
        except UnicodeDecodeError:
            values.append(f"<{size} bytes>")
        if len(", ".join(values)) > limit:
            values.append("...")
            break
    return (f"portal={quoted(portal)} statement={quoted(statement)} "
            f"params=[{', '.join(values)}]")


def _describe_or_close(body: bytes, limit: int) -> str:
    what = {ord("S"): "statement", ord("P"): "portal"}.get(body[0] if body else 0, "?")
    [name], _ = _cstrings(body[1:], 1)
    return f"{what} {quoted(name)}"


def _execute(body: bytes, limit: int) -> str:
    [portal], pos = _cstrings(body, 1)
    return f"portal={quoted(portal)} max_rows={_int(body, pos, 4)}"


def _hidden(body: bytes, limit: int) -> str:
    return "(not shown)"


def _copy_data(body: bytes, limit: int) -> str:
    return ""  # the length says it; the rows are data


def _copy_fail(body: bytes, limit: int) -> str:
    [text], _ = _cstrings(body, 1)
    return quoted(text, limit)


def _function_call(body: bytes, limit: int) -> str:
    return f"oid={_int(body, 0, 4) & 0xFFFFFFFF}"


def _nothing(body: bytes, limit: int) -> str:
    return ""


Decoder = Callable[[bytes, int], str]

FRONTEND: Final[dict[int, tuple[str, Decoder]]] = {
    ord("Q"): ("Query", _query),
    ord("P"): ("Parse", _parse),
    ord("B"): ("Bind", _bind),
    ord("D"): ("Describe", _describe_or_close),
    ord("E"): ("Execute", _execute),
    ord("C"): ("Close", _describe_or_close),
    ord("S"): ("Sync", _nothing),
    ord("H"): ("Flush", _nothing),
    ord("X"): ("Terminate", _nothing),
    ord("F"): ("FunctionCall", _function_call),
    ord("d"): ("CopyData", _copy_data),
    ord("c"): ("CopyDone", _nothing),
    ord("f"): ("CopyFail", _copy_fail),
    # PasswordMessage, SASLInitialResponse and SASLResponse share it: never decoded.
    ord("p"): ("PasswordMessage", _hidden),
}


# --- backend messages -----------------------------------------------------------------------

_AUTH_NAMES: Final = {
    0: "AuthenticationOk", 2: "AuthenticationKerberosV5", 3: "AuthenticationCleartextPassword",
    5: "AuthenticationMD5Password", 7: "AuthenticationGSS", 8: "AuthenticationGSSContinue",
    9: "AuthenticationSSPI", 10: "AuthenticationSASL", 11: "AuthenticationSASLContinue",
    12: "AuthenticationSASLFinal",
}


def _authentication(body: bytes, limit: int) -> str:
    code = _int(body, 0, 4)
    name = _AUTH_NAMES.get(code, f"Authentication({code})")
    if code == 10:  # the mechanisms offered: public
        mechanisms = [m.decode("ascii", "replace") for m in body[4:].split(b"\0") if m]
        return f"{name} mechanisms={','.join(mechanisms)}"
    if code in (0, 3):
        return name
    return f"{name} (not shown)"  # a salt, a server-first or server-final message


def _parameter_status(body: bytes, limit: int) -> str:
    (name, value), _ = _cstrings(body, 2)
    return f"{name}={quoted(value, limit)}"


def _backend_key_data(body: bytes, limit: int) -> str:
    return f"pid={_int(body, 0, 4)} secret=(not shown)"


def _ready_for_query(body: bytes, limit: int) -> str:
    return f"status={chr(body[0]) if body else '?'}"


def _row_description(body: bytes, limit: int) -> str:
    count = _int(body, 0, 2)
    names = []
    pos = 2
    for _ in range(count):
        [name], pos_after = _cstrings(body[pos:], 1)
        names.append(name)
        pos += pos_after + 18
    return f"columns={count} [{shorten(', '.join(names), limit)}]"


def _data_row(body: bytes, limit: int) -> str:
    count = _int(body, 0, 2)
    pos = 2
    values = []
    for _ in range(count):
        size = _int(body, pos, 4)
        pos += 4
        if size < 0:
            values.append("NULL")
        else:
            values.append(body[pos : pos + size].decode("utf-8", "replace"))
            pos += size
    return f"values={count} [{shorten(', '.join(values), limit)}]"


def _command_complete(body: bytes, limit: int) -> str:
    [tag], _ = _cstrings(body, 1)
    return f"tag={quoted(tag)}"


def _parameter_description(body: bytes, limit: int) -> str:
    return f"types={_int(body, 0, 2)}"


def _notification(body: bytes, limit: int) -> str:
    pid = _int(body, 0, 4)
    (channel, payload), _ = _cstrings(body[4:], 2)
    return f"pid={pid} channel={quoted(channel)} payload={quoted(payload, limit)}"


def _copy_response(body: bytes, limit: int) -> str:
    return f"format={body[0] if body else 0} columns={_int(body, 1, 2)}"


def _negotiate(body: bytes, limit: int) -> str:
    return f"newest_minor={_int(body, 0, 4)} unsupported={_int(body, 4, 4)}"


def _function_call_response(body: bytes, limit: int) -> str:
    return f"size={_int(body, 0, 4)}"


def _error(body: bytes, limit: int) -> str:
    return _fields(body)


BACKEND: Final[dict[int, tuple[str, Decoder]]] = {
    ord("R"): ("Authentication", _authentication),
    ord("S"): ("ParameterStatus", _parameter_status),
    ord("K"): ("BackendKeyData", _backend_key_data),
    ord("Z"): ("ReadyForQuery", _ready_for_query),
    ord("T"): ("RowDescription", _row_description),
    ord("D"): ("DataRow", _data_row),
    ord("C"): ("CommandComplete", _command_complete),
    ord("E"): ("ErrorResponse", _error),
    ord("N"): ("NoticeResponse", _error),
    ord("1"): ("ParseComplete", _nothing),
    ord("2"): ("BindComplete", _nothing),
    ord("3"): ("CloseComplete", _nothing),
    ord("n"): ("NoData", _nothing),
    ord("s"): ("PortalSuspended", _nothing),
    ord("I"): ("EmptyQueryResponse", _nothing),
    ord("t"): ("ParameterDescription", _parameter_description),
    ord("A"): ("NotificationResponse", _notification),
    ord("G"): ("CopyInResponse", _copy_response),
    ord("H"): ("CopyOutResponse", _copy_response),
    ord("W"): ("CopyBothResponse", _copy_response),
    ord("d"): ("CopyData", _copy_data),
    ord("c"): ("CopyDone", _nothing),
    ord("V"): ("FunctionCallResponse", _function_call_response),
    ord("v"): ("NegotiateProtocolVersion", _negotiate),
}


def describe(sender: str, kind: int, body: bytes, length: int | None = None,
             limit: int = LIMIT) -> str:
    """One message as text: its protocol name, then what matters in it. `sender` is CLIENT
    or SERVER (the type bytes of the two directions overlap); `length` is the body's full
    size when `body` holds only its start."""
    table = FRONTEND if sender == CLIENT else BACKEND
    name, decode = table.get(kind, (f"Unknown({chr(kind)!r})", _nothing))
    size = len(body) if length is None else length
    try:
        detail = decode(body, limit)
    except (IndexError, ValueError):
        detail = "(malformed)"
    if name == "Authentication":
        return detail  # the decoder names the exact kind
    return f"{name} {detail}".rstrip() + _size(size, name in _SIZED)


_SIZED: Final = frozenset({"CopyData", "PasswordMessage", "DataRow", "Bind", "Query", "Parse",
                           "FunctionCallResponse"})


def _size(size: int, always: bool) -> str:
    return f" ({size} bytes)" if always or size > KEPT else ""


def describe_startup(body: bytes, limit: int = LIMIT) -> str:
    """The untyped first packet of a connection: StartupMessage, SSLRequest, GSSENCRequest
    or CancelRequest (whose secret is not shown)."""
    code = _int(body, 0, 4)
    if code == 80877103:
        return "SSLRequest"
    if code == 80877104:
        return "GSSENCRequest"
    if code == 80877102:
        return f"CancelRequest pid={_int(body, 4, 4)} secret=(not shown)"
    parts = [part.decode("utf-8", "replace") for part in body[4:].split(b"\0")]
    pairs = [f"{k}={quoted(v, limit)}" for k, v in zip(parts[::2], parts[1::2], strict=False)
             if k]
    return f"StartupMessage version={code >> 16}.{code & 0xFFFF} {' '.join(pairs)}".rstrip()


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
            if kind == 0 and len(body) >= 4 and _int(body, 0, 4) in (80877103, 80877104):
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
