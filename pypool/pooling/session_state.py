"""Session state: recognising the statements that change a server's session, and each client's
record of the state it made, so that in transaction mode it follows its client and never
reaches another one (docs/session-state.md).

Theory of operation. `candidate(data, pos)` is the hot path: one table lookup of a simple
Query's (or a Parse's) first byte, then of its first two letters, folded to lower case.
Only texts that pass it are tokenised by `classify`, which reads the first keyword(s) and
returns the `Command`s the statement carries: a plain SET or RESET of a setting (SET LOCAL is
transaction-local and never one), SET ROLE, SET SESSION AUTHORIZATION, RESET ALL, DISCARD,
LISTEN, UNLISTEN, CREATE TEMP TABLE, DECLARE ... WITH HOLD, CLOSE ALL, LOAD, and, in a
SELECT, calls of `set_config(..., false)` and of the session-level advisory lock functions.

What the pooler does with them is one of two things:
- follow: a setting is recorded per client (`ClientSession.sets`, name -> the statement that
  makes it) when the transaction it ran in ends well, replayed on the next server whose state
  differs, and undone there before anyone else runs (`sync_statements`);
- pin: state the pooler cannot move between servers (a LISTEN, an advisory lock, a temporary
  table, a holdable cursor, a LOADed library, a SET it cannot replay exactly) keeps the client
  on its server until it is gone (`ClientSession.pins`).

Never touches a socket. What a statement does that its first keyword does not show (a SET in
a function, the second statement of a multi-statement Query) is not seen: a documented limit.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from .params import quote_literal

# What a Command is (Command.kind).
SET: Final = 1  # name, and the statement that makes it (`replay`)
RESET: Final = 2  # name
RESET_ALL: Final = 3
DISCARD_ALL: Final = 4
DISCARD_TEMP: Final = 5
LISTEN: Final = 6
UNLISTEN: Final = 7
UNLISTEN_ALL: Final = 8
TEMP_TABLE: Final = 9
HOLD_CURSOR: Final = 10
CLOSE_ALL: Final = 11
LOAD: Final = 12
LOCK: Final = 13  # a session-level advisory lock taken (pg_advisory_lock and friends)
UNLOCK: Final = 14
UNLOCK_ALL: Final = 15
UNTRACKABLE: Final = 16  # session state the pooler cannot replay exactly: it pins
ROLLBACK: Final = 17  # ROLLBACK, ABORT: the transaction's settings are undone
ROLLBACK_TO: Final = 18  # ROLLBACK TO SAVEPOINT: settings since (say) the block's start too

# The names of what pins a client (SHOW CLIENTS `pinned`, the NOTICE, the log line).
PIN_REASONS: Final = {
    LISTEN: "listen", TEMP_TABLE: "temp table", HOLD_CURSOR: "with hold cursor",
    LOAD: "load", LOCK: "advisory lock", UNTRACKABLE: "untracked state",
}
# Recorded names with an undo of their own (RESET ALL leaves them, as PostgreSQL does).
ROLE: Final = b"role"
SESSION_AUTHORIZATION: Final = b"session_authorization"


class Command(NamedTuple):
    """One change of session state a statement makes."""

    kind: int
    name: bytes = b""  # the setting (folded to lower case), or the channel
    replay: bytes = b""  # SET: the statement that makes the setting again


# --- the hot path ----------------------------------------------------------------------------

def _table(chars: bytes) -> tuple[bool, ...]:
    return tuple(byte in chars for byte in range(256))


# First bytes that can start a statement worth reading: the keywords' initials, whitespace,
# a comment, a parenthesis.
_FIRST: Final = _table(b"SsRrDdLlUuCcAa \t\r\n-/(")
# The first three letters of those keywords, lower case, as ints (a << 16 | b << 8 | c):
# DELETE, RELEASE, LOCK, CLUSTER, ... stop here, and no bytes object is made.
_THREE: Final = frozenset(
    (word[0] << 16) | (word[1] << 8) | word[2]
    for word in (b"set", b"sel", b"res", b"dis", b"lis", b"loa", b"unl", b"cre", b"dec",
                 b"clo", b"rol", b"abo")
)
_SELECT: Final = (ord("s") << 16) | (ord("e") << 8) | ord("l")
_LETTER: Final = _table(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
NO: Final = 0
READ: Final = 1  # classify it
CALLS: Final = 2  # a SELECT: only its calls matter


def _first_look(data: bytes, start: int, end: int) -> int:
    """NO, READ or CALLS for the statement text data[start:end]."""
    if start >= end or not _FIRST[data[start]]:
        return NO
    if not _LETTER[data[start]]:
        return READ  # whitespace, a comment, a parenthesis: read on
    if end - start < 3:
        return NO
    three = ((data[start] | 32) << 16) | ((data[start + 1] | 32) << 8) | (data[start + 2] | 32)
    if three not in _THREE:
        return NO
    return CALLS if three == _SELECT else READ


def look(kind: int, data: bytes, pos: int, end: int) -> list[Command] | None:
    """The hot path: what the simple Query (kind 'Q') or Parse at data[pos:end] changes, or
    None for a statement that cannot change session state (nearly all), decided without
    making a bytes object: a table lookup of the text's first byte, then a set lookup of
    its first three letters; a SELECT then costs a few `find`s for the function names."""
    if kind == 81:  # Query: the text, then its NUL
        text_at = pos + 5
        text_end = end - 1
    else:  # Parse: the statement name, then the text
        text_at = data.find(0, pos + 5, end) + 1
        text_end = data.find(0, text_at, end) if text_at else -1
    verdict = _first_look(data, text_at, text_end)
    # A SELECT matters only if it calls a function: no parenthesis, no call (one `find`
    # settles pgbench's and most ORMs' point lookups).
    if verdict == NO or (verdict == CALLS and (
            data.find(b"(", text_at, text_end) < 0
            or (data.find(b"advisory", text_at, text_end) < 0
                and data.find(b"set_config", text_at, text_end) < 0
                and data.find(b"ADVISORY", text_at, text_end) < 0
                and data.find(b"SET_CONFIG", text_at, text_end) < 0))):
        if kind == 81:
            # A PREPARE behind the first statement of a Query makes a statement under the
            # client's own name that the pooler does not track (pooling/prepared/sql.py
            # sees single statements): pinned, so nobody else can EXECUTE it.
            semicolon = data.find(59, text_at, text_end)
            if semicolon >= 0 and semicolon < text_end - 1 and _later_prepare(
                    data[text_at:text_end]):
                return [Command(UNTRACKABLE, b"prepare")]
        return None
    return classify(data[text_at:text_end])


def _later_prepare(text: bytes) -> bool:
    """Whether a statement after the first one of `text` is a PREPARE."""
    pos = statement_end(text, 0) + 1
    while pos < len(text):
        pos = skip_space(text, pos)
        word = _WORD.match(text, pos)
        if word is not None and word.group().lower() == b"prepare":
            return True
        pos = statement_end(text, pos) + 1
    return False


def candidate(data: bytes, pos: int) -> bool:
    """Whether the text starting at data[pos] may change session state (the cheap check: a
    statement that fails it is not one)."""
    return _first_look(data, pos, len(data)) != NO


# --- the tokenizer ---------------------------------------------------------------------------

_SPACE: Final = _table(b" \t\r\n\f\v")
_WORD: Final = re.compile(rb"[A-Za-z_\x80-\xff][A-Za-z0-9_$\x80-\xff]*")
_ON_COMMIT_DROP: Final = re.compile(rb"\bon\s+commit\s+drop\b", re.IGNORECASE)
_DOLLAR_TAG: Final = re.compile(rb"\$(?:[A-Za-z_\x80-\xff][A-Za-z0-9_\x80-\xff]*)?\$")


def skip_space(text: bytes, pos: int) -> int:
    """The first position at or after `pos` that is neither whitespace nor inside a comment
    (`--` to the end of the line, `/* */` nested, as PostgreSQL reads them)."""
    n = len(text)
    while pos < n:
        byte = text[pos]
        if _SPACE[byte]:
            pos += 1
        elif byte == 45 and text[pos + 1 : pos + 2] == b"-":  # --
            end = text.find(b"\n", pos)
            pos = n if end < 0 else end + 1
        elif byte == 47 and text[pos + 1 : pos + 2] == b"*":  # /*
            depth, pos = 1, pos + 2
            while pos < n and depth:
                if text.startswith(b"/*", pos):
                    depth, pos = depth + 1, pos + 2
                elif text.startswith(b"*/", pos):
                    depth, pos = depth - 1, pos + 2
                else:
                    pos += 1
        else:
            break
    return pos


def _quoted_end(text: bytes, pos: int, escapes: bool = False) -> int:
    """The end of the literal or quoted identifier starting at text[pos] (len if unclosed);
    `escapes`: an E'' literal, where a backslash escapes the next byte."""
    n = len(text)
    byte = text[pos]
    if byte == 36:  # $tag$ ... $tag$
        tag = _DOLLAR_TAG.match(text, pos)
        if tag is None:
            return pos + 1
        end = text.find(tag.group(), tag.end())
        return n if end < 0 else end + len(tag.group())
    i = pos + 1
    while i < n:
        c = text[i]
        if escapes and c == 92:  # a backslash escape in an E'' literal
            i += 2
            continue
        if c == byte:
            if text[i + 1 : i + 2] == bytes((byte,)):
                i += 2  # a doubled quote
                continue
            return i + 1
        i += 1
    return n


def tokens(text: bytes, pos: int = 0, limit: int = 8) -> list[bytes]:
    """Up to `limit` tokens of the statement from `pos`: words folded to lower case, quoted
    identifiers and literals as written, other characters one at a time. Stops at a `;`."""
    found: list[bytes] = []
    n = len(text)
    while len(found) < limit:
        pos = skip_space(text, pos)
        if pos >= n or text[pos] == 59:
            break
        byte = text[pos]
        if (byte == 69 or byte == 101) and text[pos + 1 : pos + 2] == b"'":  # E'...'
            end = _quoted_end(text, pos + 1, True)
            found.append(text[pos:end])
            pos = end
            continue
        word = _WORD.match(text, pos)
        if word is not None:
            found.append(word.group().lower())
            pos = word.end()
        elif byte == 39 or byte == 34 or byte == 36:
            end = _quoted_end(text, pos)
            found.append(text[pos:end])
            pos = end
        else:
            found.append(text[pos : pos + 1])
            pos += 1
    return found


def statement_end(text: bytes, pos: int = 0) -> int:
    """Where the statement starting at `pos` ends: its `;`, or the end of the text; quotes,
    dollar quotes and comments are stepped over."""
    n = len(text)
    while pos < n:
        pos = skip_space(text, pos)
        if pos >= n:
            break
        byte = text[pos]
        if byte == 59:
            return pos
        if (byte == 69 or byte == 101) and text[pos + 1 : pos + 2] == b"'":
            pos = _quoted_end(text, pos + 1, True)
        elif byte == 39 or byte == 34 or (byte == 36 and _DOLLAR_TAG.match(text, pos)):
            pos = _quoted_end(text, pos)
        else:
            pos += 1
    return n


def single(text: bytes, start: int) -> tuple[bytes, bool]:
    """The first statement of `text` (from `start`), without its `;`, and whether it is the
    only one (nothing but `;`, whitespace and comments after it)."""
    end = statement_end(text, start)
    first = text[start:end].rstrip()
    rest = end
    while rest < len(text):
        rest = skip_space(text, rest)
        if rest < len(text) and text[rest] != 59:
            return first, False
        rest += 1
    return first, True


# --- the classifier --------------------------------------------------------------------------

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
    first = _WORD.match(text, pos)
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
        return [Command(LISTEN, words[1])]
    if verb == b"unlisten" and len(words) > 1:
        return [Command(UNLISTEN_ALL)] if words[1] == b"*" else [Command(UNLISTEN, words[1])]
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
        return word[1:-1].replace(b'""', b'"').lower()
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
            name, value = args[0].lower(), args[1]
            replay = (b"SELECT pg_catalog.set_config(" + _literal(name) + b", "
                      + _literal(value) + b", false)")
            found.append(Command(SET, name, replay))
    return found


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


def quote_ident(name: bytes) -> bytes:
    """A setting's name as SQL: bare when it is a plain (dotted) lower-case name."""
    if re.fullmatch(rb"[a-z_][a-z0-9_$]*(?:\.[a-z_][a-z0-9_$]*)?", name):
        return name
    return b'"' + name.replace(b'"', b'""') + b'"'


