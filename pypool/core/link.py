"""The life of a client's link to a server, as one (state, event) -> (state, actions) table.

Theory of operation. After its login a client is, at every moment, in one LinkState:

  IDLE     holds no server: between transactions (SHOW CLIENTS: idle)
  WAITING  sent something that needs a server; queued in its pool (waiting)
  SETTING  linked; server_check_query and the SET of its parameters run first, and its
           requests wait until they have answered (active)
  ACTIVE   linked; its requests go to the server and the replies come back (active)
  IN_LINE  its request is queued on a busy server behind another client's (pipelining,
           net/pipeline.py); its turn comes at the ReadyForQuery of the one ahead (active)
  CLOSED   gone; the replies still owed to it are dropped as they go by

Everything that happens to a link is a LinkEvent. `Link.on(event)` looks the pair up in
LINK_TABLE and returns the actions (bits, below) the pooler must carry out, in the order the
bits are listed; a pair the table does not list raises IllegalTransition: a bug in the
pooler, never the peer's. The pooler (pooler/linking.py, pooler/transactions.py,
net/pipeline.py) carries the actions out; it never sets a link's state itself. The link's
two ends (`client.server`, `server.client`) and the hold on what a client sends
(`reader.blocked`: HOLD) are written by net/link_ends.py alone, in named steps (link,
unlink, line_up, take_turn, hold, unhold) taken where the events and actions here say.
GONE ends the client's own state too (ClientEvent.CLOSED, core/states.py): one event.

The ReadyForQuery verdict is here too. Each ReadyForQuery forwarded to a linked client that
leaves it owed nothing (its FrontendLedger, core/ledger.py, says; until then the server
stays and nothing happens to the link) is turned into one READY_* event by `ready_event`,
from the transaction status, the pool mode, whether others are queued
behind it, and its session state: a client whose session state cannot follow it (a LISTEN, a
temporary table: pooling/session_state.py) keeps its server as in session mode. Only
READY_RELEASE gives the server back: never with replies owed, never mid-transaction.

A link may be marked `last` (SIGINT's shutdown, PgBouncer's: running transactions finish):
its next release also ends the client (READY_RELEASE_LAST: RELEASE and CLOSE_CLIENT). A
drain (DRAIN: `SHUTDOWN DRAIN`, or SIGINT with `shutdown_drain = 1`) marks it `draining`
too: its next transaction boundary ends it even in session mode or when pinned.

docs/link.md draws this table; tests/core/test_link.py fails when the two disagree.
Never imports asyncio and never touches a connection: it says, the pooler does.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Final

from ..protocol import messages as m
from .ledger import FrontendLedger
from .states import ClientState, IllegalTransition


class LinkState(Enum):
    IDLE = "idle"
    WAITING = "waiting"
    SETTING = "setting"
    ACTIVE = "active"
    IN_LINE = "in_line"
    CLOSED = "closed"


class LinkEvent:
    """What can happen to a link. Numbered constants (a Final int costs nothing compiled);
    NAMES spells them for errors and the diagram."""

    QUEUED: Final = 0  # needs a server, none is free: waits in its pool
    LINKED: Final = 1  # given a server that needs no check and no SET
    LINKED_TO_SET: Final = 2  # given a server that must pass a check or take a SET first
    APPLIED: Final = 3  # the check passed and the SET took: its requests go now
    CHECK_FAILED: Final = 4  # server_check_query failed: that server goes, ask for another
    LINED_UP: Final = 5  # queued on a busy server behind another client
    TURN: Final = 6  # the client ahead in its line is done: the server is its now
    READY_RELEASE: Final = 7  # transaction over, nothing owed: the server goes back
    READY_RELEASE_LAST: Final = 8  # the same, and the client was marked last: it ends too
    READY_IN_TRANSACTION: Final = 9  # inside a transaction block: keep the server
    READY_SESSION: Final = 10  # session mode: a transaction ended, the link stays
    READY_PINNED: Final = 11  # transaction over, its session state pins the server
    READY_DOUBT: Final = 12  # the count of replies owed may be wrong: close the server
    READY_OPEN: Final = 13  # a transaction is open where none may be: close (rolls back)
    READY_REFUSED: Final = 14  # statement mode: a transaction block was opened: fail it
    SHUTDOWN: Final = 15  # the pooler is shutting down: end the client at its release
    GONE: Final = 16  # the client's connection is gone
    DRAIN: Final = 17  # a drain: end it at its next transaction boundary, whatever keeps it
    NAMES: Final = ("QUEUED", "LINKED", "LINKED_TO_SET", "APPLIED", "CHECK_FAILED",
                    "LINED_UP", "TURN", "READY_RELEASE", "READY_RELEASE_LAST",
                    "READY_IN_TRANSACTION", "READY_SESSION", "READY_PINNED", "READY_DOUBT",
                    "READY_OPEN", "READY_REFUSED", "SHUTDOWN", "GONE", "DRAIN")


# What the pooler must do (bits of Link.on's result), in this order.
HOLD: Final = 1  # the client's requests wait for the check's and the SET's replies
SEND: Final = 2  # what the client sent while it had no server goes to the server now
UNLINK: Final = 4  # the client and the server part (CHECK_FAILED, whose server then goes)
RELEASE: Final = 8  # count the transaction and give the server back (linking.release)
CLOSE_SERVER: Final = 16  # close the server (a rollback, when a transaction is open)
ASK_AGAIN: Final = 32  # ask for another server
COUNT_XACT: Final = 64  # a transaction ended on a server the client keeps
NOTICE_PINNED: Final = 128  # tell the client, once, that it keeps its server
REFUSE: Final = 256  # statement mode's error for a transaction block
CLOSE_CLIENT: Final = 512  # end the client: its transaction is over (shutdown)
MARK_LAST: Final = 1024  # remember to end the client at its next release
MARK_DRAIN: Final = 2048  # and release it at its next boundary, session mode or pinned too
ACTION_NAMES: Final = ("HOLD", "SEND", "UNLINK", "RELEASE", "CLOSE_SERVER", "ASK_AGAIN",
                       "COUNT_XACT", "NOTICE_PINNED", "REFUSE", "CLOSE_CLIENT", "MARK_LAST",
                       "MARK_DRAIN")

E = LinkEvent
S = LinkState
_LINKED_STATES: Final = (S.SETTING, S.ACTIVE, S.IN_LINE)
# What a ReadyForQuery does, the same whether the client is still there or has left (its
# replies then go by, dropped, and the server is judged all the same).
_READY: Final = {
    E.READY_RELEASE: RELEASE,
    E.READY_IN_TRANSACTION: 0,
    E.READY_SESSION: COUNT_XACT,
    E.READY_DOUBT: CLOSE_SERVER,
    E.READY_OPEN: CLOSE_SERVER,
}

LINK_TABLE: dict[tuple[LinkState, int], tuple[LinkState, int]] = {
    (S.IDLE, E.QUEUED): (S.WAITING, 0),
    (S.IDLE, E.LINKED): (S.ACTIVE, SEND),
    (S.IDLE, E.LINKED_TO_SET): (S.SETTING, HOLD),
    (S.IDLE, E.LINED_UP): (S.IN_LINE, SEND),
    (S.WAITING, E.LINKED): (S.ACTIVE, SEND),
    (S.WAITING, E.LINKED_TO_SET): (S.SETTING, HOLD),
    (S.WAITING, E.LINED_UP): (S.IN_LINE, SEND),
    (S.SETTING, E.APPLIED): (S.ACTIVE, SEND),
    (S.SETTING, E.CHECK_FAILED): (S.IDLE, UNLINK | CLOSE_SERVER | ASK_AGAIN),
    (S.IN_LINE, E.TURN): (S.ACTIVE, 0),
    **{(S.ACTIVE, event): (S.ACTIVE, actions) for event, actions in _READY.items()},
    (S.ACTIVE, E.READY_RELEASE): (S.IDLE, RELEASE),
    (S.ACTIVE, E.READY_RELEASE_LAST): (S.IDLE, RELEASE | CLOSE_CLIENT),
    (S.ACTIVE, E.READY_PINNED): (S.ACTIVE, COUNT_XACT | NOTICE_PINNED),
    (S.ACTIVE, E.READY_REFUSED): (S.ACTIVE, REFUSE),
    # A client that left in a line (or with its server's replies still coming) is still
    # judged at each ReadyForQuery of its own, so the line moves on or the server closes.
    **{(S.CLOSED, event): (S.CLOSED, actions) for event, actions in _READY.items()
       if event != E.READY_IN_TRANSACTION},  # ready_event says READY_OPEN for it instead
    (S.CLOSED, E.READY_RELEASE_LAST): (S.CLOSED, RELEASE),
    (S.CLOSED, E.TURN): (S.CLOSED, 0),
    **{(state, E.SHUTDOWN): (state, MARK_LAST) for state in _LINKED_STATES},
    **{(state, E.DRAIN): (state, MARK_LAST | MARK_DRAIN) for state in _LINKED_STATES},
    **{(state, E.GONE): (S.CLOSED, 0) for state in LinkState if state is not S.CLOSED},
}

# What each link state shows as in SHOW CLIENTS and the pool's counters.
SHOWN: Final = {
    S.IDLE: ClientState.IDLE,
    S.WAITING: ClientState.WAITING,
    S.SETTING: ClientState.ACTIVE,
    S.ACTIVE: ClientState.ACTIVE,
    S.IN_LINE: ClientState.ACTIVE,
    S.CLOSED: ClientState.CLOSED,
}

# The table as rows the link walks without a lookup: each state's row is a list indexed
# by event, and each entry (None: not allowed) carries the target state, the actions, the
# target's own row and what it shows as. A row read off an enum member would be a
# generic attribute lookup each time, compiled or not (bench/README.md); the dict above
# stays the definition.
Target = tuple[LinkState, int, list[Any], ClientState]
ROWS: Final[dict[LinkState, list[Target | None]]] = {
    state: [None] * len(E.NAMES) for state in LinkState}
for (_state, _event), (_target, _actions) in LINK_TABLE.items():
    ROWS[_state][_event] = (_target, _actions, ROWS[_target], SHOWN[_target])


class Link:
    """One client's link: its state, what that shows as (SHOWN), and whether its next
    release ends it. Only `on` moves it (a test may start it in any `state`)."""

    def __init__(self, state: LinkState = LinkState.IDLE) -> None:
        self.state = state
        self.shown = SHOWN[state]
        self._row = ROWS[state]  # the table's row for `state`
        self.last = False  # end the client at its next release (SIGINT's shutdown)
        self.draining = False  # and end it at its next boundary even if it keeps its server

    def on(self, event: int) -> int:
        """Move to the state the table gives for `event`; return the actions to carry out."""
        target = self._row[event]
        if target is None:
            raise IllegalTransition(
                f"link: no transition from {self.state.name} on {E.NAMES[event]}")
        self.state, actions, self._row, self.shown = target
        if actions & MARK_LAST:
            self.last = True
            if actions & MARK_DRAIN:
                self.draining = True
        return actions

    def linked(self) -> bool:
        """Whether it holds a server, or a place in a server's line."""
        state = self.state
        return state is S.ACTIVE or state is S.SETTING or state is S.IN_LINE


