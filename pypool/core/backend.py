"""The backend ledger: what a server has been asked by the pooler itself.

Theory of operation. Two kinds of requests reach a server. The linked client's are counted by
its FrontendLedger (core/ledger.py). The pooler's own are hidden from every client: the reset
query and connect_query (HIDDEN_PLAIN), server_check_query before a client's requests
(HIDDEN_CHECK) and the SET of a client's session parameters (HIDDEN_SET). Each is one simple
Query, answered by one ReadyForQuery; `hidden` lists their purposes oldest first, and every
reply up to a hidden ReadyForQuery belongs to the oldest one. Its ErrorResponse is kept and
judged at that ReadyForQuery, so a failing connect_query is never taken for the SET behind it.

`hidden_message` returns what the connection must do, as a plain value: nothing yet, the check
failed, the parameters are applied (the check passed and no SET was needed, or the SET
succeeded), or the SET failed. What a client's ReadyForQuery means for its server is its
link's (core/link.py `ready_event`).

Never decides on a guess: a hidden reply is matched to its own query, and a server whose reply
count is in doubt (`FrontendLedger.doubtful`) is closed, not handed on.
"""

from __future__ import annotations

from typing import Final

# What a pooler-issued query is for.
HIDDEN_PLAIN: Final = 0  # reset query, connect_query: replies swallowed, errors logged
HIDDEN_CHECK: Final = 1  # server_check_query before a client's requests
HIDDEN_SET: Final = 2  # the client's session parameters before its requests

# What a hidden reply means (BackendLedger.hidden_message).
NOTHING: Final = 0  # keep reading
CHECK_FAILED: Final = 1  # server_check_query failed: the server must not serve the client
APPLIED: Final = 2  # the client's requests may go now (check passed, SET done or not needed)
SET_FAILED: Final = 3  # the SET failed: the client must not run under the old values
FAILED: Final = 4  # a HIDDEN_PLAIN query failed (logged; the server carries on)

class BackendLedger:
    """The pooler's own queries in flight on one server, and the wait they impose."""

    def __init__(self) -> None:
        self.hidden: list[int] = []  # purposes, oldest first: one per hidden ReadyForQuery
        self.error: dict[str, str] | None = None  # the oldest hidden query's error, if any
        self.setting: list[str] = []  # the parameters the SET in flight changes
        self.checking = False  # server_check_query's reply is still to come
        self.last_error: dict[str, str] = {}  # the error behind CHECK_FAILED / SET_FAILED
        self.applied: list[str] = []  # the parameters an APPLIED SET changed

    def __len__(self) -> int:
        return len(self.hidden)

    def query(self, purpose: int) -> None:
        """A hidden query was sent."""
        self.hidden.append(purpose)
        if purpose == HIDDEN_CHECK:
            self.checking = True

    def parameters(self, names: list[str]) -> None:
        """A HIDDEN_SET of these parameters was sent."""
        self.setting = names
        self.query(HIDDEN_SET)

    def failed(self, fields: dict[str, str]) -> None:
        """An ErrorResponse for the oldest hidden query."""
        self.error = fields

    def ready(self) -> int:
        """The oldest hidden query's ReadyForQuery: what it means (module docstring)."""
        purpose = self.hidden.pop(0) if self.hidden else HIDDEN_PLAIN
        error, self.error = self.error, None
        if purpose == HIDDEN_CHECK:
            self.checking = False
            if error is not None:
                self.setting = []
                self.last_error = error
                return CHECK_FAILED
            if self.setting:
                return NOTHING  # the SET's reply is still to come
            self.applied = []
            return APPLIED
        if purpose == HIDDEN_SET and self.setting:
            names, self.setting = self.setting, []
            if error is not None:
                self.last_error = error
                return SET_FAILED
            self.applied = names
            return APPLIED
        return FAILED if error is not None else NOTHING

    def reset(self) -> None:
        self.hidden.clear()
        self.error = None
        self.setting = []
        self.checking = False
