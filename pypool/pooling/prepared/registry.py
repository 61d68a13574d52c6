"""The pooler-wide registry of prepared statements and each client's names for them.

A `Statement` is one distinct Parse body (query text and parameter types) under one
server-side name, `PYPOOL_<n>`. The `Registry` hands them out, keyed on the body, and
forgets one when nobody refers to it any more: client maps, server LRUs and queued requests
each hold a reference. `ClientStatements` is one client's map from its own statement names
to Statements, and its SQL-level PREPAREs. Nothing here touches a socket.
"""

from __future__ import annotations

import re
from typing import Any, Final

from mypy_extensions import i64

PREFIX: Final = b"PYPOOL_"
# A name no server ever has (the registry counts from 1): what the pooler sends when it needs
# the server to fail, or to parse something and forget it.
PROBE: Final = PREFIX + b"0"


# Statements that cannot open, end or abort a transaction block (the extended protocol takes
# one statement per Parse). Anything else, comments before the keyword included, is assumed
# to be able to: see `Statement.neutral`.
_NEUTRAL_WORDS: Final = frozenset({b"select", b"insert", b"update", b"delete", b"with",
                                    b"values", b"table"})


def _word_code(word: bytes) -> i64:
    """A word (4 to 6 bytes) as `neutral_text` folds it: its bytes with bit 5 set, read as
    one big-endian int. A letter becomes lower case, and no other word character (a digit,
    "_") becomes a letter, so two words of letters have one code when they are the same word
    in any case."""
    return int.from_bytes(bytes(byte | 32 for byte in word), "big")


_NEUTRAL_CODES: Final = frozenset(_word_code(word) for word in _NEUTRAL_WORDS)
_SELECT_CODE: Final = _word_code(b"select")

# Read before the first word (whitespace as the regex \s has it, and parentheses), and the
# characters of a word (what the regex \b sees as one): tables of 0 and 1 by byte, as bytes
# (indexed, they give an int; a tuple's bools come boxed).
_LEAD: Final = bytes(byte in b" \t\n\r\f\v(" for byte in range(256))
_WORD_CHAR: Final = bytes(chr(byte).isascii() and (chr(byte).isalnum() or byte == 95)
                          for byte in range(256))


# Words of a statement that may prepare or deallocate statements where the pooler cannot see
# it (`DO $$ BEGIN EXECUTE 'DEALLOCATE ALL'; END $$`, `SELECT 1; DEALLOCATE x`): looked for
# only in texts that are not neutral or not recognised, once per Statement.
_TOUCHES: Final = re.compile(rb"\b(?:deallocate|prepare|discard)\b", re.I)


def touches_text(data: bytes, start: int, end: int) -> bool:
    """Whether the text at data[start:end] names a command that changes the server's
    prepared statements (see `ServerStatements.distrust`)."""
    return _TOUCHES.search(data, start, end) is not None


def neutral_text(data: bytes, start: int) -> bool:
    """Whether the statement text at data[start:] starts as a neutral one (see `Statement`):
    whitespace and parentheses, then one of the neutral words, in any case, as a whole word.
    A loop compiled code runs without the regex engine (every unnamed Parse passes here)."""
    n = len(data)
    pos = start
    while pos < n and _LEAD[data[pos]]:
        pos += 1
    # The word is read once: each byte is tested and folded into its code (`_word_code`)
    # as it comes, with machine shifts (i64, as protocol/framing.py's be32) and no bytes
    # object made; a seventh word byte makes it no neutral word.
    code: i64 = 0
    end = pos
    while end < n:
        byte = data[end]
        if not _WORD_CHAR[byte]:
            break
        if end - pos == 6:
            return False
        code = (code << 8) | (i64(byte) | 32)
        end += 1
    if end - pos < 4:
        return False
    # SELECT, nearly every time, without the set: its lookup boxes the code, which is
    # wider than the ints Python keeps made.
    return code == _SELECT_CODE or code in _NEUTRAL_CODES


def neutral_query(data: bytes, start: int, end: int) -> bool:
    """Whether the simple Query text data[start:end] is one neutral statement (as
    `Statement.neutral`): no semicolon but trailing ones, even inside a string literal.
    Never a text not all in `data` (a Query streamed to its server: core/frontend.py)."""
    if end > len(data) or not neutral_text(data, start):
        return False
    semicolon = data.find(b";", start, end)
    return semicolon < 0 or not data[semicolon:end].strip(b"; \t\r\n")


