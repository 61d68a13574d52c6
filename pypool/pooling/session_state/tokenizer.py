"""Reading SQL text the way PostgreSQL's lexer does, as far as session state needs it:
whitespace and comments (`--`, nested `/* */`), quoted identifiers, literals (E'' and
dollar-quoted ones included), the first few tokens of a statement and where it ends.

Works on bytes, never builds a parse tree, never decides what a statement means: that is
statements.py's.
"""

from __future__ import annotations

import re
from typing import Final


def byte_table(chars: bytes) -> tuple[bool, ...]:
    """A lookup by byte value: whether the byte is one of `chars`."""
    return tuple(byte in chars for byte in range(256))


_SPACE: Final = byte_table(b" \t\r\n\f\v")
WORD: Final = re.compile(rb"[A-Za-z_\x80-\xff][A-Za-z0-9_$\x80-\xff]*")
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
        word = WORD.match(text, pos)
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
