"""The life of a client and of a server connection, as (state, event) -> state tables.

Each connection holds one state; it changes only through `transition(state, event)`, which
looks the pair up in its table and raises `IllegalTransition` for a pair the table does not
list: a transition nobody planned is a bug to see at once, not a flag to fall through.

Client states (one line each):
  STARTUP   reading the startup packet (SSLRequest and GSSENCRequest are answered 'N' here)
  AUTH      the password exchange is in progress (SCRAM, md5 or cleartext)
  WELCOME   authenticated; waits for its pool to know the server's parameters
  IDLE      logged in, holds no server
  WAITING   sent a request and waits in its pool's queue for a server
  ACTIVE    linked to a server (or queued on one behind another client: net/pipeline.py)
  CLOSED    gone; never reused

After WELCOMED, IDLE, WAITING and ACTIVE are what the client's link shows (core/link.py, whose
table is the one that moves a logged-in client between them): this table takes a client to
IDLE, and out of any state to CLOSED.

Server states:
  CONNECTING  TCP connect in progress
  LOGIN       StartupMessage sent; authenticating, collecting ParameterStatus/BackendKeyData
  IDLE        logged in and free (in its pool's idle stack, or being canceled)
  ACTIVE      linked to a client
  CLOSED      gone; never reused
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Final


class IllegalTransition(Exception):
    """A (state, event) pair that no table lists: a bug in the pooler, never the peer's."""


class ClientState(Enum):
    STARTUP = "startup"
    AUTH = "auth"
    WELCOME = "welcome"
    IDLE = "idle"
    WAITING = "waiting"
    ACTIVE = "active"
    CLOSED = "closed"


class ClientEvent:
    """What can happen to a client. Plain numbered constants, not an Enum: a transition
    runs several times per transaction, and compiled, a Final int costs nothing to read."""

    AUTH_REQUESTED: Final = 0  # the pooler asked for a password
    AUTHENTICATED: Final = 1  # the password checked out (or none was needed)
    WELCOMED: Final = 2  # AuthenticationOk ... ReadyForQuery sent
    CLOSED: Final = 3  # the connection is gone, for whatever reason
    NAMES: Final = ("AUTH_REQUESTED", "AUTHENTICATED", "WELCOMED", "CLOSED")


class ServerState(Enum):
    CONNECTING = "connecting"
    LOGIN = "login"
    IDLE = "idle"
    ACTIVE = "active"
    CLOSED = "closed"


class ServerEvent:
    """What can happen to a server connection (numbered, as ClientEvent)."""

    CONNECTED: Final = 0  # TCP is up, the StartupMessage goes out
    FREED: Final = 1  # logged in, or its client let it go
    LINKED: Final = 2  # handed to a client
    CLOSED: Final = 3  # the connection is gone
    NAMES: Final = ("CONNECTED", "FREED", "LINKED", "CLOSED")


CLIENT_TRANSITIONS: dict[tuple[ClientState, int], ClientState] = {
    (ClientState.STARTUP, ClientEvent.AUTH_REQUESTED): ClientState.AUTH,
    (ClientState.STARTUP, ClientEvent.AUTHENTICATED): ClientState.WELCOME,  # trust
    (ClientState.AUTH, ClientEvent.AUTHENTICATED): ClientState.WELCOME,
    (ClientState.WELCOME, ClientEvent.WELCOMED): ClientState.IDLE,
    **{(state, ClientEvent.CLOSED): ClientState.CLOSED
       for state in ClientState if state is not ClientState.CLOSED},
}

SERVER_TRANSITIONS: dict[tuple[ServerState, int], ServerState] = {
    (ServerState.CONNECTING, ServerEvent.CONNECTED): ServerState.LOGIN,
    (ServerState.LOGIN, ServerEvent.FREED): ServerState.IDLE,
    (ServerState.IDLE, ServerEvent.LINKED): ServerState.ACTIVE,
    (ServerState.ACTIVE, ServerEvent.FREED): ServerState.IDLE,
    **{(state, ServerEvent.CLOSED): ServerState.CLOSED
       for state in ServerState if state is not ServerState.CLOSED},
}


def _index(table: dict, states: type[Enum], events: int) -> None:
    """The same table as a tuple on each state, indexed by event (None: not allowed).
    Transitions run several times per transaction, and a tuple index off an attribute is
    the cheapest lookup there is, compiled or not; the dict above stays the definition."""
    for state in states:
        state.after = tuple(  # type: ignore[attr-defined]
            table.get((state, event)) for event in range(events))


_index(CLIENT_TRANSITIONS, ClientState, len(ClientEvent.NAMES))
_index(SERVER_TRANSITIONS, ServerState, len(ServerEvent.NAMES))


def client_transition(state: ClientState, event: int) -> ClientState:
    target: ClientState | None = state.after[event]  # type: ignore[attr-defined]
    if target is None:
        raise IllegalTransition(
            f"client: no transition from {state.name} on {ClientEvent.NAMES[event]}")
    return target


def server_transition(state: ServerState, event: int) -> ServerState:
    target: ServerState | None = state.after[event]  # type: ignore[attr-defined]
    if target is None:
        raise IllegalTransition(
            f"server: no transition from {state.name} on {ServerEvent.NAMES[event]}")
    return target


# A server moves twice per transaction (LINKED, FREED): net/server.py keeps the row of its
# state beside it and walks these, as core/link.py's Link does, rather than read a row off
# the enum member (a generic attribute lookup, compiled or not). Each entry of a row (None:
# not allowed) is the target state and its own row.
ServerTarget = tuple[ServerState, list[Any]]
SERVER_ROWS: Final[dict[ServerState, list[ServerTarget | None]]] = {
    state: [None] * len(ServerEvent.NAMES) for state in ServerState}
for (_state, _event), _target in SERVER_TRANSITIONS.items():
    SERVER_ROWS[_state][_event] = (_target, SERVER_ROWS[_target])
