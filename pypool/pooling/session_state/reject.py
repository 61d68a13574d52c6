"""session_state = reject: the statements refused in transaction mode, what they are called
in the error and the log, and the SQL that fails in the refused statement's place.

Builds messages only; which statements to refuse is the request reader's
(core/frontend.py), with the Commands statements.py finds.
"""

from __future__ import annotations

from typing import Final

from ..params import quote_literal
from .commands import (
    HOLD_CURSOR,
    LISTEN,
    LOAD,
    LOCK,
    ROLE,
    SESSION_AUTHORIZATION,
    SET,
    TEMP_TABLE,
    UNTRACKABLE,
    Command,
)

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
