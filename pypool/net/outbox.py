"""A client's outbox: what it sends while it has no server, and its rewriting at the link.

In transaction mode a client is linked to a server only once it sends something that needs
one, so the first messages of every transaction arrive with no server to go to. `keep`
holds them, whole and already counted by the client's FrontendLedger (core/ledger.py), in
the client's `outbox` and asks the pooler for a server; `take_outbox` hands them to the
server the client is linked to, rewritten for that server's prepared statements
(core/frontend.py `rewrite_whole`). A driver segment the request reader marked
(`segment_end`) is not looked at again to find its Bind.

The rewriting may have to wait for a reply (a WAIT: the statement is being prepared on the
server, or the link's check and SET are still to be answered). `resume_rewriting` carries
on with what was held then, and `carry_on` with what the client sent meanwhile.

Flow control: a client waiting for a server with more than OUTBOX_HIGH_WATER bytes kept has
its reads paused until the outbox is taken, as a full socket buffer would stop it. So does a
client whose bytes wait unread (`hold_back`: in its request reader while that is blocked, or
before its login's ReadyForQuery): `carry_on` reads them and resumes it. Whatever a client
sends faster than the pooler can pass it on is left in the kernel's buffers, never in ours.

The outbox lives on the client's record (net/records.py: plain attributes, no object of
its own); this module owns what is done with it. It never decides a link or a release,
and lifts a client's hold only through net/link_ends.py (`unhold`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ..core.states import ClientState
from ..pooling.prepared import Tracking
from ..protocol.errors import PoolerError
from . import link_ends

if TYPE_CHECKING:
    from ..pooling.prepared import ServerStatements
    from .records import ClientRecord, ServerRecord

# What a client without a server may have sent before its reads are paused (bytes).
OUTBOX_HIGH_WATER: Final = 1 << 20


def keep(client: ClientRecord, data: bytes, now: float = 0.0) -> None:
    """Keep `data` until the client has a server; ask for one if it is not waiting yet
    (`now`: the clock, when the caller has just read it). Kept as the reply reader keeps
    a server's output (core/replies.py `_emit`), in fields of the record: a holder object
    shared by the two would be one more object every transaction touches."""
    if not client.outbox:
        client.outbox = data
    elif client.outbox_more is None:
        client.outbox_more = [data]
    else:
        client.outbox_more.append(data)
    client.outbox_size += len(data)
    if client.outbox_size > OUTBOX_HIGH_WATER:
        # Waiting for a server with this much to send: stop reading until linked, as a
        # socket buffer would fill.
        client.pause_reading()
    if client.state is ClientState.IDLE:
        client.pooler.request_server(client, now)


def take_outbox(client: ClientRecord, server: ServerRecord | None = None) -> bytes:
    """What the client sent while it had no server, for `server` that it is linked to
    now (rewritten for it when prepared statements are)."""
    data = client.outbox
    more = client.outbox_more
    segment, bind_end = client.outbox_segment
    client.outbox_segment = (b"", 0)
    if client.outbox_size > OUTBOX_HIGH_WATER and client._reading_paused and (
        server is None or not server.writing_paused
    ):
        client.resume_reading()
    client.outbox_size = 0
    client.outbox = b""
    if more is None:
        if data is not segment:
            bind_end = 0
    else:
        client.outbox_more = None
        data = data + b"".join(more)
        bind_end = 0
    if client.statements is None or server is None:
        return data
    st = server.statements
    sql = st.attach(client.statements)  # b"" unless it has SQL-level statements
    data = rewrite_whole(client, st, data, bind_end)
    return sql + data if sql else data


def rewrite_whole(client: ClientRecord, st: ServerStatements, data: bytes,
                  bind_end: int = 0) -> bytes:
    """Rewrite whole, already counted messages (core/frontend.py). A malformed one:
    what came before it is sent, then the client dropped (not from here: this may run
    inside the server's relay)."""
    reader = client.reader
    out = reader.rewrite_whole(st, data, bind_end)
    if reader.error is not None:
        exc, reader.error = reader.error, None
        client.pooler.loop.call_soon(client.fail, exc)
    return out


def answer_own(client: ClientRecord, server: ServerRecord) -> None:
    """The replies the pooler makes itself that are now at the head of the server's queue
    (a CloseComplete for a statement only the pooler knew: pooling/prepared/) go to the
    client in their turn. Called once what the client sent is sent (net/client.py `relay`,
    and what it kept at a link or after a WAIT): no reply of the server's would carry them
    (a Close and a Flush: the server answers a Flush with nothing)."""
    requests = server.statements.requests
    if (requests.tracking == Tracking.SYNTHETIC and server.client is client
            and server.at_message_boundary()):
        client.write(requests.emit_synthetic())


def resume_rewriting(client: ClientRecord) -> None:
    """The reply a WAIT depended on has come (or the server was released): carry on
    with what the client sent meanwhile."""
    reader = client.reader
    if not reader.blocked:
        return
    link_ends.unhold(client)
    server = client.server
    if server is not None:
        server.statements.requests.blocked = False
    held, reader.held = reader.held, b""
    if held:
        if server is not None:
            out = rewrite_whole(client, server.statements, held)
            if out:
                server.send(out)
            if reader.blocked:
                return
            answer_own(client, server)
        else:
            client.forward(held)
    carry_on(client)


def hold_back(client: ClientRecord) -> None:
    """The client's bytes wait unread (its reader is blocked, or its login is not over):
    past the high-water mark, stop reading it until `carry_on`."""
    partial = client.reader.partial
    if partial is not None and len(partial) > OUTBOX_HIGH_WATER:
        client.pause_reading()


def carry_on(client: ClientRecord) -> None:
    """Relay what the client sent while it had to wait (login, a WAIT, a SET), and read it
    again if `hold_back` had stopped that and nothing else still has to."""
    reader = client.reader
    if reader.partial:
        try:
            client.relay(reader.take_partial())
        except PoolerError as exc:
            # A malformed message among them: what came before it went on; the client is
            # dropped, not from here (this may run inside the server's relay), as in
            # rewrite_whole.
            client.pooler.loop.call_soon(client.fail, exc)
            return
    server = client.server
    if (client._reading_paused and not reader.blocked
            and client.state is not ClientState.CLOSED
            and client.outbox_size <= OUTBOX_HIGH_WATER
            and (server is None or not server.writing_paused)):
        client.resume_reading()