def ready_event(ledger: FrontendLedger, status: int, mode: str, link: Link, chained: bool,
                queued: int = 0, pinned: bool = False) -> int:
    """The READY_* event a ReadyForQuery with `status`, forwarded to the client, is, once
    its ledger has counted it and is owed nothing more (`FrontendLedger.ready()`: until then
    the server stays, and no event happens).
    `chained`: other clients are queued behind it on its server (net/pipeline.py).
    `queued`: the requests still in the server's prepared-statement queue. `pinned`: its
    session state keeps the server (pooling/session_state.py). The ledger and that queue are
    fed from the same messages (core/frontend.py counts a request in both or neither); should
    they ever disagree when the ledger is owed nothing, the server is closed, never handed
    on with replies to come."""
    if ledger.doubtful or (queued and not chained):
        return LinkEvent.READY_DOUBT
    if status == m.TX_IDLE:
        if link.draining and link.state is not LinkState.CLOSED:
            return LinkEvent.READY_RELEASE_LAST  # a drain ends it here, whatever kept its server
        if mode == "session":
            return LinkEvent.READY_SESSION
        if pinned and link.state is not LinkState.CLOSED:
            return LinkEvent.READY_PINNED
        return LinkEvent.READY_RELEASE_LAST if link.last else LinkEvent.READY_RELEASE
    if link.state is LinkState.CLOSED or chained:
        # A client that left inside a transaction (its replies were still to come behind a
        # pipeline), or a pipelined transaction that did not end at its Sync: closing the
        # server rolls the transaction back.
        return LinkEvent.READY_OPEN
    if mode == "statement":
        return LinkEvent.READY_REFUSED
    return LinkEvent.READY_IN_TRANSACTION


def action_names(actions: int) -> list[str]:
    """The names of the bits in `actions`, in the order they are carried out."""
    return [name for bit, name in enumerate(ACTION_NAMES) if actions & (1 << bit)]


def diagram() -> str:
    """The table as a Mermaid state diagram (docs/link.md holds it; a test compares)."""
    lines = ["stateDiagram-v2", "    [*] --> IDLE: WELCOMED (core/states.py)"]
    for (state, event), (target, actions) in LINK_TABLE.items():
        label = E.NAMES[event]
        if actions:
            label += " / " + ", ".join(action_names(actions))
        lines.append(f"    {state.name} --> {target.name}: {label}")
    lines.append("    CLOSED --> [*]")
    return "\n".join(lines) + "\n"
