"""Which statements change a server's session, and how: `look` on the hot path (a table
lookup of a Query's or Parse's first byte and a set lookup of its first three letters, no
bytes object made for nearly every statement), then `classify`, which reads the first
keyword(s) and returns the `Command`s the statement carries.

Reads text only (tokenizer.py); what the pooler does with the Commands is record.py's.
"""

from __future__ import annotations

import re
from typing import Final

from mypy_extensions import i64

from ..listening import channel_name
from ..params import quote_literal
from .commands import (
    CLOSE_ALL,
    DISCARD_ALL,
    DISCARD_TEMP,
    HOLD_CURSOR,
    LISTEN,
    LOAD,
    LOCK,
    RESET,
    RESET_ALL,
    ROLE,
    ROLLBACK,
    ROLLBACK_TO,
    SESSION_AUTHORIZATION,
    SET,
    TEMP_TABLE,
    UNLISTEN,
    UNLISTEN_ALL,
    UNLOCK,
    UNLOCK_ALL,
    UNTRACKABLE,
    Command,
)
from .tokenizer import WORD, single, skip_space, statement_end, tokens

# --- the hot path ----------------------------------------------------------------------------

# What a statement's first byte says (a bytes table: compiled code reads it as an int):
# NO for most, READ for whitespace, a comment or a parenthesis (read on), and _INITIAL for
# an initial of the keywords below.
_INITIAL: Final = 2
_OPENING: Final = bytes(
    _INITIAL if byte in b"SsRrDdLlUuCcAa" else 1 if byte in b" \t\r\n-/(" else 0
    for byte in range(256))
# The first three letters of those keywords, lower case, as ints (a << 16 | b << 8 | c):
# DELETE, RELEASE, LOCK, CLUSTER, ... stop here, and no bytes object is made.
_THREE: Final = frozenset(
    (word[0] << 16) | (word[1] << 8) | word[2]
    for word in (b"set", b"sel", b"res", b"dis", b"lis", b"loa", b"unl", b"cre", b"dec",
                 b"clo", b"rol", b"abo")
)
_SELECT: Final = (ord("s") << 16) | (ord("e") << 8) | ord("l")
NO: Final = 0
READ: Final = 1  # classify it
CALLS: Final = 2  # a SELECT: only its calls matter


def _first_look(data: bytes, start: int, end: int) -> int:
    """NO, READ or CALLS for the statement text data[start:end]."""
    if start >= end:
        return NO
    opening = _OPENING[data[start]]
    if opening != _INITIAL:
        return NO if opening == 0 else READ  # READ: whitespace, a comment, a parenthesis
    if end - start < 3:
        return NO
    three = (((i64(data[start]) | 32) << 16) | ((i64(data[start + 1]) | 32) << 8)
             | (i64(data[start + 2]) | 32))  # machine shifts (i64: protocol/framing.py)
    if three == _SELECT:  # the common case first: no set lookup, no int made for it
        return CALLS
    return READ if three in _THREE else NO


def look(kind: int, data: bytes, pos: int, end: int) -> list[Command] | None:
    """The hot path: what the simple Query (kind 'Q') or Parse at data[pos:end] changes, or
    None for a statement that cannot change session state (nearly all), decided without
    making a bytes object: a table lookup of the text's first byte, then a set lookup of
    its first three letters; a SELECT then costs an `in` for a parenthesis."""
    if kind == 81:  # Query: the text, then its NUL
        text_at = pos + 5
        text_end = end - 1
    else:  # Parse: the statement name, then the text
        text_at = data.find(0, pos + 5, end) + 1
        text_end = data.find(0, text_at, end) if text_at else -1
    verdict = _first_look(data, text_at, text_end)
    # A SELECT matters only if it calls a function: no parenthesis, no call (settles
    # pgbench's and most ORMs' point lookups).
    if verdict == NO or (verdict == CALLS and (
            _absent(data, 40, text_at, text_end)  # "("
            or (data.find(b"advisory", text_at, text_end) < 0
                and data.find(b"set_config", text_at, text_end) < 0
                and data.find(b"ADVISORY", text_at, text_end) < 0
                and data.find(b"SET_CONFIG", text_at, text_end) < 0))):
        # A PREPARE behind the first statement of a Query makes a statement under the
        # client's own name that the pooler does not track (pooling/prepared/sql.py sees
        # single statements): pinned, so nobody else can EXECUTE it. A semicolon that ends
        # the text starts nothing (`in` on a slice: cheaper than `find` and its arguments;
        # never a slice that ends before it starts, which compiled code refuses).
        if (kind == 81 and text_at < text_end - 1 and 59 in data
                and 59 in data[text_at:text_end - 1] and _runs(data, text_at, text_end)
                and _later_prepare(data[text_at:text_end])):
            return [Command(UNTRACKABLE, b"prepare")]
        return None
    if kind == 81 and not _runs(data, text_at, text_end):
        return None
    return classify(data[text_at:text_end])