def undo(name: bytes) -> bytes:
    """The statement that gives setting `name` back its session default."""
    if name == ROLE:
        return b"RESET ROLE"
    if name == SESSION_AUTHORIZATION:
        return b"RESET SESSION AUTHORIZATION"
    return b"RESET " + quote_ident(name)


def sync_statements(server: dict[bytes, bytes | None], client: dict[bytes, bytes]) -> bytes:
    """The SQL that turns a server holding settings `server` (name -> the statement that made
    it, None when unsure) into one holding the client's; b"" when they match. Undoes go first
    (role and session authorization first), then the client's statements in the order it
    ran them."""
    undos = [name for name in server if name not in client]
    # The identity first: a RESET of another setting may need the login role's rights.
    undos.sort(key=lambda name: 0 if name == ROLE else 1 if name == SESSION_AUTHORIZATION
               else 2)
    parts = [undo(name) for name in undos]
    if any(name == SESSION_AUTHORIZATION for name in client) and (
        server.get(SESSION_AUTHORIZATION) != client.get(SESSION_AUTHORIZATION)
    ):
        # SET SESSION AUTHORIZATION resets the role: replay everything after it.
        parts.extend(client.values())
    else:
        parts.extend(made for name, made in client.items() if server.get(name) != made)
    # A newline after each: a replayed statement's trailing `--` comment ends with it.
    return b";\n".join(parts)


