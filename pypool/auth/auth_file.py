"""The auth_file (userlist.txt): one `"user" "secret"` per line, PgBouncer's format.

A doubled quote inside quotes is a literal quote; anything after the second quoted string
is ignored, and so are lines that do not start with a quote (comments, blanks). The secret
is a plaintext password, `md5<hex>`, or a SCRAM verifier as pg_authid stores it.
"""

from __future__ import annotations

from pathlib import Path


def _quoted(line: str, pos: int) -> tuple[str, int] | None:
    """The quoted string starting at `pos` (which holds a quote) and the position after it."""
    if pos >= len(line) or line[pos] != '"':
        return None
    out = []
    pos += 1
    while pos < len(line):
        ch = line[pos]
        if ch == '"':
            if pos + 1 < len(line) and line[pos + 1] == '"':
                out.append('"')
                pos += 2
                continue
            return "".join(out), pos + 1
        out.append(ch)
        pos += 1
    return None


def parse_auth_file(text: str) -> dict[str, str]:
    users: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        first = _quoted(line, 0)
        if first is None:
            continue
        name, pos = first
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        second = _quoted(line, pos)
        if second is None:
            continue
        users[name] = second[0]
    return users


def load_auth_file(path: str) -> dict[str, str]:
    """The users of an auth_file. Raises OSError, or UnicodeDecodeError if it is not UTF-8."""
    return parse_auth_file(Path(path).read_text(encoding="utf-8"))


def format_auth_file(users: dict[str, str]) -> str:
    def q(text: str) -> str:
        return '"' + text.replace('"', '""') + '"'

    return "".join(f"{q(name)} {q(secret)}\n" for name, secret in users.items())