def _runs(data: bytes, text_at: int, text_end: int) -> bool:
    """Whether PostgreSQL runs the Query whose text is data[text_at:text_end]: it reads the
    text up to its first NUL and refuses the whole message (08P01, "invalid message format"
    or "invalid string in message") when bytes follow that NUL or none ends it, so such a
    Query changes nothing, and what its text seems to say ("SET" and a NUL) must not be
    recorded: a setting named after it would be undone for the next client in a
    malformed Query."""
    return data[text_end] == 0 and data.find(0, text_at, text_end) < 0


def _absent(data: bytes, byte: int, start: int, end: int) -> bool:
    """Whether `byte` is not in data[start:end]. `in` over the whole read first: memchr
    with no arguments to parse, a fifth of `find`'s cost (an int: `bytes in bytes` first
    tries the needle as an int, and pays for the TypeError), which settles most reads;
    `find` over the range only when the read has it somewhere."""
    return byte not in data or data.find(byte, start, end) < 0


def _later_prepare(text: bytes) -> bool:
    """Whether a statement after the first one of `text` is a PREPARE."""
    pos = statement_end(text, 0) + 1
    while pos < len(text):
        pos = skip_space(text, pos)
        word = WORD.match(text, pos)
        if word is not None and word.group().lower() == b"prepare":
            return True
        pos = statement_end(text, pos) + 1
    return False


def candidate(data: bytes, pos: int) -> bool:
    """Whether the text starting at data[pos] may change session state (the cheap check: a
    statement that fails it is not one)."""
    return _first_look(data, pos, len(data)) != NO


# --- the classifier --------------------------------------------------------------------------

_ON_COMMIT_DROP: Final = re.compile(rb"\bon\s+commit\s+drop\b", re.IGNORECASE)
_SELECT_CALLS: Final = re.compile(
    rb"\b(pg_try_advisory_lock_shared|pg_try_advisory_lock|pg_advisory_lock_shared|"
    rb"pg_advisory_lock|pg_advisory_unlock_shared|pg_advisory_unlock_all|pg_advisory_unlock|"
    rb"set_config)\s*\(",
    re.I,
)
_LOCKS: Final = {b"pg_try_advisory_lock_shared": LOCK, b"pg_try_advisory_lock": LOCK,
                 b"pg_advisory_lock_shared": LOCK, b"pg_advisory_lock": LOCK,
                 b"pg_advisory_unlock_shared": UNLOCK, b"pg_advisory_unlock": UNLOCK,
                 b"pg_advisory_unlock_all": UNLOCK_ALL}
# SET forms that name a setting differently (SET TIME ZONE x is SET timezone = x).
_SET_ALIASES: Final = {b"time": b"timezone", b"schema": b"search_path", b"names":
                       b"client_encoding", b"xml": b"xmloption"}
_TRANSACTION_LOCAL: Final = frozenset({b"local", b"transaction", b"constraints"})


