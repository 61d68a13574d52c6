"""A simple Query too large to hold whole: classified on its start, the rest looked through as
it streams past (core/frontend.py streams a Query larger than STREAM_HEAD bytes).

`look_start` is `look` for a Query's text of which only the start is in hand. What the
statement does is decided by its first keyword(s) (statements.py), and these are nearly always
in the start; where the start cannot settle it, the answer is the safe one, a pin (UNTRACKABLE):
the client keeps its server, and what ran there is discarded before anyone else has it.
- The first keyword is one that changes session state (SET, RESET, DISCARD, LISTEN, CREATE,
  DECLARE, ...) or lies beyond the start (a comment longer than it): pinned, with what the
  start shows; a SET is never recorded to replay, since its text is not all there.
- A SELECT: its advisory lock calls in the start are classified as a whole statement's are,
  a set_config(..., false) pins (its last argument may go on beyond the start), and so does
  a function name after the last call seen whole; the rest is looked through (`QueryScan`)
  for `advisory` and `set_config` in any case, and a hit pins.
- Any Query: a PREPARE behind its first statement pins (as `look` does), and the rest is
  looked through for `prepare` in any case, which pins when seen (a word in a literal too:
  the pooler cannot tell, and pins rather than guess).

Never touches a socket, never holds more than a few bytes of the rest.
"""

from __future__ import annotations

from typing import Final

from .commands import SET, UNTRACKABLE, Command
from .statements import _SELECT_CALLS, CALLS, NO, READ, _first_look, _later_prepare, classify
from .tokenizer import WORD, skip_space

# The first keywords that change session state (statements.py `classify`): cut, they pin.
_SESSION_VERBS: Final = frozenset({b"set", b"reset", b"discard", b"listen", b"unlisten",
                                   b"load", b"create", b"declare", b"close", b"rollback",
                                   b"abort"})
# The name a pin for a statement too long to read whole is recorded under (never replayed:
# a pinned client's server is discarded when it leaves).
LONG_STATEMENT: Final = b"pypool.long_statement"
# Words looked for in the rest: any Query's, and a SELECT's besides.
_PREPARE: Final = (b"prepare",)
_SELECT_WORDS: Final = (b"prepare", b"advisory", b"set_config")


def look_start(data: bytes, start: int, end: int) -> tuple[list[Command], tuple[bytes, ...]]:
    """What a Query whose text starts with data[start:end] (the rest not in hand) changes,
    and the words that pin it when the rest holds them (lower case; () when it is pinned
    already)."""
    text = data[start:end]
    verdict = _first_look(text, 0, len(text))
    if verdict != NO or len(text) < 3:  # decided by its first word, once that is whole
        verdict = _first_word(text)
    found: list[Command] = []
    if verdict != NO:
        # A SET's replay is never trusted to a cut text: a set_config's last argument may
        # go on beyond the start (`false OR true`).
        found = [Command(UNTRACKABLE, c.name) if c.kind == SET else c for c in classify(text)]
    if verdict == READ:
        found.append(Command(UNTRACKABLE, LONG_STATEMENT))
        return found, ()
    if verdict == CALLS and _call_cut(text):
        found.append(Command(UNTRACKABLE, LONG_STATEMENT))
    if b";" in text and _later_prepare(text):
        found.append(Command(UNTRACKABLE, b"prepare"))
    return found, _SELECT_WORDS if verdict == CALLS else _PREPARE


def _call_cut(text: bytes) -> bool:
    """Whether the start of a SELECT names a function it looks for after the last call it
    found whole (`pg_advisory_lock` at its end, its `(` beyond it)."""
    last = 0
    for call in _SELECT_CALLS.finditer(text):
        last = call.end()
    rest = text[last:].lower()
    return b"advisory" in rest or b"set_config" in rest


def first_word(text: bytes) -> bytes:
    """The first word of the statement that `text` starts (after whitespace, comments and
    parentheses, as PostgreSQL reads them), lower case; b"" when `text` does not hold it
    whole."""
    pos = skip_space(text, 0)
    while pos < len(text) and text[pos] == 40:  # (SELECT ...)
        pos = skip_space(text, pos + 1)
    word = WORD.match(text, pos)
    if word is None or word.end() >= len(text):
        return b""
    return word.group().lower()


def _first_word(text: bytes) -> int:
    """For a text that starts with whitespace, a comment, a parenthesis or a session
    keyword's letters: CALLS for a SELECT, NO for a statement that changes no session state,
    READ for one that does, or whose first word the start does not hold whole."""
    first = first_word(text)
    if not first:
        return READ
    if first == b"select":
        return CALLS
    return READ if first in _SESSION_VERBS else NO


# The longest word looked for, less one: kept from one piece to the next.
_KEEP: Final = max(len(word) for word in _SELECT_WORDS) - 1


class QueryScan:
    """The rest of a streamed Query's text, looked through piece by piece for `words`."""

    __slots__ = ("words", "tail")

    def __init__(self, words: tuple[bytes, ...], before: bytes) -> None:
        self.words = words
        self.tail = before[-_KEEP:].lower()  # the text's last bytes so far, lower case

    def feed(self, piece: bytes) -> bool:
        """Whether the next piece of the text holds one of the words (across the last
        piece's end too)."""
        low = piece.lower()
        seam = self.tail + low[:_KEEP]
        for word in self.words:
            if word in seam or word in low:
                return True
        self.tail = (self.tail + low)[-_KEEP:] if len(low) < _KEEP else low[-_KEEP:]
        return False