class Statement:
    """One distinct Parse body and the name servers know it by."""

    __slots__ = ("key", "name", "refs", "neutral", "touches")

    def __init__(self, key: bytes, name: bytes) -> None:
        self.key = key  # the Parse body after the statement name: query, NUL, types
        self.name = name  # server-side name, b"PYPOOL_<n>"
        self.refs = 0  # client map entries + server LRU entries + queue entries owning one
        # Whether executing it leaves the transaction status as it was: a transaction that
        # begins with it (implicitly, at its Bind) is over at the Sync (see net/pipeline).
        self.neutral = neutral_text(key, 0)
        # Whether it may drop or make prepared statements behind the pooler's back (a DO
        # block that runs DEALLOCATE): the server's cache is not trusted after it runs.
        self.touches = not self.neutral and touches_text(key, 0, len(key))

    def __repr__(self) -> str:
        return f"<Statement {self.name.decode()} refs={self.refs}>"

    def parse_message(self) -> bytes:
        """The Parse that prepares this statement on a server under its pooler name."""
        body = self.name + b"\x00" + self.key
        return b"P" + (len(body) + 4).to_bytes(4, "big") + body


class Registry:
    """The pooler-wide Statements, keyed on the Parse body; freed when nobody refers to one."""

    def __init__(self, prefix: bytes = PREFIX) -> None:
        self.statements: dict[bytes, Statement] = {}
        self.prefix = prefix
        self._next = 0

    def __len__(self) -> int:
        return len(self.statements)

    def acquire(self, key: bytes) -> Statement:
        stmt = self.statements.get(key)
        if stmt is None:
            self._next += 1
            stmt = Statement(key, self.prefix + str(self._next).encode())
            self.statements[key] = stmt
        stmt.refs += 1
        return stmt

    def hold(self, stmt: Statement) -> None:
        """One more reference to a Statement already held by someone."""
        stmt.refs += 1
        if self.statements.get(stmt.key) is None:
            self.statements[stmt.key] = stmt

    def release(self, stmt: Statement) -> None:
        stmt.refs -= 1
        if stmt.refs <= 0 and self.statements.get(stmt.key) is stmt:
            del self.statements[stmt.key]


class ClientStatements:
    """One client's prepared statements, as the client names them."""

    __slots__ = ("names", "sql", "registry", "cap")

    def __init__(self, registry: Registry, cap: int) -> None:
        self.names: dict[bytes, Statement] = {}  # protocol-level: client name -> Statement
        # SQL-level: folded name -> its PREPARE query text. None until it has one: every link
        # asks whether it has any (ServerStatements.attach), and most clients never do.
        self.sql: dict[bytes, bytes] | None = None
        self.registry = registry
        self.cap = cap  # max_client_prepared_statements; 0 means no cap

    def __len__(self) -> int:
        return len(self.names) + (len(self.sql) if self.sql else 0)

    def has_sql(self, name: bytes) -> bool:
        """Whether it has an SQL-level statement `name`."""
        return self.sql is not None and name in self.sql

    def add_sql(self, name: bytes, text: bytes) -> None:
        """Its PREPARE of `name` as `text` succeeded."""
        if self.sql is None:
            self.sql = {name: text}
        else:
            self.sql[name] = text

    def drop_sql(self, name: bytes) -> None:
        """Its SQL-level statement `name` is gone, if it had one."""
        if self.sql is not None:
            self.sql.pop(name, None)

    def close(self) -> None:
        """The client is gone: give back its references."""
        release = self.registry.release
        for stmt in self.names.values():
            release(stmt)
        self.names.clear()
        self.sql = None


def totals(clients: Any, servers: Any) -> dict[str, int]:
    """Statement counts for reporting: objects with a `statements` attribute each."""
    client_total = sum(len(c.statements) for c in clients if c.statements is not None)
    server_total = sum(len(s.statements.cache.lru) for s in servers if s.statements is not None)
    return {"client_statements": client_total, "server_statements": server_total}
