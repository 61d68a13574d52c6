"""Every protocol 3.0 message as one line of text: its name as the protocol chapter spells
it, then what matters in it (a Parse's name and query, a Bind's parameter values, an
ErrorResponse's SQLSTATE and message, ...), shortened to a limit, with its size.

    Parse name="" query="SELECT $1::int" param_types=1
    ReadyForQuery status=I

The protocol trace (observe/trace.py) prints these; nothing here reads a socket or knows
who sent what. What it must never print: a password, an MD5 hash, a SCRAM exchange
(client-first, client-final with its proof, server-first, server-final with its signature)
or a cancel key's secret. PasswordMessage and every SASL step are shown by length only. A
query's `PASSWORD '...'` literal (ALTER ROLE, CREATE ROLE) is masked as well.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

from .startup import CANCEL_REQUEST_CODE, GSSENC_REQUEST_CODE, SSL_REQUEST_CODE

CLIENT: Final = "client"  # sent by the client (frontend messages)
SERVER: Final = "server"  # sent by the server (backend messages)
LIMIT: Final = 60  # characters of a shortened value
# Bytes of a body a trace keeps for decoding (the rest is counted): a message past it
# is shown with its size.
KEPT: Final = 4096

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
    if code == SSL_REQUEST_CODE:
        return "SSLRequest"
    if code == GSSENC_REQUEST_CODE:
        return "GSSENCRequest"
    if code == CANCEL_REQUEST_CODE:
        return f"CancelRequest pid={_int(body, 4, 4)} secret=(not shown)"
    parts = [part.decode("utf-8", "replace") for part in body[4:].split(b"\0")]
    pairs = [f"{k}={quoted(v, limit)}" for k, v in zip(parts[::2], parts[1::2], strict=False)
             if k]
    return f"StartupMessage version={code >> 16}.{code & 0xFFFF} {' '.join(pairs)}".rstrip()
