"""The two ends of a link: a client's `server`, a server's `client`, and the hold on what
a client sends.

A link (core/link.py) is a state on the client; its two ends are pointers on the records
(net/records.py): `client.server`, the server it holds or whose pipeline line it is in, and
`server.client`, the client the server's replies go to (the head of its line). The reply
reader follows the second: it counts replies into that client's ledger and checks its
ParameterStatus against that client's parameters. `reader.blocked` on a client's request
reader says that what the client sends waits, unread, instead of going to a server.

This module is the only one that writes those three from outside the objects themselves
(the RequestReader sets `blocked` itself on a rewriting WAIT, core/frontend.py);
tests/core/test_link.py fails when another module assigns them. Each write is a named step
of the link, carried out where core/link.py's table says so:

  link        LINKED, LINKED_TO_SET: the client holds the server, the server serves it
  unlink      RELEASE, UNLINK, a client gone with nothing on its server: the two part
  line_up     LINED_UP: the client joins a busy server's line (net/pipeline.py); the
              client ahead of it holds what it sends from now on
  take_turn   TURN: the head of the line is done, the server's replies go to the next
  unlink_line the server is gone: it serves nobody, and each client of its line
  lose_server   then loses it, one by one, as it is told
  hold        HOLD (the check's and SET's replies come first), a guard in a line: what the
              client sends waits
  unhold      APPLIED, UNLINK, the end of a rewriting WAIT: what it sends goes on

Each is a call per link or release, never per message. Never decides anything: the table
(core/link.py) and pooler/linking.py do; never sends or reads a byte.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .records import ClientRecord, ServerRecord


def link(client: ClientRecord, server: ServerRecord) -> None:
    """`client` holds `server`, and the server serves it."""
    client.server = server
    _serve(server, client)


def unlink(client: ClientRecord, server: ServerRecord) -> None:
    """`client` and `server` part: neither points at the other any more."""
    client.server = None
    _serve(server, None)


def line_up(last: ClientRecord, client: ClientRecord, server: ServerRecord) -> None:
    """`client` joins the line on `server` behind `last` (the server still serves the
    head): what `last` sends from now on waits for a server of its own."""
    last.reader.blocked = True
    client.server = server


def take_turn(server: ServerRecord, client: ClientRecord) -> None:
    """The client ahead of `client` in the line on `server` is done: the server's replies
    are `client`'s from now on (its `server` already points here, since `line_up`)."""
    _serve(server, client)


def unlink_line(server: ServerRecord) -> list[ClientRecord]:
    """`server` is gone: it serves nobody any more. Returns the clients of its line (the
    head, then the queued ones); the caller clears the line, and cuts each client's end
    with `lose_server` just before telling it: until then each still counts as holding a
    server (a SIGINT shutdown waits for such a client, pooler/lifecycle.py)."""
    head = server.client
    line = [head, *server.chain] if head is not None else list(server.chain)
    _serve(server, None)
    return line


def lose_server(client: ClientRecord) -> None:
    """`client`'s server is gone (`unlink_line`): it holds none any more."""
    client.server = None


def hold(client: ClientRecord) -> None:
    """What `client` sends from now on waits, unread, in its request reader."""
    client.reader.blocked = True


def unhold(client: ClientRecord) -> None:
    """What `client` sends goes on again (the caller carries on with what waited)."""
    client.reader.blocked = False


def _serve(server: ServerRecord, client: ClientRecord | None) -> None:
    """Point `server` at `client` (None: nobody). Its reply reader counts into that
    client's ledger and checks its parameters; the trace follows a traced client."""
    server.client = client
    server.trace = (client.trace if client is not None and client.trace is not None
                    else server.pooler.trace_all)
    reader = server.reader
    if client is None:
        reader.frontend = None
        reader.client_params = None
    else:
        reader.frontend = client.ledger
        reader.client_params = client.params
        reader.statement_mode = server.pool.limits.pool_mode == "statement"