def classify(text: bytes, start: int = 0) -> list[Command]:
    """The changes of session state the statement at text[start:] makes (the first statement
    of a multi-statement Query; a SET followed by more statements is UNTRACKABLE, as the
    pooler would replay them too). [] for none."""
    pos = skip_space(text, start)
    while pos < len(text) and text[pos] == 40:  # (SELECT ...)
        pos = skip_space(text, pos + 1)
    first = WORD.match(text, pos)
    if first is None:
        return []
    if first.group().lower() == b"select":  # the common case: one regex search, no tokens
        return _calls(text, pos) if _SELECT_CALLS.search(text, pos) else []
    words = tokens(text, pos, 9)
    if not words:
        return []
    verb = words[0]
    if verb == b"set":
        return _set(text, pos, words)
    if verb == b"reset":
        if len(words) < 2:
            return []
        if words[1] == b"all":
            return [Command(RESET_ALL)]
        if words[1] == b"session" and words[2:3] == [b"authorization"]:
            return [Command(RESET, SESSION_AUTHORIZATION)]
        if words[1] == b"time" and words[2:3] == [b"zone"]:
            return [Command(RESET, b"timezone")]  # the grammar's spelling of RESET timezone
        if words[1] == b"transaction" and words[2:3] == [b"isolation"]:
            return []  # transaction-local, like SET TRANSACTION
        return [Command(RESET, _setting(words[1]))]
    if verb == b"discard":
        what = words[1] if len(words) > 1 else b""
        if what == b"all":
            return [Command(DISCARD_ALL)]
        if what in (b"temp", b"temporary"):
            return [Command(DISCARD_TEMP)]
        return []
    if verb == b"listen" and len(words) > 1:
        return [Command(LISTEN, channel_name(words[1]))]
    if verb == b"unlisten" and len(words) > 1:
        if words[1] == b"*":
            return [Command(UNLISTEN_ALL)]
        return [Command(UNLISTEN, channel_name(words[1]))]
    if verb == b"load":
        return [Command(LOAD)]
    if verb == b"rollback" or verb == b"abort":
        rest = [w for w in words[1:3] if w not in (b"work", b"transaction")]
        if rest[:1] == [b"to"]:
            return [Command(ROLLBACK_TO)]
        return [] if rest[:1] == [b"prepared"] else [Command(ROLLBACK)]
    if verb == b"create":
        rest = words[1:]
        if rest[:1] in ([b"global"], [b"local"]):
            rest = rest[1:]
        if rest[:1] in ([b"temp"], [b"temporary"]):
            # ON COMMIT DROP: gone when its transaction ends, so nothing to keep a server for.
            statement, _ = single(text, pos)
            return [] if _ON_COMMIT_DROP.search(statement) else [Command(TEMP_TABLE)]
        if rest[:1] == [b"unlogged"]:
            rest = rest[1:]
        if rest[:1] == [b"table"] and len(rest) > 1:
            name = rest[1:4] if rest[1:2] != [b"if"] else rest[4:7]
            if name[:2] == [b"pg_temp", b"."]:
                return [Command(TEMP_TABLE)]
        return []
    if verb == b"declare":
        statement, _ = single(text, pos)
        found = tokens(statement, 0, 64)
        head = found[: found.index(b"for")] if b"for" in found else found
        if b"with" in head and b"hold" in head:
            return [Command(HOLD_CURSOR)]
        return []
    if verb == b"close" and words[1:2] == [b"all"]:
        return [Command(CLOSE_ALL)]
    return []


def _setting(word: bytes) -> bytes:
    """A setting's name as a record key: folded, quotes taken off."""
    if word[:1] == b'"':
        # A lone quote (a name left open) is no name; never word[1:-1] of one byte, a
        # slice that ends before it starts, which compiled code refuses (SystemError).
        return word[1:-1].replace(b'""', b'"').lower() if len(word) > 1 else b""
    return word