# --- reject ----------------------------------------------------------------------------------

# The kinds that make state (reject refuses them); the others only clear it.
CREATES: Final = frozenset({SET, LISTEN, TEMP_TABLE, HOLD_CURSOR, LOAD, LOCK, UNTRACKABLE})
_LABELS: Final = {
    SET: "SET", LISTEN: "LISTEN", TEMP_TABLE: "CREATE TEMP TABLE",
    HOLD_CURSOR: "DECLARE ... WITH HOLD", LOAD: "LOAD", LOCK: "pg_advisory_lock",
    UNTRACKABLE: "SET",
}


def label(command: Command) -> str:
    """The command as an error message or a log line names it."""
    if command.name == ROLE:
        return "SET ROLE"
    if command.name == SESSION_AUTHORIZATION:
        return "SET SESSION AUTHORIZATION"
    if command.kind == SET and command.replay.startswith(b"SELECT pg_catalog.set_config("):
        return "set_config(..., false)"
    return _LABELS.get(command.kind, "this statement")


def refusal_message(command: Command, pool_mode: str) -> str:
    return (f"{label(command)} is not allowed in {pool_mode} pooling mode "
            "(session_state = reject)")


def refusal(command: Command, pool_mode: str) -> bytes:
    """SQL that fails in the refused statement's place with SQLSTATE 0A000: PostgreSQL
    answers it where the statement would have been answered, so replies stay in order and a
    transaction block aborts as it would for any error, and the statement itself never runs."""
    message = quote_literal(refusal_message(command, pool_mode)).encode()
    return (b"DO $pypool$BEGIN RAISE EXCEPTION USING MESSAGE = " + message
            + b", ERRCODE = '0A000'; END$pypool$")


