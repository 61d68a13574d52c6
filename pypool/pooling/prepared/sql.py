"""SQL-level prepared statements: recognising a simple Query that is a PREPARE, EXECUTE,
DEALLOCATE or DISCARD, and where the statement name is in its text.

Only the first command of a Query is looked at, and only Queries whose first byte could
start one (or whitespace or a comment) are looked at all, so the hot path of other simple
queries pays one set lookup.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from .registry import Statement

# Only bytes that can start one of the four commands (or whitespace and comments before it)
# send a Query down the slow path.
SQL_FIRST: Final = frozenset(b"PpEeDd \t\r\n-/")
_SQL_COMMAND: Final = re.compile(
    rb"(?:\s|--[^\n]*(?:\n|$)|/\*.*?\*/)*(prepare|execute|deallocate|discard)\b", re.I | re.S
)
_SQL_NAME: Final = re.compile(
    rb'(?:\s|--[^\n]*(?:\n|$)|/\*.*?\*/)+("(?:[^"]|"")+"|[A-Za-z_\x80-\xff][A-Za-z0-9_$\x80-\xff]*)',
    re.S,
)


class SqlCommand:
    """A simple Query that starts with PREPARE, EXECUTE, DEALLOCATE or DISCARD."""

    __slots__ = ("verb", "name", "start", "end", "text", "stmt", "tags", "failed")

    def __init__(self, verb: bytes, name: bytes, start: int, end: int, text: bytes) -> None:
        self.verb = verb  # b"prepare", b"execute", b"deallocate" or b"discard"
        self.name = name  # folded statement name; b"" for ALL
        self.start = start  # where the name is in `text`, to rewrite it
        self.end = end
        self.text = text
        self.stmt: Statement | None = None  # DEALLOCATE of a protocol-level statement
        self.tags = 0  # CommandComplete messages seen
        self.failed = False


def parse_sql_command(text: bytes) -> SqlCommand | None:
    """The command and statement name of a Query text, if it is one the pooler tracks."""
    match = _SQL_COMMAND.match(text)
    if match is None:
        return None
    verb = match.group(1).lower()
    pos = match.end()
    if verb == b"discard":
        return SqlCommand(verb, b"", pos, pos, text)
    name_match = _SQL_NAME.match(text, pos)
    if name_match is None:
        return None
    raw = name_match.group(1)
    if verb == b"deallocate" and raw.lower() == b"prepare":
        following = _SQL_NAME.match(text, name_match.end())
        if following is not None:
            name_match = following
            raw = following.group(1)
    if raw.startswith(b'"'):
        name = raw[1:-1].replace(b'""', b'"')
    else:
        name = raw.lower()
        if verb == b"deallocate" and name == b"all":
            name = b""
    return SqlCommand(verb, name, name_match.start(1), name_match.end(1), text)
