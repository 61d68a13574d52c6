"""The StartupMessage's `options` parameter: `-c name=value` settings, as PgBouncer reads it.

libpq sends PGOPTIONS / `options=` as one string of command-line switches for the backend.
A pooler cannot pass switches to a server it shares, so PgBouncer (1.20+) reads the settings
in it, `-c name=value`, `-cname=value` and `--name=value`, and treats each as if it were a
startup parameter of its own; anything else in it is refused. As in PostgreSQL's
pg_split_opts, words are separated by white space and a backslash makes the next character
literal (`-c datestyle=German,\\ YMD`).
"""

from __future__ import annotations

ONLY_SETTINGS = ("unsupported options startup parameter: only '-c config=val' and "
                 "'--config=val' are allowed")


class OptionsError(ValueError):
    """`options` holds something other than settings; the message is PgBouncer's."""


def split_words(text: str) -> list[str]:
    """White-space separated words, a backslash escaping the character after it."""
    words: list[str] = []
    current: list[str] = []
    in_word = False
    pos = 0
    while pos < len(text):
        ch = text[pos]
        if ch == "\\" and pos + 1 < len(text):
            current.append(text[pos + 1])
            in_word = True
            pos += 2
            continue
        if ch.isspace():
            if in_word:
                words.append("".join(current))
                current, in_word = [], False
        else:
            current.append(ch)
            in_word = True
        pos += 1
    if in_word:
        words.append("".join(current))
    return words


def parse_options(text: str) -> list[tuple[str, str]]:
    """The (name, value) settings in an `options` string, in order. Raises OptionsError."""
    settings: list[tuple[str, str]] = []
    words = split_words(text)
    index = 0
    while index < len(words):
        word = words[index]
        if word == "-c":
            index += 1
            if index >= len(words):
                raise OptionsError(ONLY_SETTINGS)
            setting = words[index]
        elif word.startswith("--") or (word.startswith("-c") and len(word) > 2):
            setting = word[2:]
        else:
            raise OptionsError(ONLY_SETTINGS)
        name, equals, value = setting.partition("=")
        if not equals or not name:
            raise OptionsError(ONLY_SETTINGS)
        settings.append((name, value))
        index += 1
    return settings
