"""The (state, event) -> state tables: what is listed moves, everything else raises."""

from __future__ import annotations

import itertools

import pytest

from pypool.core.states import (
    CLIENT_TRANSITIONS,
    SERVER_TRANSITIONS,
    ClientEvent,
    ClientState,
    IllegalTransition,
    ServerEvent,
    ServerState,
    client_transition,
    server_transition,
)

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(("state", "event"),
                         list(itertools.product(ClientState, range(len(ClientEvent.NAMES)))),
                         ids=lambda x: x.name if isinstance(x, ClientState) else
                         ClientEvent.NAMES[x])
def test_client_pairs(state: ClientState, event: int) -> None:
    if (state, event) in CLIENT_TRANSITIONS:
        assert client_transition(state, event) is CLIENT_TRANSITIONS[state, event]
    else:
        with pytest.raises(IllegalTransition,
                           match=f"{state.name} on {ClientEvent.NAMES[event]}"):
            client_transition(state, event)


@pytest.mark.parametrize(("state", "event"),
                         list(itertools.product(ServerState, range(len(ServerEvent.NAMES)))),
                         ids=lambda x: x.name if isinstance(x, ServerState) else
                         ServerEvent.NAMES[x])
def test_server_pairs(state: ServerState, event: int) -> None:
    if (state, event) in SERVER_TRANSITIONS:
        assert server_transition(state, event) is SERVER_TRANSITIONS[state, event]
    else:
        with pytest.raises(IllegalTransition):
            server_transition(state, event)


def test_a_transaction_in_transaction_mode() -> None:
    """Login, then close: the path every client takes (its transactions between are its
    link's: tests/core/test_link.py)."""
    state = ClientState.STARTUP
    for event in (ClientEvent.AUTH_REQUESTED, ClientEvent.AUTHENTICATED, ClientEvent.WELCOMED):
        state = client_transition(state, event)
    assert state is ClientState.IDLE
    assert client_transition(state, ClientEvent.CLOSED) is ClientState.CLOSED


def test_closed_is_final_and_every_other_state_can_close() -> None:
    for state in ClientState:
        if state is ClientState.CLOSED:
            assert all((state, e) not in CLIENT_TRANSITIONS
                       for e in range(len(ClientEvent.NAMES)))
        else:
            assert client_transition(state, ClientEvent.CLOSED) is ClientState.CLOSED
    for sstate in ServerState:
        if sstate is ServerState.CLOSED:
            assert all((sstate, e) not in SERVER_TRANSITIONS
                       for e in range(len(ServerEvent.NAMES)))
        else:
            assert server_transition(sstate, ServerEvent.CLOSED) is ServerState.CLOSED


def test_no_state_is_assigned_around_the_table() -> None:
    """Outside a constructor, the net layer changes a connection's state only through its
    on() method (which uses the table)."""
    import pathlib
    import re

    net = pathlib.Path(__file__).resolve().parents[2] / "pypool" / "net"
    offenders = []
    for path in net.glob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\.state = (Client|Server)State\.", line) and "__init__" not in line:
                offenders.append(f"{path.name}:{number}: {line.strip()}")
    # The two constructors set the initial state.
    assert [o for o in offenders if "STARTUP" not in o and "CONNECTING" not in o] == []
