"""What the start-up composition plugs into the network layer.

The admin console and the metrics endpoint sit above net/: they read the pooler through a
read-only view (observe/) and drive it through its own methods. So that net/ never imports
them, the pooler reaches them only through two hooks that cli.py's `build_pooler` sets once
at start-up, and a console client holds its session as a `ConsoleSession`. A pooler built
without them (a unit test) has no console and no metrics endpoint. The transaction log
(observe/txlog.py) and the protocol trace (observe/trace.py) are plugged in the same way
(`OpenTransactionLog`, `OpenTrace`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .client import ClientConnection
    from .server import ServerConnection


class ConsoleSession(Protocol):
    """A client's admin console session: takes every byte the client sends after login."""

    def received(self, data: bytes) -> None: ...


# After a client authenticated to `pgbouncer`/`pypool`: admit it to the console (setting its
# `admin` session and welcoming it) or raise PoolerError.
OpenConsole = Callable[["ClientConnection"], None]
# At start, with metrics_port set: listen on (addresses, port), return the listeners.
ServeMetrics = Callable[[str, int], Awaitable[list[asyncio.AbstractServer]]]


class ServerTap(Protocol):
    """The transaction log's reader of one server's replies (observe/txlog.py)."""

    def feed(self, data: bytes) -> None: ...


class TransactionLog(Protocol):
    """The transaction log (observe/txlog.py), as the pooler feeds it. None when off."""

    queue_policy: str
    server_policy: str
    dropped: int
    written: int

    def client_data(self, client: ClientConnection, n: int) -> None: ...
    def tap(self, server: ServerConnection) -> ServerTap: ...
    def released(self, client: ClientConnection, server: ServerConnection,
                 now: float) -> None: ...
    def client_closed(self, client: ClientConnection, reason: str) -> None: ...
    def refused(self, client: ClientConnection, sqlstate: str) -> None: ...
    def reopen(self) -> None: ...
    def close(self) -> None: ...


# With transaction_log set (at start or on reload): open the log at that path.
OpenTransactionLog = Callable[[str], TransactionLog]


class TraceFilter(Protocol):
    """Which clients the protocol trace follows (observe/trace.py's TraceFilter)."""

    everyone: bool
    ids: set[int]
    application_names: set[str]

    def wants(self, client: ClientConnection) -> bool: ...


class WireTrace(Protocol):
    """The protocol trace (observe/trace.py), fed at the four socket points. A connection
    holds it only while traced (None otherwise: one attribute check per read or write)."""

    @property
    def filter(self) -> TraceFilter: ...

    def client_read(self, client: ClientConnection, data: bytes) -> None: ...
    def client_write(self, client: ClientConnection, data: bytes) -> None: ...
    def client_gone(self, client: ClientConnection) -> None: ...
    def server_write(self, server: ServerConnection, data: bytes, own: bool = False) -> None: ...
    def server_read(self, server: ServerConnection, data: bytes) -> None: ...
    def server_done(self, server: ServerConnection) -> None: ...
    def server_gone(self, server: ServerConnection) -> None: ...


# At start: make the protocol trace (cli.py: its lines go to the `pypool.trace` logger).
OpenTrace = Callable[[], WireTrace]
