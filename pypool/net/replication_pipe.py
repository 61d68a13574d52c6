"""A replication client and its own server, joined byte for byte.

Once a replication client's dedicated server has logged in and the client has had its
welcome (pooler/replication.py), nothing between them is the pooler's business: no
transaction ends, no statement is rewritten, and the CopyBoth stream of START_REPLICATION
or BASE_BACKUP may run for days. So the two transports leave their ClientConnection and
ServerConnection Protocols for a pair of `PipeEnd`s (transport.set_protocol): each writes
what it reads to the other transport as it came, and pauses reading its own side while the
other side's socket buffer is full (a slow pg_receivewal makes the walsender wait instead
of the pooler buffering WAL). When either side goes, the pipe tells the pooler once
of each side's close (`on_lost`) and closes the other side after what was written to it
has gone out. The client's Terminate counts as the client going (`terminated`): it is
passed on, so the walsender ends cleanly, and the pair is closed from the client's side
then, not whenever the walsender's close or the client's happens to be seen first.

It owns the two transports' reading from the switch on, and nothing else: the connection
objects stay the pooler's, for SHOW CLIENTS/SERVERS, cancel and the counts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..protocol.replication import TerminateWatch
from .tls_records import RECORD_MAX, write_in_records

if TYPE_CHECKING:
    from ..pooling.pool import PoolStats
    from .records import ClientRecord, ServerRecord

# Which side a PipeEnd reads.
CLIENT = "client"
SERVER = "server"


class PipeEnd(asyncio.Protocol):
    """One side's transport, read into the other side's."""

    def __init__(self, pipe: ReplicationPipe, side: str, own: asyncio.Transport) -> None:
        self.pipe = pipe
        self.side = side
        self.own = own
        self.other: PipeEnd | None = None
        self.lost = False
        self.reading_paused = False  # by the other side's back-pressure
        self.watch = TerminateWatch() if side == CLIENT else None
        self.over_tls = False  # writes to this side go in records of 8 KiB (tls_records.py)

    def data_received(self, data: bytes) -> None:
        other = self.other
        if self.lost or other is None or other.lost:
            return
        end = self.watch.end_of_terminate(data) if self.watch is not None else -1
        if end >= 0:
            data = data[:end]
        if other.over_tls and len(data) > RECORD_MAX:
            write_in_records(other.own, data)
        else:
            other.own.write(data)
        self.pipe.count(self.side, len(data))
        if end >= 0:  # the client is leaving: the pair closes from its side
            self.pipe.terminated = True
            self.pipe.end_lost(self, None)
            self.lost = True

    def eof_received(self) -> bool:
        return False  # close: a half-closed replication connection serves nobody

    def pause_writing(self) -> None:
        other = self.other
        if other is not None and not other.reading_paused and not other.lost:
            other.reading_paused = True
            other.own.pause_reading()

    def resume_writing(self) -> None:
        other = self.other
        if other is not None and other.reading_paused and not other.lost:
            other.reading_paused = False
            other.own.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lost:
            return
        self.lost = True
        self.pipe.end_lost(self, exc)


class ReplicationPipe:
    """A replication client and its dedicated server, joined from `start` on."""

    def __init__(self, client: ClientRecord, server: ServerRecord, stats: PoolStats,
                 on_lost: Callable[[ReplicationPipe, str, Exception | None], None]) -> None:
        self.client = client
        self.server = server
        self.stats = stats
        self.on_lost = on_lost
        self.client_end: PipeEnd | None = None
        self.server_end: PipeEnd | None = None
        self.terminated = False  # the client sent Terminate

    def start(self, held: bytes) -> None:
        """Take both transports over; `held` is what the client sent before its welcome,
        for the server first. Back-pressure in force on either side carries over."""
        client, server = self.client, self.server
        assert client.transport is not None and server.transport is not None
        client_end = PipeEnd(self, CLIENT, client.transport)
        server_end = PipeEnd(self, SERVER, server.transport)
        client_end.other, server_end.other = server_end, client_end
        client_end.over_tls = bool(client.tls_info)
        self.client_end, self.server_end = client_end, server_end
        client.transport.set_protocol(client_end)
        server.transport.set_protocol(server_end)
        # The Protocols may have paused reading (their own flow control): the pipe decides
        # from now on.
        for connection, end in ((client, client_end), (server, server_end)):
            if connection._reading_paused:
                connection._reading_paused = False
                end.own.resume_reading()
        if client.writing_paused:
            client_end.pause_writing()
        if server.writing_paused:
            server_end.pause_writing()
        if held:
            client_end.data_received(held)

    def count(self, side: str, size: int) -> None:
        if side == CLIENT:
            self.stats.bytes_received += size
        else:
            self.stats.bytes_sent += size

    def end_lost(self, end: PipeEnd, exc: Exception | None) -> None:
        """One side's socket is closed: the pooler hears of each side once, and the other
        side is closed too."""
        self.close()
        self.on_lost(self, end.side, exc)

    def close(self) -> None:
        """Close both sides (what was written to each still goes out first)."""
        self.close_server()
        end = self.client_end
        if end is not None and not end.lost:
            end.own.close()

    def close_server(self) -> None:
        """Close the server's side only: the client's is its caller's to close, after the
        error it may still write there (a KILL's)."""
        end = self.server_end
        if end is not None and not end.lost:
            end.own.close()
