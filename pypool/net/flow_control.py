"""Back-pressure between a client and its server, shared by both connection kinds.

When one side's socket buffer fills (asyncio calls its `pause_writing`), the pooler stops
reading the other side until it drains (`resume_writing`), so a slow reader makes
PostgreSQL wait instead of making the pooler buffer a whole result.

A connection not read cannot be seen to close: `departed` asks the kernel, for those whose
reading is paused, whether the peer has shut its side (POLLRDHUP, as PostgreSQL's
client_connection_check_interval asks), so that the janitor can let them go.
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Iterable
from typing import Final, TypeVar

# A read at least this large is followed by a turn of the event loop before this
# connection is read again (`take_turns`).
LARGE_READ: Final = 64 * 1024


class ReadingSwitch(asyncio.BaseProtocol):
    """Pause and resume reading one transport, idempotently. A base of the connections'
    records (net/records.py), so that what takes a record may hand it to asyncio as the
    connection's protocol (the TLS handshakes do)."""

    transport: asyncio.Transport | None
    _reading_paused: bool

    def pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    # --- fairness between connections ------------------------------------------------------
    # libuv reads a readable socket up to 32 times in one go before it looks at any other, so
    # a peer that streams (a client pipelining thousands of Queries, PostgreSQL sending a huge
    # result) would have all those reads handled in a row, a few tens of milliseconds each,
    # while every other connection waits: seconds, under a flood
    # (tests/integration/test_floods.py's canary). After a large read the connection stops
    # being read until the loop's next turn, as PgBouncer handles one buffer per socket per
    # turn. A pgbench-sized read (tens of bytes) never pauses.

    _yielding: bool

    def take_turns(self, loop: asyncio.AbstractEventLoop) -> None:
        """After a read of LARGE_READ bytes or more: no more reads of this connection until
        the event loop has served the others once. Flow control's pause wins over it."""
        transport = self.transport
        if (not self._reading_paused and not self._yielding and transport is not None
                and not transport.is_closing()):
            self._yielding = True
            transport.pause_reading()
            loop.call_soon(self._turn_over)

    def _turn_over(self) -> None:
        self._yielding = False
        transport = self.transport
        if (not self._reading_paused and transport is not None and not transport.is_closing()
                and transport.get_protocol() is self):
            transport.resume_reading()


_GONE = select.POLLRDHUP | select.POLLHUP | select.POLLERR
Switch = TypeVar("Switch", bound=ReadingSwitch)


def departed(connections: Iterable[Switch]) -> list[Switch]:
    """Of `connections`, those whose reading is paused and whose peer has closed (or shut
    down its sending side): one poll(2) over them, never blocking. What they sent and was
    not read yet is never read: a peer that closed awaits no answer."""
    polled: dict[int, Switch] = {}
    for connection in connections:
        transport = connection.transport
        if not connection._reading_paused or transport is None:
            continue
        sock = transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        if fd >= 0:
            polled[fd] = connection
    if not polled:
        return []
    poller = select.poll()
    for fd in polled:
        poller.register(fd, _GONE)
    return [polled[fd] for fd, events in poller.poll(0) if events & _GONE]
