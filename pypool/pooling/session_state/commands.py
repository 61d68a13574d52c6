"""What a statement does to a server's session, as the pooler records it: a `Command`, its
kind (SET, RESET, LISTEN, ...), the kinds that pin a client and the names they are shown by.

Plain data: the classifier (statements.py) makes Commands, the client's record (record.py)
takes them, the replay (replay.py) and the refusals (reject.py) read them.
"""

from __future__ import annotations

from typing import Final, NamedTuple

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