def _set(text: bytes, pos: int, words: list[bytes]) -> list[Command]:
    # SET SESSION x is SET x (the grammar's SET SESSION set_rest): the forms below are read
    # after the noise word too (SET SESSION SESSION AUTHORIZATION, SET SESSION TRANSACTION).
    i = 2 if words[1:2] == [b"session"] and words[2:3] not in ([b"authorization"],
                                                               [b"characteristics"]) else 1
    if len(words) <= i or words[i] in _TRANSACTION_LOCAL:
        return []  # SET LOCAL, SET TRANSACTION, SET CONSTRAINTS: gone at the transaction's end
    statement, alone = single(text, pos)
    if i == 2:  # SET SESSION x: the same as SET x, replayed without the noise word
        statement = b"SET " + statement[statement.lower().index(b"session") + 7 :].lstrip()
    if words[i] == b"session":
        if words[i + 1 : i + 2] == [b"characteristics"]:
            return [Command(UNTRACKABLE, b"session characteristics")]
        if words[i + 1 : i + 2] == [b"authorization"]:
            name = SESSION_AUTHORIZATION
            return [Command(SET, name, statement) if alone else Command(UNTRACKABLE, name)]
    first = words[i]
    if first == b"role":
        name = ROLE
    else:
        name = _SET_ALIASES.get(first, _setting(first))
        # A custom setting's dotted name: `myapp.user_id`.
        if words[i + 1 : i + 2] == [b"."] and len(words) > i + 2:
            name = name + b"." + _setting(words[i + 2])
    if not alone:
        return _set_list(text, pos, name)
    return [Command(SET, name, statement)]


def _set_list(text: bytes, pos: int, name: bytes) -> list[Command]:
    """`SET a = 1; SET b = 2`: each one recorded when every statement is a plain SET or
    RESET of one setting (drivers send such lists at connect); else UNTRACKABLE."""
    found: list[Command] = []
    while pos < len(text) and len(found) < 32:
        end = statement_end(text, pos)
        one = classify(text[pos:end])
        if len(one) != 1 or one[0].kind not in (SET, RESET):
            return [Command(UNTRACKABLE, name)]
        found.extend(one)
        pos = skip_space(text, end + 1)
        while pos < len(text) and text[pos] == 59:
            pos = skip_space(text, pos + 1)
    return found if pos >= len(text) else [Command(UNTRACKABLE, name)]


def _calls(text: bytes, pos: int) -> list[Command]:
    """A SELECT's calls of set_config(..., false) and the session advisory lock functions."""
    found: list[Command] = []
    end = statement_end(text, pos)
    for call in _SELECT_CALLS.finditer(text, pos, end):
        function = call.group(1).lower()
        kind = _LOCKS.get(function)
        if kind is not None:
            found.append(Command(kind))
            continue
        args = _literal_args(text, call.end(), end)
        if args is None:
            found.append(Command(UNTRACKABLE, b"set_config"))
        elif args[2] == b"false":
            name = args[0].lower()
            found.append(Command(SET, name, set_config_statement(name, args[1])))
    return found


def set_config_statement(name: bytes, value: bytes) -> bytes:
    """The statement that makes setting `name` (lower case) `value` for the session, as a
    startup packet would: how a set_config call, and a startup parameter the server does not
    report, are replayed."""
    return (b"SELECT pg_catalog.set_config(" + _literal(name) + b", " + _literal(value)
            + b", false)")


def _literal_args(text: bytes, pos: int, end: int) -> tuple[bytes, bytes, bytes] | None:
    """set_config's three arguments when they are plain literals ('name', 'value', false);
    None when the pooler cannot tell their values."""
    args: list[bytes] = []
    for token in tokens(text[:end], pos, 7):
        if token == b",":
            continue
        if token == b")":
            break
        if token[:1] == b"'" and token.endswith(b"'") and len(token) > 1:
            args.append(token[1:-1].replace(b"''", b"'"))
        elif token in (b"true", b"false"):
            args.append(token)
        else:
            return None
    if len(args) != 3 or args[2] not in (b"true", b"false"):
        return None
    return args[0], args[1], args[2]


def _literal(value: bytes) -> bytes:
    return quote_literal(value.decode("utf-8", "surrogateescape")).encode(
        "utf-8", "surrogateescape")
