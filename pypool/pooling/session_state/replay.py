"""Making a client's settings on a server: the statement that undoes one setting, and the
SQL that turns what a server holds into what its next client made (`sync_statements`).

Builds SQL text only; when it is sent (before the client's own messages, as a hidden
query) is the network layer's.
"""

from __future__ import annotations

import re

from .commands import ROLE, SESSION_AUTHORIZATION
from .record import LISTENED


def quote_ident(name: bytes) -> bytes:
    """A setting's name as SQL: bare when it is a plain (dotted) lower-case name."""
    if re.fullmatch(rb"[a-z_][a-z0-9_$]*(?:\.[a-z_][a-z0-9_$]*)?", name):
        return name
    return b'"' + name.replace(b'"', b'""') + b'"'


def undo(name: bytes) -> bytes:
    """The statement that gives setting `name` back its session default."""
    if name == LISTENED:
        return b"UNLISTEN *"  # a shared LISTEN ran there (record.py)
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
