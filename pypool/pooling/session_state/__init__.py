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
- pin: state the pooler cannot move between servers (an advisory lock, a temporary table, a
  holdable cursor, a LOADed library, a SET it cannot replay exactly, and a LISTEN with
  listen_mode = pin) keeps the client on its server until it is gone (`ClientSession.pins`).
  With listen_mode = shared (the default) a LISTEN pins nothing: the pool's listening
  connection hears its channels (pooling/listening.py); the server it ran on is marked
  (`LISTENED`) and gets an UNLISTEN * before its next client.

Never touches a socket. What a statement does that its first keyword does not show (a SET in
a function, the second statement of a multi-statement Query) is not seen: a documented limit.

Where each part lives: commands.py (what a statement does: `Command` and its kinds),
tokenizer.py (reading SQL text), statements.py (`look`, `classify`), streamed.py (`look_start`
for a Query too large to hold whole, classified on its start), record.py (one client's
`ClientSession`), replay.py (`sync_statements`), reject.py (session_state = reject). Their
public names are imported from here.
"""

from __future__ import annotations

from .commands import (
    CLOSE_ALL,
    DISCARD_ALL,
    DISCARD_TEMP,
    HOLD_CURSOR,
    LISTEN,
    LOAD,
    LOCK,
    PIN_REASONS,
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
from .record import (
    LISTENED,
    SESSION_SETTINGS,
    ClientSession,
)
from .reject import (
    CREATES,
    label,
    refusal,
    refusal_message,
    refused_message,
)
from .replay import (
    quote_ident,
    sync_statements,
    undo,
)
from .statements import (
    CALLS,
    NO,
    READ,
    candidate,
    classify,
    look,
    set_config_statement,
)
from .streamed import (
    LONG_STATEMENT,
    QueryScan,
    first_word,
    look_start,
)
from .tokenizer import (
    single,
    skip_space,
    statement_end,
    tokens,
)

__all__ = [
    "CALLS", "CLOSE_ALL", "CREATES", "DISCARD_ALL", "DISCARD_TEMP", "HOLD_CURSOR", "LISTEN",
    "LISTENED", "LOAD", "LOCK", "NO", "PIN_REASONS", "READ", "RESET", "RESET_ALL", "ROLE",
    "ROLLBACK",
    "ROLLBACK_TO", "SESSION_AUTHORIZATION", "SESSION_SETTINGS", "SET", "TEMP_TABLE",
    "UNLISTEN", "UNLISTEN_ALL", "UNLOCK", "UNLOCK_ALL", "UNTRACKABLE", "ClientSession",
    "Command", "candidate", "classify", "label", "look", "quote_ident", "refusal",
    "refusal_message", "refused_message", "set_config_statement", "single", "skip_space",
    "statement_end",
    "sync_statements", "tokens", "undo",
    # a Query too large to hold whole (streamed.py)
    "LONG_STATEMENT", "QueryScan", "first_word", "look_start",
]