def refused_message(kind: int, data: bytes, pos: int, end: int, sql: bytes) -> bytes:
    """The Query or Parse at data[pos:end] with `sql` for its text."""
    text_at = pos + 5 if kind == 81 else data.index(0, pos + 5, end) + 1
    text_end = data.index(0, text_at, end)
    body = data[pos + 5 : text_at] + sql + data[text_end:end]
    return bytes((kind,)) + (len(body) + 4).to_bytes(4, "big") + body


# --- one client's record ---------------------------------------------------------------------

# A marker among the names of a hidden SET (core/backend.py): the SET also syncs these.
SESSION_SETTINGS: Final = "pypool.session_state"


class ClientSession:
    """One client's session state in transaction mode: the settings that follow it (`sets`,
    name -> the statement that makes it, in the order it ran them) and what pins it to its
    server (`pins`, kind -> count). Commands are told as they are sent (`sent`) and take
    effect at the ReadyForQuery that ends their transaction (`ready`), as PostgreSQL makes
    them: a failed or rolled-back transaction's settings are dropped. A pin is taken as its
    statement is sent and never given back on a guess (a LISTEN in a transaction that failed
    keeps its client pinned until UNLISTEN, DISCARD ALL or the end): when unsure, pin."""

    def __init__(self, tracked: frozenset[bytes] = frozenset()) -> None:
        # Settings that follow their client already, as reported parameters (lower case;
        # pooling/params.py): never recorded here, or the undo would fight their SET.
        self.tracked = tracked
        self.sets: dict[bytes, bytes] = {}
        self.pins: dict[int, int] = {}
        # The channels LISTENed to, as a dict's keys: an empty dict is a quarter of an empty
        # set's size, and every idle client holds one.
        self.listening: dict[bytes, None] = {}
        self.pending: list[Command] = []  # sent, their transaction not over yet
        self.doomed = False  # an error in the open transaction: it will roll back
        self.errors_seen = 0  # the FrontendLedger's error count at the last ready()
        self.noticed = False  # the first-pin NOTICE went out

    def pinned(self) -> str:
        """Why the client keeps its server ("" when it need not)."""
        pins = self.pins
        if not pins:
            return ""
        return ", ".join(PIN_REASONS[kind] for kind in sorted(pins))

    def busy(self) -> bool:
        """Pinned, or changes whose transaction is not over: no one may be queued behind
        this client on its server (net/pipeline.py)."""
        return bool(self.pins or self.pending)

    def sent(self, commands: list[Command], server: dict[bytes, bytes | None] | None) -> bool:
        """Commands went to the server whose settings are `server` (None: not yet linked).
        Returns whether the client became pinned."""
        was = bool(self.pins)
        for command in commands:
            kind = command.kind
            if (kind == SET or kind == RESET) and command.name in self.tracked:
                continue
            if kind in PIN_REASONS:
                self.pins[kind] = self.pins.get(kind, 0) + 1
            elif kind == ROLLBACK_TO:
                # The settings sent since the savepoint may be undone: unsure which, drop
                # them all from the record (the server keeps them marked unsure).
                self.pending = [c for c in self.pending if c.kind != SET and c.kind != RESET]
                continue
            if (kind == SET or kind == RESET or kind == UNTRACKABLE) and server is not None:
                server[command.name] = None  # unsure until the transaction is over
            self.pending.append(command)
        return not was and bool(self.pins)

    def ready(self, status: int, errors: int, server: dict[bytes, bytes | None] | None) -> None:
        """The client's transaction status after a ReadyForQuery that left it owed nothing;
        `errors`: its ledger's count of ErrorResponses so far."""
        if errors != self.errors_seen:
            self.errors_seen = errors
            self.doomed = True
        if status != 73:
            return  # "T", "E": still inside a transaction block
        pending, self.pending = self.pending, []
        if self.doomed or any(command.kind == ROLLBACK for command in pending):
            self.doomed = False
            for command in pending:  # not transactional: an unlock that ran before the error
                if command.kind == UNLOCK_ALL:
                    self.pins.pop(LOCK, None)
            return
        sets = self.sets
        for command in pending:
            kind = command.kind
            name = command.name
            if kind == SET:
                sets.pop(name, None)
                sets[name] = command.replay
                if server is not None:
                    server[name] = command.replay
            elif kind == RESET:
                sets.pop(name, None)
                if server is not None:
                    server.pop(name, None)
            elif kind == RESET_ALL:
                for table in (sets, server):
                    if table is not None:
                        for key in [k for k in table if k not in (ROLE, SESSION_AUTHORIZATION)]:
                            del table[key]
            elif kind == DISCARD_ALL:
                sets.clear()
                if server is not None:
                    server.clear()
                self.listening.clear()
                for pin in (LISTEN, TEMP_TABLE, HOLD_CURSOR, LOCK, UNTRACKABLE):
                    self.pins.pop(pin, None)
            elif kind == DISCARD_TEMP:
                self.pins.pop(TEMP_TABLE, None)
            elif kind == LISTEN:
                self.listening[name] = None
            elif kind == UNLISTEN:
                self.listening.pop(name, None)
                if not self.listening:
                    self.pins.pop(LISTEN, None)
            elif kind == UNLISTEN_ALL:
                self.listening.clear()
                self.pins.pop(LISTEN, None)
            elif kind == CLOSE_ALL:
                self.pins.pop(HOLD_CURSOR, None)
            elif kind == UNLOCK:
                self._unpin(LOCK)
            elif kind == UNLOCK_ALL:
                self.pins.pop(LOCK, None)

    def _unpin(self, kind: int) -> None:
        count = self.pins.get(kind, 0) - 1
        if count > 0:
            self.pins[kind] = count
        else:
            self.pins.pop(kind, None)

    def on_server(self) -> dict[bytes, bytes | None]:
        """What a server holds once this client's settings are made there: its record, and
        the names its unfinished transaction sets (unsure until it is over)."""
        held: dict[bytes, bytes | None] = dict(self.sets)
        for command in self.pending:
            if command.kind == SET or command.kind == RESET or command.kind == UNTRACKABLE:
                held[command.name] = None
        return held
